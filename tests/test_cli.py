"""The command line: help that teaches, exit codes, errors on stderr, export and info end to end."""
from __future__ import annotations

import json

import pytest

from edge_specdec.cli import main
from support import run_cli, tree_state


@pytest.mark.slow
def test_help_teaches_by_example():
    proc = run_cli("export", "--help")
    assert proc.returncode == 0
    for needle in ("examples:", "--target", "--draft", "--target-weights", "--draft-group-size", ".gguf", "--force"):
        assert needle in proc.stdout, needle


@pytest.mark.slow
def test_no_command_prints_help():
    proc = run_cli()
    assert proc.returncode == 2 and "export" in proc.stdout and "info" in proc.stdout


@pytest.mark.slow
def test_cli_export_and_info(model_dir, tmp_path, capsys):
    # export in this process (main(), as the command runs it): a conversion the session has done is copied, not
    # redone (conftest); info in a subprocess, as a user runs it
    out = tmp_path / "bundle"
    code = main(["export", "--target", str(model_dir("qwen2-bytelevel")), "--draft", str(model_dir("gpt2-prefixspace")),
                 "--out", str(out), "--target-weights", "int8", "--draft-weights", "fp16"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "[target] converting" in err and "bundle written to" in err
    info = run_cli("info", str(out))
    assert info.returncode == 0, info.stderr
    assert "heterogeneous" in info.stdout and "checksums verified" in info.stdout
    manifest = json.loads(run_cli("info", str(out), "--json").stdout)
    assert manifest["draft"]["weights"]["format"] == "fp16"
    assert manifest["target"]["weights"]["format"] == "int8"
    # the same command again: refused without --force, and nothing changes
    before = tree_state(tmp_path)
    again = main(["export", "--target", str(model_dir("qwen2-bytelevel")), "--draft", str(model_dir("gpt2-prefixspace")),
                  "--out", str(out)])
    err = capsys.readouterr().err
    assert again == 1 and "already holds a bundle" in err and "Traceback" not in err
    assert tree_state(tmp_path) == before


@pytest.mark.parametrize("args,message", [
    (["info", "/no/such/bundle"], "does not exist"),
    (["export", "--target", "/no/such/model", "--out", "/tmp/x"], "no such folder or file"),
    (["export", "--target", "x", "--out", "y", "--target-weights", "int2"], "choose one of int4, int8, fp16, fp32"),
])
def test_cli_errors_are_one_clear_line(args, message, capsys):
    assert main(args) == 1
    err = capsys.readouterr().err
    assert err.startswith("edge-specdec: error: ") and message in err and "Traceback" not in err


def test_pairs_lists_the_shipped_catalog(capsys):
    from edge_specdec.catalog import load_catalog

    assert main(["pairs"]) == 0
    out = capsys.readouterr().out
    pairs = load_catalog()
    assert len(pairs) >= 2
    for name, pair in pairs.items():
        assert name in out and pair["target"] in out and pair["draft"] in out
        assert pair["target_weights"] in ("int4", "int8", "fp16", "fp32") and pair["algorithm"]
        for run in pair["measured"] or []:  # each measured run with its machine, date and command, printed
            assert f"machine: {run['machine']}; date: {run['date']}" in out and f"command: {run['command']}" in out
    assert any(pair["measured"] for pair in pairs.values())
    unmeasured = [name for name, pair in pairs.items() if pair["measured"] is None]
    assert out.count("not measured here: ") == len(unmeasured) > 0
    # Intel's published FastDraft drafts are candidates for their targets, unmeasured here
    fastdraft = {name: pair for name, pair in pairs.items() if "FastDraft" in pair["draft"]}
    assert fastdraft and all(pair["draft"].startswith("OpenVINO/") and pair["measured"] is None
                             and "unmeasured here" in pair["unmeasured"] for pair in fastdraft.values())


def test_a_catalog_entry_without_its_machine_date_or_note_is_refused(tmp_path):
    from edge_specdec.catalog import describe_pairs, load_catalog

    run = {"summary": "1.2x", "machine": "2 cores", "date": "2026-12-05", "command": "edge-specdec bench b"}
    entry = {"description": "d", "target": "t", "draft": "d", "target_weights": "int4", "draft_weights": "int8",
             "devices": {"target": "CPU", "draft": "CPU"}, "algorithm": "standard", "num_assistant_tokens": 8}
    path = tmp_path / "pairs.json"

    def catalog_with(**fields):
        path.write_text(json.dumps({"pairs": {"p": {**entry, **fields}}}))
        return load_catalog(path)
    assert describe_pairs(catalog_with(measured=[run])).count("command: edge-specdec bench b") == 1
    assert "not measured here: none yet" in describe_pairs(catalog_with(measured=None, unmeasured="none yet"))
    with pytest.raises(Exception, match="without its machine, date"):
        catalog_with(measured=[{"summary": "1.2x", "command": "x"}])
    with pytest.raises(Exception, match="no `unmeasured` note"):
        catalog_with(measured=None)
    with pytest.raises(Exception, match="has no measured"):
        catalog_with()


@pytest.mark.slow
def test_export_pair_takes_sources_and_weights_from_the_catalog(model_dir, tmp_path, monkeypatch, capsys):
    from edge_specdec import catalog

    path = tmp_path / "pairs.json"
    path.write_text(json.dumps({"pairs": {"tiny": {
        "description": "test", "target": str(model_dir("qwen2-bytelevel")), "draft": str(model_dir("llama-metaspace")),
        "target_weights": "int8", "draft_weights": "fp16", "devices": {"target": "CPU", "draft": "CPU"},
        "algorithm": "slem", "num_assistant_tokens": 3, "measured": None, "unmeasured": "unmeasured here: a test"}}}))
    monkeypatch.setattr(catalog, "CATALOG", path)
    out = tmp_path / "bundle"
    assert main(["export", "--pair", "tiny", "--out", str(out), "--quiet", "--draft-weights", "fp32"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["target"]["weights"]["format"] == "int8"  # from the catalog
    assert manifest["draft"]["weights"]["format"] == "fp32"   # the command line wins
    assert main(["export", "--pair", "nope"]) == 1
    assert "unknown pair 'nope'" in capsys.readouterr().err
