"""`edge-specdec bench --clients`: several clients at once, ours against one after another and against GenAI's
continuous batching; the rows, the reports, the identity checks and the options' errors."""
from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys

import pytest

from edge_specdec.benchmark.client_report import render_clients_markdown
from edge_specdec.benchmark.client_setups import CLIENT_SETUPS, ClientPrompt, Request, Round, Row, select_client_setups
from edge_specdec.benchmark.client_summary import build_clients_report
from edge_specdec.benchmark.concurrency import run_clients_benchmark
from edge_specdec.benchmark.prompt_set import load_prompt_set, pick_prompt_items
from edge_specdec.cli import main
from edge_specdec.errors import EdgeSpecdecError
from support import OTHER_VOCAB, SAME_VOCAB, spy_prompt_reuse

HAS_GENAI = importlib.util.find_spec("openvino_genai") is not None
HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None
OURS = ["ours-none-sequential", "ours-spec-sequential", "ours-none", "ours-spec"]
GENAI = ["genai-cb-none", "genai-cb-sd"]


def rows_by_n(report) -> dict[int, dict[str, dict]]:
    return {res["clients"]: {r["setup"]: r for r in res["rows"]} for res in report["results"]}


def check_sane(report, clients, max_new_tokens, setups) -> None:
    """Every row ran at every N, the numbers are positive, and aggregate tokens/s is at least the slowest
    client's own tokens/s (the wall time is at least that client's time, and counts every client's tokens)."""
    by_n = rows_by_n(report)
    assert sorted(by_n) == clients
    for n, rows in by_n.items():
        assert list(rows) == setups, n
        for name, r in rows.items():
            assert r["rounds"] == report["settings"]["repeats"] and not r["failed_rounds"], (n, name, r["failures"])
            agg = r["aggregate_tokens_per_s"]
            assert agg["median"] > 0 and r["wall_seconds"] > 0 and r["ttft_ms"] > 0, (n, name)
            assert 0 < r["new_tokens_total"] <= n * max_new_tokens * r["rounds"], (n, name)
            assert agg["min"] >= r["client_tokens_per_s_min"] * 0.999, (n, name)
            if max_new_tokens > 1:
                assert r["tpot_ms"] > 0 and r["tpot_ms_max"] >= r["tpot_ms"], (n, name)
    for raw in report["rounds"]:  # each round: its clients, their tokens adding up to the round's
        assert len(raw["requests"]) == raw["clients"]
        assert sum(q["new_tokens"] for q in raw["requests"]) == raw["new_tokens"]
        slack = 1e-4 * (len(raw["requests"]) + 1)  # report.json rounds seconds to 4 digits
        if raw["setup"].endswith("-sequential"):  # one after another: the wall time is at least their sum
            assert raw["wall_seconds"] >= sum(q["seconds"] for q in raw["requests"]) - slack
        else:  # at once: each client ends within the round
            assert all(q["seconds"] <= raw["wall_seconds"] + slack for q in raw["requests"])


# --- without models ---------------------------------------------------------------------------------------------

def test_setups_patterns_add_their_references():
    assert [s.name for s in select_client_setups(None)[0]] == OURS + GENAI
    chosen, notes = select_client_setups(["ours-spec", "genai-cb-sd"])
    assert [s.name for s in chosen] == ["ours-none-sequential", "ours-spec", "genai-cb-none", "genai-cb-sd"]
    assert any("added ours-none-sequential" in n for n in notes) and any("added genai-cb-none" in n for n in notes)
    assert [s.name for s in select_client_setups(["ours-*"])[0]] == OURS
    with pytest.raises(EdgeSpecdecError, match="unknown setup 'genai-sd-k3' for --clients"):
        select_client_setups(["genai-sd-k3"])


def test_prompts_are_distinct_round_robin_and_borrowed_with_a_note():
    prompt_set = load_prompt_set()
    items, notes = pick_prompt_items(prompt_set, ["code_generation", "math"], 4)
    assert [c for c, _ in items] == ["code_generation", "math", "code_generation", "math"] and not notes
    n_code = len(prompt_set["code_generation"])
    items, notes = pick_prompt_items(prompt_set, ["code_generation"], n_code + 2)
    keys = [f"{c}/{item['id']}" for c, item in items]
    assert len(set(keys)) == n_code + 2 and all(k.startswith("code_generation/") for k in keys[:n_code])
    assert len(notes) == 1 and "from the other categories" in notes[0]
    total = sum(len(v) for v in prompt_set.values())
    with pytest.raises(EdgeSpecdecError, match=f"at most {total} clients"):
        pick_prompt_items(prompt_set, ["math"], total + 1)


