"""`edge-specdec bench` and edge_specdec.benchmark: the rows it runs, the reports it writes, the checks it makes."""
from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys

import pytest

from edge_specdec.benchmark import load_prompt_set, prompt_set, run_benchmark, runner
from edge_specdec.benchmark.setups import adaptive_policies, candidate_specs, select_specs
from edge_specdec.cli import main
from edge_specdec.errors import EdgeSpecdecError
from support import OTHER_VOCAB, SAME_VOCAB, spy_prompt_reuse

HAS_GENAI = importlib.util.find_spec("openvino_genai") is not None
HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None
SPEC_BENCH_CATEGORIES = {"code_generation", "code_editing", "chat", "summarization", "question_answering", "math",
                         "translation"}


def ours_rows(algorithm: str, ks=(3, 5), guard: bool = False) -> list[str]:
    """An algorithm's rows, in report order; guard: with its -conf-guard row (not a default row, but a pattern
    such as ours-slem-* selects it)."""
    # free drafts have no probabilities to stop on, and are no draft model to copy before
    conf = [] if algorithm == "suffix" else [f"ours-{algorithm}-conf", f"ours-{algorithm}-conf-nolookup"]
    conf += [f"ours-{algorithm}-conf-guard"] if guard and conf else []
    return [f"ours-{algorithm}-k{k}" for k in ks] + conf + [f"ours-{algorithm}-{p}" for p in adaptive_policies()]


# --- the plan, without models -----------------------------------------------------------------------------------

def test_default_rows_follow_the_vocabulary_relation():
    def default(relation, **flags):
        return [s.name for s in select_specs(candidate_specs(relation, [3, 5], **flags), None, relation)[0]]

    same = default("identical")
    assert same == ["ours-none", *ours_rows("standard"), *ours_rows("suffix"), "genai-none", "genai-sd-k3",
                    "genai-sd-k5", "genai-sd-conf"]
    other = default("heterogeneous")
    assert other == ["ours-none", *ours_rows("slem"), *ours_rows("tli"), *ours_rows("suffix")]
    assert default("target-only") == ["ours-none", *ours_rows("suffix")]
    # the optional families appear only when asked for
    assert "hf-uag" in default("heterogeneous", hf=True) and "hf-assisted" in default("identical", hf=True)
    assert {"genai-ours-none", "genai-ours-sd-k3"} <= set(default("identical", genai_ours=True))
    assert "ours-concurrent-slem-k3" in default("heterogeneous", concurrent=True)
    assert not any(n.startswith("genai") for n in default("identical", genai=False))


def test_setup_patterns_add_the_baselines_and_reject_unknown_names():
    candidates = candidate_specs("identical", [2], hf=False)
    chosen, notes = select_specs(candidates, ["genai-sd-*", "ours-standard-k2"], "identical")
    assert [s.name for s in chosen] == ["ours-none", "ours-standard-k2", "genai-none", "genai-sd-k2", "genai-sd-conf"]
    assert any("added ours-none" in n for n in notes) and any("added genai-none" in n for n in notes)
    # an optional row can be named without its flag, and a flag adds its rows to those named
    assert [s.name for s in select_specs(candidates, ["hf-assisted"], "identical")[0]] == ["hf-none", "hf-assisted"]
    with_hf = select_specs(candidate_specs("identical", [2], hf=True), ["ours-none"], "identical", ["hf"])[0]
    assert [s.name for s in with_hf] == ["ours-none", "hf-none", "hf-assisted"]
    with pytest.raises(EdgeSpecdecError, match="unknown setup 'ours-slem-k2'.*relation 'identical'"):
        select_specs(candidates, ["ours-slem-k2"], "identical")


def test_the_shipped_prompt_set_covers_the_spec_bench_categories():
    prompts = load_prompt_set()
    assert set(prompts) == SPEC_BENCH_CATEGORIES
    for category, items in prompts.items():
        assert 2 <= len(items) <= 3, category
        assert len({p["id"] for p in items}) == len(items) and all(p["text"].strip() for p in items)
    # the prompts that work on a text carry it
    assert all(len(p["text"]) > 250 for p in prompts["summarization"] + prompts["code_editing"])
    assert all("```" in p["text"] for p in prompts["code_editing"])


# --- runs on tiny bundles ---------------------------------------------------------------------------------------

