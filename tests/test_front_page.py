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


def request_on_the_page(chat: bool, values: dict) -> dict:
    """The page's own requestFor (app.js), run by node with the controls holding `values`: the request's URL and
    body, or the error it throws."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("needs node to run the page's script")
    source = (STATIC / "app.js").read_text(encoding="utf-8")
    function = re.search(r"^function requestFor\(.*?^}\n", source, re.MULTILINE | re.DOTALL)[0]
    script = (f"const state = {{chat: {json.dumps(chat)}, history: [], model: 'm'}};\n"
              f"const values = {json.dumps(values)};\n"
              "function $(id) { return {value: values[id] ?? ''}; }\n"
              f"{function}\n"
              "try { const [url, body] = requestFor('hi'); process.stdout.write(JSON.stringify({url, body})); }\n"
              "catch (e) { process.stdout.write(JSON.stringify({error: e.message})); }")
    return json.loads(subprocess.run([node, "-e", script], capture_output=True, text=True, check=True,
                                     timeout=60).stdout)


CONTROLS = {"max-tokens": "16", "temperature": "0.7", "algorithm": "auto", "top-p": "1", "seed": "", "system": "",
            "schema": ""}


def test_the_summary_counts_copied_tokens_beside_the_draft_models():
    copied = run_summary(result_of(rounds=4, target_passes=4, draft_tokens_proposed=6, draft_tokens_accepted=3,
                                   suffix_tokens_proposed=9, suffix_tokens_accepted=8, pool_tokens_accepted=2))
    assert "acceptance 3/6" in summary_text_on_the_page(copied)
    assert "10 tokens copied from earlier text" in summary_text_on_the_page(copied)
    assert "copied" not in summary_text_on_the_page(run_summary(result_of(rounds=4, target_passes=4)))


def test_the_controls_defaults_pass_the_browsers_own_form_check():
    """A number box whose value misses its min/max/step makes the browser refuse to submit the form, silently."""
    page = (STATIC / "index.html").read_text(encoding="utf-8")
    boxes = re.findall(r'<input id="([\w-]+)" type="number"([^>]*)>', page)
    assert {name for name, _ in boxes} >= {"max-tokens", "temperature", "top-p", "seed"}
    for name, attributes in boxes:
        found = dict(re.findall(r'(\w+)="([^"]*)"', attributes))
        if "value" not in found:
            continue
        value, low = float(found["value"]), float(found.get("min", "-inf"))
        assert low <= value <= float(found.get("max", "inf")), name
        step = found.get("step", "1")
        if step != "any":
            steps = (value - (low if found.get("min") else 0)) / float(step)
            assert abs(steps - round(steps)) < 1e-9, f"{name}: {value} is not min + a whole number of steps"


def test_the_legend_shows_only_colours_the_page_can_produce():
    page = (STATIC / "index.html").read_text(encoding="utf-8")
    legend = re.search(r'<section id="legend".*?</section>', page, re.DOTALL)[0]
    assert re.findall(r'class="swatch (\w+)"', legend) == ["draft", "target", "grammar"]
    assert 'id="schema"' in page  # the grammar's colour comes from the schema box
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    chat = request_on_the_page(True, CONTROLS | {"schema": json.dumps(schema)})["body"]
    assert chat["response_format"] == {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
    completion = request_on_the_page(False, CONTROLS | {"schema": json.dumps(schema)})
    assert completion["url"] == "v1/completions" and completion["body"]["json_schema"] == schema


def test_the_page_sends_a_system_message_top_p_and_a_seed_only_when_given():
    plain = request_on_the_page(True, CONTROLS)
    assert plain["url"] == "v1/chat/completions"
    assert plain["body"]["messages"] == [{"role": "user", "content": "hi"}]
    assert not {"top_p", "seed", "response_format"} & set(plain["body"])
    given = request_on_the_page(True, CONTROLS | {"system": "Be brief.", "top-p": "0.9", "seed": "7"})["body"]
    assert given["messages"][0] == {"role": "system", "content": "Be brief."}
    assert given["top_p"] == 0.9 and given["seed"] == 7
    completion = request_on_the_page(False, CONTROLS | {"system": "Be brief."})["body"]
    assert "messages" not in completion and completion["prompt"] == "hi"  # a system message is a chat's
    assert "not JSON" in request_on_the_page(True, CONTROLS | {"schema": "{nope"})["error"]


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
