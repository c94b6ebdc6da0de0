"""Help that works from a wheel: every help text and listing names only what an installed package has (the
packaged docs through `edge-specdec docs TOPIC`, URLs), `info` shows the demo without the exporting machine's paths,
counts take their plural, and the wheel's metadata (SPDX license, project URLs) builds without warnings and
carries the docs and the demo's chat template."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

import edge_specdec
from edge_specdec.benchmark.suites import SUITES
from edge_specdec.cli import build_parser, main
from edge_specdec.cli import docs as docs_command
from edge_specdec.cli.common import stats_line
from edge_specdec.runtime.generate import Stats

PACKAGE = Path(edge_specdec.__file__).resolve().parent
REPO = PACKAGE.parent
# a file of the source checkout named in a help text: docs/NAME.md, benchmarks/..., not part of a URL
CHECKOUT_PATH = re.compile(r"(?<![\w./-])(docs|benchmarks)/[\w.+-]")


def command_names() -> list[str]:
    subparsers = next(a for a in build_parser()._actions if a.dest == "command")
    return list(subparsers.choices)


def help_of(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit):
        main([*argv, "--help"])
    return capsys.readouterr().out


def test_help_texts_and_listings_name_nothing_a_wheel_lacks(capsys):
    texts = {"edge-specdec --help": help_of(capsys)}
    for name in command_names():
        texts[f"{name} --help"] = help_of(capsys, name)
    for suite in SUITES:
        texts[f"bench {suite} --help"] = help_of(capsys, "bench", suite)
    for argv in (["pairs"], ["pairs", "--json"], ["docs"]):
        assert main(argv) == 0
        texts[" ".join(argv)] = capsys.readouterr().out
    assert {"chat", "docs", "info"} <= set(command_names())
    for where, text in texts.items():
        assert not CHECKOUT_PATH.search(text), f"{where} names a checkout path: {CHECKOUT_PATH.search(text)[0]}"
    # every `edge-specdec docs TOPIC` a help text points at is a topic that exists
    pointed = {topic for text in texts.values() for topic in re.findall(r"edge-specdec docs ([a-z][\w-]*)", text)}
    assert {"serving", "align"} <= pointed <= set(docs_command.topics())


def test_docs_lists_the_topics_and_prints_a_page(capsys):
    assert main(["docs"]) == 0
    listing = capsys.readouterr().out
    for topic in ("usage", "serving", "export", "align", "how-it-works", "performance"):
        assert re.search(rf"^  {re.escape(topic)} ", listing, re.MULTILINE), topic
    assert main(["docs", "serving"]) == 0
    assert capsys.readouterr().out == (REPO / "docs" / "serving.md").read_text(encoding="utf-8")
    assert main(["docs", "no-such-topic"]) == 1
    assert "no topic 'no-such-topic'; the topics are: " in capsys.readouterr().err


def test_info_without_a_bundle_shows_the_demo_without_the_exporting_machines_paths(capsys):
    assert main(["info", "--no-verify"]) == 0
    out = capsys.readouterr().out
    from edge_specdec.bundle import load_bundle
    from edge_specdec.demo import DEMO_BUNDLE

    given = load_bundle(DEMO_BUNDLE, verify=False).manifest["target"]["source"]["given"]
    assert given.startswith("/") and given not in out  # recorded on the machine that exported it, not shown
    assert re.search(r"^target   target-hf  \(local\)$", out, re.MULTILINE), out
    assert "demo pair that ships with edge-specdec" in out and "chat template" in out


def test_the_statistics_line_takes_the_plural_of_its_counts():
    stats = Stats()
    stats.new_tokens, stats.target_passes, stats.seconds = 1, 1, 0.5
    stats.suffix_tokens_proposed, stats.suffix_tokens_accepted = 2, 1
    one = SimpleNamespace(stats=stats, extra={"algorithm": "slem"}, stop_reason="length")
    line = stats_line(one)
    assert "1 token in" in line and "1 target pass," in line and "; 1 token copied without the draft" in line
    stats.new_tokens, stats.target_passes, stats.pool_tokens_accepted = 5, 2, 2
    many = SimpleNamespace(stats=stats, extra={"algorithm": "slem"}, stop_reason="length")
    line = stats_line(many)
    assert "5 tokens in" in line and "2 target passes," in line and "; 3 tokens copied" in line
    assert "(1 from the request, 2 from earlier requests)" in line
    assert "the first after" not in line  # no first token's time measured


def test_the_statistics_line_puts_the_prefill_apart_from_decoding():
    stats = Stats()
    stats.new_tokens, stats.target_passes, stats.seconds, stats.first_token_seconds = 5, 5, 10.0, 8.0
    stats.prompt_tokens_prefilled = 2048
    line = stats_line(SimpleNamespace(stats=stats, extra={"algorithm": "slem"}, stop_reason="length"))
    # 5 tokens in 10 s, the first after 8 s: the other 4 in 2 s
    assert "5 tokens in 10.00 s = 0.5 tokens/s (the first after 8.00 s, 2048 prompt tokens prefilled; then 2.0 " \
           "tokens/s); 5 target passes" in line
    stats.new_tokens = 1
    assert "the first after" not in stats_line(SimpleNamespace(stats=stats, extra={"algorithm": "slem"},
                                                               stop_reason="length"))


def test_pyproject_has_an_spdx_license():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    assert project["project"]["license"] == "Apache-2.0"
    assert "setuptools>=77" in project["build-system"]["requires"][0]  # PEP 639's license expressions


def test_no_text_points_at_a_repository_that_does_not_exist(capsys):
    """The project has no public repository: no address of one in the metadata, the package, the docs or what
    `docs` and `pairs` print; the documentation ships with the package."""
    texts = {path: path.read_text(encoding="utf-8") for path in [REPO / "pyproject.toml", REPO / "README.md",
                                                                 *PACKAGE.rglob("*.py"), *PACKAGE.rglob("*.json"),
                                                                 *(REPO / "docs").glob("*.md")]}
    for argv in (["docs"], ["pairs", "--json"]):
        assert main(argv) == 0
        texts[" ".join(argv)] = capsys.readouterr().out
    for where, text in texts.items():
        assert "github.com/edge-specdec" not in text, where


def test_the_pages_the_readme_lists_are_docs_topics(capsys):
    """README's Documentation section links pages outside docs/ too (the measurements, the demo pair): each is a
    topic of `edge-specdec docs`, which prints the page itself."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Documentation"):]
    linked = dict(re.findall(r"\[([^\]]+)\]\(([^)#]+\.md)\)", section))
    assert {"RESULTS", "the demo pair"} <= set(linked)
    for topic, path in (("RESULTS", linked["RESULTS"]), ("results", linked["RESULTS"]),
                        ("demo", linked["the demo pair"])):
        assert main(["docs", topic]) == 0
        assert capsys.readouterr().out == (REPO / path).read_text(encoding="utf-8")