def test_same_vocabulary_run_writes_the_reports(bundle_dir, tmp_path):
    lines: list[str] = []
    out = tmp_path / "out"
    report = run_benchmark(bundle_dir(*SAME_VOCAB), categories=["code_generation", "math"], max_new_tokens=8,
                           repeats=1, out=out, progress=lines.append)
    n_prompts = len(load_prompt_set()["code_generation"]) + len(load_prompt_set()["math"])
    expected = ["ours-none", *ours_rows("standard"), *ours_rows("suffix")]
    if HAS_GENAI:
        expected += ["genai-none", "genai-sd-k3", "genai-sd-k5", "genai-sd-conf"]
    rows = {r["setup"]: r for r in report["setups"]}
    assert list(rows) == expected

    # the files, and report.json holds what run_benchmark returned
    assert (out / "report.md").is_file() and (out / "report.json").is_file()
    assert (out / "speedup.png").is_file() == HAS_MATPLOTLIB
    saved = json.loads((out / "report.json").read_text())
    assert [r["setup"] for r in saved["setups"]] == expected and saved["categories"] == ["code_generation", "math"]

    # one progress line per timed run, with setup, prompt category and tokens/s
    timed = [line for line in lines if line.startswith("[")]
    assert len(timed) == len(expected) * n_prompts
    assert all("tok/s" in line for line in timed) and any("math/" in line and "ours-standard-k3" in line
                                                          for line in timed)

    for name, row in rows.items():
        assert row["runs"] == n_prompts and not row["failed_runs"], name
        assert row["tokens_per_s"]["min"] <= row["tokens_per_s"]["median"] <= row["tokens_per_s"]["max"]
        assert row["ttft_ms"] > 0 and row["peak_rss_mib"] > 0
        assert set(row["per_category"]) == {"code_generation", "math"}
        if name.startswith("ours-") and name != "ours-none":  # greedy: every speculative row writes the same ids
            assert row["identical"] is True and row["identity_checked_runs"] == n_prompts, name
            assert row["speedup"] > 0 and all(c["speedup"] > 0 for c in row["per_category"].values())
            assert 0 <= row["acceptance"] <= 1 and row["mean_tokens_per_target_pass"] >= 1
            assert row["time_split_seconds"]["target"] > 0
            # its floor: one of the run's prompts, at the lowest of the per-prompt speedups
            assert row["lowest_prompt"]["speedup"] == min(row["per_prompt_speedup"].values()), name
            assert row["lowest_prompt"]["prompt"] in row["per_prompt_tokens_per_s"], name
    assert rows["ours-standard-k3"]["time_split_seconds"]["draft"] > 0
    assert report["not_identical"] == []
    if HAS_GENAI:
        assert rows["genai-sd-k3"]["acceptance"] is not None and rows["genai-sd-k3"]["identity_checked_runs"]
        # the same setting side by side, then our default against GenAI's fastest speculative row of the run
        fastest = max(("genai-sd-k3", "genai-sd-k5", "genai-sd-conf"), key=lambda n: rows[n]["tokens_per_s"]["median"])
        assert [(p["ours"], p["genai"]) for p in report["ours_vs_genai"]] == [
            ("ours-none", "genai-none"), ("ours-standard-k3", "genai-sd-k3"), ("ours-standard-k5", "genai-sd-k5"),
            ("ours-standard-conf", "genai-sd-conf")] + ([] if fastest == "genai-sd-conf"
                                                        else [("ours-standard-conf", fastest)])
        assert [p["genai"] for p in report["ours_vs_genai"] if p["genai_fastest"]] == [fastest] * (
            1 + (fastest != "genai-sd-conf"))

    md = (out / "report.md").read_text()
    lowest = rows["ours-standard-k3"]["lowest_prompt"]
    for needle in ("## Speed", "peak RSS MiB (whole process)", f"{lowest['speedup']:.2f}x ({lowest['prompt']})",
                   "per prompt category", "| code_generation | math |", "## Machine", report["machine"]["cpu"],
                   "OpenVINO" if HAS_GENAI else "openvino"):
        assert needle in md, needle
    assert all(f"| {name} |" in md for name in expected)


def test_different_vocabulary_rows_and_machine_info(bundle_dir, tmp_path):
    lines: list[str] = []
    report = run_benchmark(bundle_dir(*OTHER_VOCAB), setups=["ours-slem-k3", "ours-tli-*"], categories=["chat"],
                           max_new_tokens=8, repeats=1, ks=[3], out=tmp_path, progress=lines.append, plot=False)
    names = [r["setup"] for r in report["setups"]]
    assert names == ["ours-none", "ours-slem-k3", *ours_rows("tli", ks=[3], guard=True)]
    assert any("added ours-none" in line for line in lines)
    assert all(r["identical"] is True for r in report["setups"][1:])
    assert not (tmp_path / "speedup.png").exists()
    machine = report["machine"]
    assert machine["cores"] >= 1 and machine["openvino"] and machine["date"]


