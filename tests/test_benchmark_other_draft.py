"""`edge-specdec bench --other-draft BUNDLE`: the rows that draft run again with another bundle's draft (the same
target), side by side in one interleaved run, as LABEL:ROW."""
from __future__ import annotations

import json

import pytest

from edge_specdec.cli import main

SMALL_DRAFT = ("qwen2-bytelevel", "qwen2-bytelevel-small", "int8", "int8")
SELF_DRAFT = ("qwen2-bytelevel", "qwen2-bytelevel", "int8", "int8")  # the target drafting for itself
OTHER_TARGET = ("qwen2-bytelevel-small", "qwen2-bytelevel-small", "int8", "int8")


@pytest.mark.slow
def test_another_bundle_s_draft_runs_beside_ours(bundle_dir, tmp_path, capsys, monkeypatch):
    from edge_specdec.benchmark import runner

    ran_on = {}  # row -> the bundle of the Pipeline that runs it
    real = runner.ours_runner

    def recording(pipe, spec, max_new_tokens):
        ran_on.setdefault(spec.name, set()).add(str(pipe.bundle.path))
        return real(pipe, spec, max_new_tokens)
    monkeypatch.setattr(runner, "ours_runner", recording)
    out = tmp_path / "out"
    code = main(["bench", str(bundle_dir(*SMALL_DRAFT)), "--other-draft", str(bundle_dir(*SELF_DRAFT)),
                 "--other-label", "self", "--setups", "ours-standard-conf-nolookup", "--no-genai", "--categories",
                 "code_generation", "--max-new-tokens", "8", "--repeats", "1", "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    report = json.loads((out / "report.json").read_text())
    rows = {r["setup"]: r for r in report["setups"]}
    assert [r["setup"] for r in report["setups"]] == ["ours-none", "ours-standard-conf-nolookup", "self:ours-standard-conf-nolookup"]
    assert rows["self:ours-standard-conf-nolookup"]["baseline"] == "ours-none" and not report["not_identical"]
    assert rows["self:ours-standard-conf-nolookup"]["draft_tokens_proposed"] > 0
    # the row LABEL:ROW runs on the other bundle's Pipeline (its spec keeps the row's settings), the others on ours
    assert ran_on == {"ours-none": {str(bundle_dir(*SMALL_DRAFT))},
                      "ours-standard-conf-nolookup": {str(bundle_dir(*SMALL_DRAFT)), str(bundle_dir(*SELF_DRAFT))}}
    assert report["settings"]["other_draft"] == {"bundle": str(bundle_dir(*SELF_DRAFT)), "label": "self"}
    assert "--other-draft" in report["command"] and "self:ours-standard-conf-nolookup" in captured.out


@pytest.mark.slow
def test_another_target_is_refused_in_one_line(bundle_dir, tmp_path, capsys):
    code = main(["bench", str(bundle_dir(*SMALL_DRAFT)), "--other-draft", str(bundle_dir(*OTHER_TARGET)),
                 "--no-genai", "--max-new-tokens", "2", "--repeats", "1", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 1 and "same target weights" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()