@pytest.mark.slow
def test_the_wheel_builds_without_warnings_and_carries_the_docs_and_the_chat_template(tmp_path):
    """python -m build on a copy of the sources (the checkout stays untouched), with this environment's
    setuptools, as CI builds: the sdist, then the wheel from the sdist (so MANIFEST.in must carry docs/). No
    deprecation warning, and the wheel has docs/*.md as package data, the demo's chat template and the project
    URLs."""
    pytest.importorskip("build")
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(REPO / "docs", source / "docs")
    for page in docs_command.PAGES_OUTSIDE_DOCS.values():
        (source / page).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / page, source / page)
    shutil.copytree(PACKAGE, source / "edge_specdec", ignore=shutil.ignore_patterns("__pycache__", "data"))
    shutil.copytree(PACKAGE / "data", source / "edge_specdec" / "data", ignore=shutil.ignore_patterns("docs"))
    proc = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir",
                           str(tmp_path / "dist"), str(source)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Deprecat" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    wheel = zipfile.ZipFile(next((tmp_path / "dist").glob("edge_specdec-*.whl")))
    names = set(wheel.namelist())
    assert {f"edge_specdec/data/docs/{page.name}" for page in (REPO / "docs").glob("*.md")} <= names
    assert {f"edge_specdec/data/docs/{topic}.md" for topic in docs_command.PAGES_OUTSIDE_DOCS} <= names
    assert wheel.read("edge_specdec/data/docs/RESULTS.md") == (REPO / "benchmarks" / "RESULTS.md").read_bytes()
    assert "edge_specdec/data/demo_bundle/target/chat_template.jinja" in names
    assert "edge_specdec/serve/static/favicon.svg" in names
    metadata = wheel.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: Apache-2.0" in metadata and "github.com/edge-specdec" not in metadata