def _round(setup, n, rep, wall, requests):
    return Round(setup, n, rep, wall, requests)


def test_summary_ratios_identity_and_goals_from_known_rounds():
    """The arithmetic of the report, on rounds whose numbers are known: the ratios are paired per repeat, TPOT
    against alone is per client, and a changed token is a mismatch."""
    def req(key, ids, seconds, tpot):  # each request its own list of ids, as the runners return them
        return Request(key, list(ids), "", seconds, ttft_ms=10.0, tpot_ms=tpot)

    ids = {"a": [1, 2, 3, 4], "b": [5, 6, 7, 8], "c": [9, 9, 9, 9], "d": [7, 7, 7, 7]}
    keys = list(ids)
    spec = {s.name: s for s in CLIENT_SETUPS}
    rows = {name: Row(spec[name], run=None) for name in OURS}
    for n in (1, 4):
        k = keys[:n]
        # one after another: 1 s per request, TPOT 10 ms each; at once: 4 requests in 1.6 s (2.5x), TPOT 15 ms
        rows["ours-none-sequential"].rounds.append(_round("ours-none-sequential", n, 0, 1.0 * n,
                                                          [req(x, ids[x], 1.0, 12.0) for x in k]))
        rows["ours-spec-sequential"].rounds.append(_round("ours-spec-sequential", n, 0, 1.0 * n,
                                                          [req(x, ids[x], 1.0, 10.0) for x in k]))
        rows["ours-none"].rounds.append(_round("ours-none", n, 0, 0.8 * n, [req(x, ids[x], 0.8 * n, 12.0) for x in k]))
        wall = 1.0 if n == 1 else 1.6
        spec_requests = [req(x, ids[x], wall, 10.0 if n == 1 else 15.0) for x in k]
        if n == 4:
            spec_requests[-1].token_ids[2] += 1  # one wrong token in one client's output
            spec_requests[-1].tpot_ms = 25.0  # and one slow client: 2.5x its TPOT alone
        rows["ours-spec"].rounds.append(_round("ours-spec", n, 0, wall, spec_requests))
    prompts = [ClientPrompt(x, "cat", [], x, [0], [0]) for x in keys]
    settings = {"bundle": "b", "relation": "heterogeneous", "clients": [1, 4], "repeats": 1, "max_new_tokens": 4}
    report = build_clients_report(list(rows.values()), prompts, settings, {}, {}, [], [], None)
    at1, at4 = report["summary"]
    assert at4["spec_vs_sequential"] == pytest.approx(2.5) and at1["spec_vs_sequential"] == pytest.approx(1.0)
    assert at4["spec_vs_ours_none"] == pytest.approx(3.2 / 1.6)
    assert at4["spec_vs_genai_cb_sd"] is None  # no GenAI rows: no ratio rather than a made-up one
    assert at4["spec_tpot_vs_alone_median"] == pytest.approx(1.5) and at4["spec_tpot_vs_alone_max"] == 2.5
    assert at4["spec_tpot_vs_one_client"] == pytest.approx(1.5)
    r4 = rows_by_n(report)[4]
    assert r4["ours-spec"]["identical"] is False and r4["ours-spec"]["mismatched_requests"] == 1
    assert r4["ours-spec"]["mismatches"][0]["prompt"] == "d" and r4["ours-spec"]["mismatches"][0]["first_difference"] == 2
    assert r4["ours-none"]["identical"] is True and r4["ours-none"]["identity_checked_requests"] == 4
    assert report["not_identical"] == ["ours-spec (clients 4)"] and report["ours_identical"] is False
    # the goals at 4 clients: 2.5x one after another (met), identical (not), TPOT <= 2x alone (not), GenAI (none)
    assert [g["met"] for g in report["goals"]] == [True, False, False, None]
    assert report["goals"][0]["value"] == pytest.approx(2.5) and report["goals"][2]["value"] == 2.5
    md = render_clients_markdown({**report, "machine": {"cpu": "x", "cores": 2, "platform": "p",
                                                        "python": "3", "date": "d"},
                                  "settings": {**report["settings"], "prompt_format": "raw",
                                               "categories": ["cat"], "batching": True,
                                               "algorithms": {"auto": "slem"}, "precision": "dq",
                                               "placement": "CPU"}})
    assert "**NO**, 1 of 4 differ" in md and "NOT identical: ours-spec with 4 clients on d" in md
    assert "## 1 client\n" in md and "## 4 clients\n" in md
    assert "## Goals at 4 clients" in md and "2.50x" in md