def test_genai_draft_gives_a_different_vocabulary_bundle_the_genai_rows_and_the_sweep():
    def default(relation, **flags):
        return [s.name for s in select_specs(candidate_specs(relation, [3], **flags), None, relation)[0]]

    assert not any(n.startswith("genai") for n in default("heterogeneous"))
    swept = default("heterogeneous", genai_draft=True, genai_confidences=[0.3, 0.7])
    assert swept[-4:] == ["genai-none", "genai-sd-k3", "genai-sd-conf0.3", "genai-sd-conf"]
    assert [s.confidence for s in candidate_specs("identical", [3], genai_confidences=[0.5])
            if s.name.startswith("genai-sd-conf")] == [0.5]


@pytest.mark.skipif(not HAS_GENAI, reason="needs openvino_genai")
def test_genai_draft_rows_run_beside_a_different_vocabulary_draft(bundle_dir, tmp_path, capsys):
    out = tmp_path / "out"
    code = main(["bench", str(bundle_dir(*OTHER_VOCAB)), "--genai-draft", str(bundle_dir(*SAME_VOCAB)),
                 "--genai-confidences", "0.3", "0.7", "--setups", "ours-slem-conf", "genai-sd-conf*",
                 "--categories", "code_generation", "--max-new-tokens", "6", "--repeats", "1", "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    report = json.loads((out / "report.json").read_text())
    rows = {r["setup"]: r for r in report["setups"]}
    assert list(rows) == ["ours-none", "ours-slem-conf", "genai-none", "genai-sd-conf0.3", "genai-sd-conf"]
    assert report["settings"]["genai_draft"] == str(bundle_dir(*SAME_VOCAB))
    assert report["settings"]["default_algorithm"] == "slem"
    # GenAI's speculative rows drafted (they report proposals) and wrote what its target alone writes
    for name in ("genai-sd-conf0.3", "genai-sd-conf"):
        assert rows[name]["draft_tokens_proposed"] and rows[name]["identical"] is True, name
    fastest = max(("genai-sd-conf0.3", "genai-sd-conf"), key=lambda n: rows[n]["tokens_per_s"]["median"])
    pairs = {(p["ours"], p["genai"]): p for p in report["ours_vs_genai"]}
    assert ("ours-slem-conf", fastest) in pairs and pairs[("ours-slem-conf", fastest)]["genai_fastest"] is True
    assert ("ours-none", "genai-none") in pairs
    assert f"{fastest} (fastest)" in (out / "report.md").read_text()
    assert "--genai-draft" in captured.out and "--genai-confidences 0.3 0.7" in captured.out


def test_a_setup_that_changes_the_output_is_reported_not_identical(bundle_dir, tmp_path, monkeypatch, capsys):
    build = runner.build_setups

    def build_with_a_broken_row(*args, **kwargs):
        setups, skipped, pipe = build(*args, **kwargs)
        broken = next(s for s in setups if s.name == "ours-standard-k3")
        honest = broken.run

        def run(prompt):
            result = honest(prompt)
            result.token_ids = result.token_ids[:-1] + [result.token_ids[-1] + 1]  # one wrong token at the end
            return result
        broken.run = run
        return setups, skipped, pipe

    monkeypatch.setattr(runner, "build_setups", build_with_a_broken_row)
    out = tmp_path / "out"
    code = main(["bench", str(bundle_dir(*SAME_VOCAB)), "--setups", "ours-standard-k3", "ours-standard-k5",
                 "--categories", "math", "--max-new-tokens", "6", "--repeats", "2", "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 0
    rows = {r["setup"]: r for r in json.loads((out / "report.json").read_text())["setups"]}
    n = 2 * len(load_prompt_set()["math"])
    assert rows["ours-standard-k3"]["identical"] is False and rows["ours-standard-k3"]["mismatched_runs"] == n
    first = rows["ours-standard-k3"]["mismatches"][0]
    assert first["first_difference"] == first["length"] - 1  # the last token, where the fault is
    assert rows["ours-standard-k5"]["identical"] is True  # the honest row next to it still passes
    assert rows["ours-none"]["identical"] is True  # its second repeat equals its first
    assert "**NO**" in captured.out and "NOT identical: ours-standard-k3" in captured.out
    assert "output NOT identical to the same engine's target alone: ours-standard-k3" in captured.err
    assert f"edge-specdec bench {bundle_dir(*SAME_VOCAB)}" in captured.out  # the command line is in the report


def test_chat_template_formats_every_prompt(bundle_dir, tmp_path):
    from edge_specdec.runtime import Pipeline

    bundle = tmp_path / "bundle"
    shutil.copytree(bundle_dir(*SAME_VOCAB), bundle)
    (bundle / "target" / "chat_template.jinja").write_text(
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>\n{% endfor %}<assistant>")
    pipe = Pipeline(bundle)
    prompts, how = prompt_set.render_prompts(pipe, load_prompt_set(), ["translation"])
    assert how == "the target's chat template" and len(prompts) == len(load_prompt_set()["translation"])
    for p in prompts:
        assert p.text.startswith("<user>Translate") and p.text.endswith("<assistant>")
        assert p.ours == pipe.chat_prompt(p.messages)
    setups = ["ours-standard-k3"] + (["genai-none"] if HAS_GENAI else [])
    report = run_benchmark(bundle, setups=setups, categories=["translation"], max_new_tokens=4, repeats=1,
                           out=tmp_path / "out", progress=lambda _: None, plot=False)
    assert report["settings"]["prompt_format"] == "the target's chat template"
    assert all(r["runs"] == len(prompts) for r in report["setups"])


def test_every_run_prefills_its_whole_prompt(bundle_dir, tmp_path, monkeypatch):
    """The rows share one Pipeline and run back to back on a prompt: none may reuse the prompt's KV that the row
    before it left (GenAI's rows run with their prefix cache off), or the rows after the first would skip the
    prefill their tokens/s is measured with."""
    reused = spy_prompt_reuse(monkeypatch)
    run_benchmark(bundle_dir(*SAME_VOCAB), setups=["ours-none", "ours-standard-k3"], categories=["math"],
                  max_new_tokens=4, repeats=2, out=tmp_path, progress=lambda line: None, genai=False)
    assert len(reused) > 4 and reused == [0] * len(reused)


def test_without_matplotlib_there_is_no_png_and_no_crash(bundle_dir, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    lines: list[str] = []
    report = run_benchmark(bundle_dir(*SAME_VOCAB), setups=["ours-none"], categories=["math"], max_new_tokens=4,
                           repeats=1, out=tmp_path, progress=lines.append)
    assert any("matplotlib is not installed" in line for line in lines)
    assert (tmp_path / "report.md").is_file() and not (tmp_path / "speedup.png").exists()
    assert "plot" not in report["files"]


# --- the command line -------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_bench_help_teaches_by_example():
    proc = subprocess.run([sys.executable, "-m", "edge_specdec.cli", "bench", "--help"], capture_output=True,
                          text=True)
    assert proc.returncode == 0
    for needle in ("examples:", "edge-specdec bench bundles/", "--setups", "--categories", "--max-new-tokens",
                   "--repeats", "--ks", "--out", "--hf", "--genai-ours", "--concurrent", "--precision",
                   "ours-none", "genai-sd-kK", "hf-uag", "code_generation", "translation"):
        assert needle in proc.stdout, needle


@pytest.mark.parametrize("bundle,args,message", [
    (None, [], "does not exist"),
    (SAME_VOCAB, ["--setups", "ours-none", "nope"], "unknown setup 'nope'"),
    (OTHER_VOCAB, ["--setups", "ours-standard-k3"], "unknown setup 'ours-standard-k3' for this bundle"),
    (SAME_VOCAB, ["--categories", "math", "poetry"], "unknown prompt category 'poetry': choose from code_generation"),
    (SAME_VOCAB, ["--ks", "0"], "at least 1"),
    (SAME_VOCAB, ["--repeats", "0"], "--repeats must be at least 1"),
    (SAME_VOCAB, ["--out", "{file}"], "is a file: give a folder"),
])
def test_bench_bad_inputs_are_one_clear_line(bundle_dir, tmp_path, capsys, bundle, args, message):
    path = str(bundle_dir(*bundle)) if bundle else str(tmp_path / "no-such-bundle")
    (tmp_path / "a-file").write_text("not a folder")
    out = tmp_path / "out"
    args = [a.format(file=tmp_path / "a-file") for a in args] + ([] if "--out" in args else ["--out", str(out)])
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(["bench", path, *args]) == 1
    err = capsys.readouterr().err
    assert err.startswith("edge-specdec: error: ") and message in err, err
    assert err.strip().count("\n") == 0 and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing ran, nothing was written
