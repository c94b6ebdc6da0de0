"""What the server's page and /metrics tell a user: why nothing was drafted (the CLI's own sentence), a legend
of only the colours the page can produce, batched calls declared a counter; and the docs' word on threads."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import edge_specdec
from edge_specdec.runtime.generate import TARGET_ALONE_THROUGHOUT, Result, Stats
from edge_specdec.serve.protocol import run_summary

PACKAGE = Path(edge_specdec.__file__).resolve().parent
STATIC = PACKAGE / "serve" / "static"


def summary_text_on_the_page(summary: dict) -> str:
    """The page's own summaryText (app.js), run by node on a run's summary as the server sends it."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("needs node to run the page's script")
    source = (STATIC / "app.js").read_text(encoding="utf-8")
    function = re.search(r"^function summaryText\(.*?^}\n", source, re.MULTILINE | re.DOTALL)[0]
    script = f"{function}\nprocess.stdout.write(summaryText({json.dumps(summary)}));"
    return subprocess.run([node, "-e", script], capture_output=True, text=True, check=True, timeout=60).stdout


def result_of(**stats) -> Result:
    return Result(text="x", token_ids=[1], stop_reason="length", stats=Stats(new_tokens=1, **stats),
                  extra={"algorithm": "slem"})


def test_the_page_says_why_nothing_was_drafted_in_the_clis_words():
    alone = run_summary(result_of(rounds=12, target_passes=12, rounds_drafting_paused=12))
    assert alone["drafting_note"] == TARGET_ALONE_THROUGHOUT
    assert TARGET_ALONE_THROUGHOUT in summary_text_on_the_page(alone)
    some = run_summary(result_of(rounds=12, target_passes=12, rounds_drafting_paused=3, draft_tokens_proposed=9))
    assert "drafting paused for 3 rounds (slower than the target alone" in summary_text_on_the_page(some)
    drafted = run_summary(result_of(rounds=12, target_passes=12, draft_tokens_proposed=30))
    assert drafted["drafting_note"] == "" and "paused" not in summary_text_on_the_page(drafted)


def test_the_legend_shows_only_colours_the_page_can_produce():
    page = (STATIC / "index.html").read_text(encoding="utf-8")
    legend = re.search(r'<section id="legend".*?</section>', page, re.DOTALL)[0]
    assert re.findall(r'class="swatch (\w+)"', legend) == ["draft", "target"]  # the page sends no grammar


def test_metrics_declare_batched_calls_a_counter():
    from edge_specdec.serve import ServerSettings
    from edge_specdec.serve.app import Server

    text = Server(ServerSettings()).metrics.render()
    assert "# TYPE edge_specdec_batched_calls counter" in text
    assert "# TYPE edge_specdec_batched_calls gauge" not in text
    assert re.search(r"^edge_specdec_batched_calls 0$", text, re.MULTILINE)


def test_usage_gives_each_thread_a_session_as_the_readme_does():
    usage = (PACKAGE.parent / "docs" / "usage.md").read_text(encoding="utf-8")
    assert "load one Pipeline per" not in usage and "`pipe.session()`" in usage
