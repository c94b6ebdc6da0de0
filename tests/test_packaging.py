"""The pair catalog and the demo bundle are package data: found through the installed package, declared in
pyproject.toml so that a wheel carries them, and `edge-specdec run` without a bundle runs the demo.

.ci/run also builds the wheel and runs it from a fresh venv (no torch); these tests are the fast part."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import edge_specdec
from edge_specdec import catalog, demo
from edge_specdec.bundle import load_bundle
from edge_specdec.cli import build_parser, main

PACKAGE = Path(edge_specdec.__file__).resolve().parent
PYPROJECT = PACKAGE.parent / "pyproject.toml"


def test_the_catalog_is_found_inside_the_package():
    assert catalog.CATALOG == PACKAGE / "data" / "pairs.json"
    pairs = catalog.load_catalog()
    assert "qwen-coder-1.5b+smollm2-135m" in pairs
    assert all({"target", "draft", "target_weights", "draft_weights"} <= set(pair) for pair in pairs.values())


def test_the_demo_bundle_is_found_inside_the_package_and_validates():
    assert demo.DEMO_BUNDLE == PACKAGE / "data" / "demo_bundle"
    bundle = load_bundle(demo.DEMO_BUNDLE)  # files, sizes and sha256 against its manifest
    assert bundle.manifest["format"] == "edge-specdec-bundle"
    assert bundle.vocabulary["relation"] == "heterogeneous"
    assert bundle.draft is not None and bundle.draft.model_xml.is_file()


def test_pyproject_declares_every_data_file_as_package_data():
    """A non-editable wheel holds only what package-data names: every file under edge_specdec/data must match
    one of its patterns (setuptools expands them with glob, as Path.glob does here)."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    patterns = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["tool"]["setuptools"]["package-data"]["edge_specdec"]
    declared = {path for pattern in patterns for path in PACKAGE.glob(pattern) if path.is_file()}
    present = {path for path in (PACKAGE / "data").rglob("*") if path.is_file() and "__pycache__" not in path.parts}
    assert present and present == declared


def test_the_demo_records_its_repetition_penalty_and_info_shows_it(capsys):
    assert load_bundle(demo.DEMO_BUNDLE, verify=False).generation_defaults == {"repetition_penalty": 1.2}
    assert main(["info", "--no-verify"]) == 0
    assert "defaults repetition_penalty 1.2 (recorded at export" in capsys.readouterr().out


def test_run_help_says_the_bundle_is_optional_and_names_the_demo(capsys):
    assert build_parser().parse_args(["run", "--prompt", "x"]).bundle is None
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--help"])
    help_text = capsys.readouterr().out
    assert "[BUNDLE]" in help_text
    # argparse wraps long words at hyphens too (a checkout in /tmp/ci-check): compare without the whitespace
    assert "".join(str(demo.DEMO_BUNDLE).split()) in "".join(help_text.split())


@pytest.mark.slow
def test_run_without_a_bundle_runs_the_demo(tmp_path):
    env = {**os.environ, "EDGE_SPECDEC_CACHE_DIR": "off"}
    proc = subprocess.run([sys.executable, "-m", "edge_specdec.cli", "run", "--prompt", "def f(", "--max-new-tokens",
                           "6", "--ignore-eos", "--json"], capture_output=True, text=True, cwd=tmp_path, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["algorithm"] == "slem"  # greedy with a draft of another vocabulary: the demo pair
    assert out["stats"]["new_tokens"] == 6 == len(out["token_ids"])
    assert out["text"]