# --- runs on tiny bundles ---------------------------------------------------------------------------------------

def test_same_vocabulary_clients_run_writes_the_reports(bundle_dir, tmp_path):
    lines: list[str] = []
    out = tmp_path / "out"
    report = run_clients_benchmark(bundle_dir(*SAME_VOCAB), clients=[2, 1], categories=["code_generation"],
                                   max_new_tokens=6, repeats=1, out=out, progress=lines.append)
    setups = OURS + (GENAI if HAS_GENAI else [])
    check_sane(report, [1, 2], 6, setups)
    by_n = rows_by_n(report)
    for n, rows in by_n.items():  # greedy: every one of our rows writes the target alone's token ids
        for name in OURS:
            if (n, name) != (1, "ours-none-sequential"):  # that one is the reference's first run itself
                assert rows[name]["identical"] is True and rows[name]["identity_checked_requests"] >= 1, (n, name)
    assert report["ours_identical"] is True and report["not_identical"] == []
    assert by_n[1]["ours-spec"]["acceptance"] is not None and report["settings"]["algorithms"]["auto"] == "standard"
    if HAS_GENAI:  # the bundle's own draft has the target's vocabulary: GenAI's speculative row runs with it
        assert report["settings"]["genai"]["draft_from"] == "the bundle's own draft"
        assert by_n[2]["genai-cb-sd"]["identical"] is True
        assert by_n[2]["genai-cb-sd"]["identical_to_ours_target_alone"] is not None
        # per request, our step clock and GenAI's own perf metrics both timed GenAI's tokens
        assert report["genai_clock_difference_ms"] is not None and by_n[2]["genai-cb-sd"]["genai_own_tpot_ms"] > 0
    else:
        assert {s["setup"] for s in report["skipped"]} == set(GENAI)
    # one uncounted warm-up round per (N, row), then one progress line per timed round
    assert sum("warm-up clients" in line for line in lines) == 2 * len(setups)
    assert sum(line.startswith("[") for line in lines) == 2 * len(setups)

    assert (out / "report.md").is_file() and (out / "report.json").is_file()
    assert (out / "clients.png").is_file() == HAS_MATPLOTLIB
    saved = json.loads((out / "report.json").read_text())
    assert saved["settings"]["clients"] == [1, 2] and saved["summary"] == report["summary"]
    md = (out / "report.md").read_text()
    for needle in ("## Summary", "## 1 client", "## 2 clients", "aggregate tok/s", "TTFT ms", "TPOT ms",
                   "ours-spec / one after another", "## What GenAI gives per request, and what not", "## Machine"):
        assert needle in md, needle
    assert "## Goals at 4 clients" not in md  # 4 clients were not measured
    assert all(f"| {name} |" in md for name in setups)


def test_every_request_prefills_its_whole_prompt(bundle_dir, tmp_path, monkeypatch):
    """A client's session gets the same prompt in every round and row: no request may reuse the prompt's KV that
    the round before left (GenAI's rows run with their prefix cache off)."""
    reused = spy_prompt_reuse(monkeypatch)
    run_clients_benchmark(bundle_dir(*SAME_VOCAB), clients=[2], setups=["ours-*"], categories=["code_generation"],
                          max_new_tokens=4, repeats=2, out=tmp_path, progress=lambda line: None, plot=False)
    assert len(reused) > 4 and reused == [0] * len(reused)


def test_different_vocabulary_with_genai_draft_from_the_command_line(bundle_dir, tmp_path, capsys):
    out = tmp_path / "out"
    code = main(["bench", str(bundle_dir(*OTHER_VOCAB)), "--clients", "1", "2", "--genai-draft",
                 str(bundle_dir(*SAME_VOCAB)), "--categories", "math", "--max-new-tokens", "5", "--repeats", "1",
                 "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    report = json.loads((out / "report.json").read_text())
    setups = OURS + (GENAI if HAS_GENAI else [])
    check_sane(report, [1, 2], 5, setups)
    assert report["settings"]["algorithms"]["auto"] == "slem" and report["ours_identical"] is True
    if HAS_GENAI:
        assert report["settings"]["genai"]["draft_from"].startswith("the draft of --genai-draft")
        assert rows_by_n(report)[2]["genai-cb-sd"]["identical"] is True
    assert "--genai-draft" in captured.out and "## 2 clients" in captured.out  # the command, the tables


def test_different_vocabulary_without_genai_draft_skips_the_speculative_genai_row(bundle_dir, tmp_path):
    lines: list[str] = []
    report = run_clients_benchmark(bundle_dir(*OTHER_VOCAB), clients=[1], setups=["ours-spec", "genai-*"],
                                   categories=["chat"], max_new_tokens=3, repeats=1, out=tmp_path,
                                   progress=lines.append, plot=False)
    names = [r["setup"] for r in report["results"][0]["rows"]]
    assert names == ["ours-none-sequential", "ours-spec"] + (["genai-cb-none"] if HAS_GENAI else [])
    skipped = {s["setup"]: s["reason"] for s in report["skipped"]}
    assert "--genai-draft" in skipped["genai-cb-sd"] and "another vocabulary" in skipped["genai-cb-sd"]
    assert not (tmp_path / "clients.png").exists()


# --- the command line -------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_help_teaches_the_clients_benchmark():
    proc = subprocess.run([sys.executable, "-m", "edge_specdec.cli", "bench", "--help"], capture_output=True,
                          text=True)
    assert proc.returncode == 0
    for needle in ("--clients", "--genai-draft", "--genai-k", "ours-spec-sequential", "genai-cb-sd",
                   "Engine(batching=True)", "clients.png", "--clients 1 2 4 8"):
        assert needle in proc.stdout, needle


@pytest.mark.parametrize("args,message", [
    (["--clients", "0"], "--clients needs numbers of clients of at least 1"),
    (["--clients", "99"], "--clients 99: at most 64 clients"),
    (["--clients", "21"], "needs 21 distinct prompts, but the prompt set has 20"),
    (["--clients", "2", "--ks", "3"], "--ks is an option of the rows benchmark"),
    (["--clients", "2", "--hf"], "--hf is an option of the rows benchmark"),
    (["--genai-k", "3"], "--genai-k is an option of the clients benchmark: add --clients"),
    (["--clients", "2", "--genai-confidences", "0.3"], "--genai-confidences is an option of the rows benchmark"),
    (["--genai-draft", "{other}"], "its draft must share its target's vocabulary"),
    (["--genai-draft", "{changed}"], "has another target than"),
    (["--genai-confidences", "1.5"], "must be above 0 and below 1"),
    (["--clients", "2", "--setups", "ours-standard-k3"], "unknown setup 'ours-standard-k3' for --clients"),
    (["--clients", "2", "--genai-draft", "{other}"], "its draft must share its target's vocabulary"),
    (["--clients", "2", "--genai-draft", "{changed}"], "has another target than"),
    (["--clients", "2", "--genai-draft", "{same}", "--no-genai"], "drop one of them"),
    (["--clients", "2", "--genai-k", "0"], "--genai-k must be at least 1"),
])
def test_bad_clients_options_are_one_clear_line(bundle_dir, tmp_path, capsys, args, message):
    same, other = bundle_dir(*SAME_VOCAB), bundle_dir(*OTHER_VOCAB)
    changed = tmp_path / "changed"  # the same-vocabulary bundle, as if its target had other weights
    shutil.copytree(same, changed)
    manifest = json.loads((changed / "manifest.json").read_text())
    manifest["files"]["target/openvino_model.bin"]["sha256"] = "0" * 64
    (changed / "manifest.json").write_text(json.dumps(manifest))
    out = tmp_path / "out"
    args = [a.format(same=same, other=other, changed=changed) for a in args]
    assert main(["bench", str(other), *args, "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("edge-specdec: error: ") and message in err, err
    assert err.strip().count("\n") == 0 and "Traceback" not in err
    assert not out.exists()  # nothing ran, nothing was written
