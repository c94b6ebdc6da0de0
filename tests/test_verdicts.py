"""How a speedup is told: no ratio where nothing was drafted, "no measurable difference" within the noise band, and
check's ideal priced from what a drafted token costs in the decode loop; alike in run --compare, check and bench."""
from __future__ import annotations

import pytest

from edge_specdec.benchmark.verdict import NO_DIFFERENCE, TARGET_ALONE_THROUGHOUT, speedup_verdict
from edge_specdec.cli import main
from edge_specdec.runtime.drafters import DraftingGuard, DraftLength

from support import SAME_VOCAB

HETERO = ("qwen2-bytelevel", "llama-metaspace")


@pytest.fixture
def guard_never_drafts(monkeypatch):
    """The drafting guard of a machine where drafting loses, on text that repeats nothing: every round runs the
    target alone (a paused run still copies text that repeats, which the tiny models' text does)."""
    monkeypatch.setattr(DraftingGuard, "drafting", lambda self: False)
    monkeypatch.setattr(DraftLength, "copies_allowed", lambda self: False)


def test_the_verdict_in_words():
    assert speedup_verdict(1.26, drafted=False) == TARGET_ALONE_THROUGHOUT  # no ratio: alone against alone
    assert speedup_verdict(1.08, drafted=True).startswith(NO_DIFFERENCE)
    assert speedup_verdict(0.91, drafted=True).startswith(NO_DIFFERENCE)
    assert speedup_verdict(1.3, drafted=True) == "1.30x"
    assert speedup_verdict(0.8, drafted=True) == "0.80x"
    # a measured spread replaces the default band: quartiles 0.925 and 1.375, a band of +-22.5 %
    assert speedup_verdict(1.2, drafted=True, ratios=[0.7, 1.0, 1.3, 1.6]).startswith(NO_DIFFERENCE)
    assert speedup_verdict(1.08, drafted=True, ratios=[1.07, 1.08, 1.09]) == "1.08x"


def test_run_compare_prints_no_ratio_where_no_round_drafted(bundle_dir, guard_never_drafts, capsys):
    bundle = str(bundle_dir(*SAME_VOCAB))
    capsys.readouterr()
    assert main(["run", bundle, "--prompt", "def f(x):", "--max-new-tokens", "12", "--ignore-eos", "--compare"]) == 0
    line = next(x for x in capsys.readouterr().err.splitlines() if x.startswith("compare:"))
    assert TARGET_ALONE_THROUGHOUT in line and "x that" not in line, line
    assert "output identical to the target alone" in line


def test_a_one_shot_compare_reuses_no_prompt_tokens_from_its_warm_up(bundle_dir, capsys):
    bundle = str(bundle_dir(*SAME_VOCAB))
    capsys.readouterr()
    assert main(["run", bundle, "--prompt", "def f(x):", "--max-new-tokens", "8", "--compare"]) == 0
    err = capsys.readouterr().err
    assert "[" in err and "reused from the cache" not in err, err


def test_check_says_so_where_no_round_drafted_and_prices_a_drafted_token_from_the_loop(
        bundle_dir, guard_never_drafts, monkeypatch):
    import edge_specdec.check as check

    priced = []
    real_predict = check.predict

    def spy(acceptance, draft_step, target, **kw):
        priced.append(draft_step)
        return real_predict(acceptance, draft_step, target, **kw)

    monkeypatch.setattr(check, "predict", spy)
    lines: list[str] = []
    report = check.run_check(bundle_dir(*HETERO), max_new_tokens=12, prompts=["x = ", "def f(x):"],
                             say=lines.append)
    line = next(x for x in lines if x.startswith("prediction:"))
    assert report["prediction"]["default_run"]["drafted_tokens"] == 0
    assert line.startswith(f"prediction: {TARGET_ALONE_THROUGHOUT}") and "about" not in line, line
    # the exactness runs (the guard is off for an algorithm by name) priced a drafted token as the loop paid it
    name = report["prediction"]["algorithm"]
    per_drafted = report["exactness"][name]["draft_seconds_per_drafted_token"]
    assert priced == [per_drafted] and per_drafted != report["costs"]["draft_step_ms"] / 1000


def test_bench_shows_no_ratio_for_a_row_that_drafted_nothing():
    from edge_specdec.benchmark.prompt_set import Prompt
    from edge_specdec.benchmark.report import summarize_setup
    from edge_specdec.benchmark.setups import Run, Setup, Spec

    prompts = [Prompt(str(i), "code", [], "p", "p") for i in range(3)]

    def setup(spec, seconds, proposed):
        s = Setup(spec, run=None)
        s.runs = {(p.key, 0): Run("t", 10, sec, proposed=proposed, accepted=0) for p, sec in zip(prompts, seconds)}
        return s

    alone = setup(Spec("ours-none", "ours", "the target alone"), [1.0, 1.0, 1.0], 0)
    idle = setup(Spec("ours-slem-k4", "ours", "slem", algorithm="slem"), [0.8, 0.9, 0.8], 0)
    drafted = setup(Spec("ours-slem-k2", "ours", "slem", algorithm="slem"), [0.5, 0.5, 0.52], 12)
    setups = {s.spec.name: s for s in (alone, idle, drafted)}
    assert summarize_setup(idle, setups, prompts)["speedup_verdict"] == TARGET_ALONE_THROUGHOUT
    assert summarize_setup(idle, setups, prompts)["per_category"]["code"]["speedup_verdict"] == TARGET_ALONE_THROUGHOUT
    assert summarize_setup(drafted, setups, prompts)["speedup_verdict"] == "2.00x"


def test_bench_reports_each_row_s_lowest_prompt_by_the_median_of_its_repeats():
    """A row's floor is the prompt whose paired ratios have the lowest median: one slow run of a prompt that is fast
    otherwise does not make it the floor, and a prompt slow in most repeats does."""
    from edge_specdec.benchmark.prompt_set import Prompt
    from edge_specdec.benchmark.report import summarize_setup
    from edge_specdec.benchmark.setups import Run, Setup, Spec

    prompts = [Prompt(name, "chat", [], "p", "p") for name in ("steady", "one-slow-run", "mostly-slow")]
    alone = Setup(Spec("ours-none", "ours", "the target alone"), run=None)
    alone.runs = {(p.key, rep): Run("t", 10, 1.0, proposed=0, accepted=0) for p in prompts for rep in range(3)}
    row = Setup(Spec("ours-slem-k2", "ours", "slem", algorithm="slem"), run=None)
    seconds = {"steady": [0.8, 0.8, 0.8], "one-slow-run": [0.5, 2.0, 0.5], "mostly-slow": [0.9, 1.1, 1.05]}
    row.runs = {(p.key, rep): Run("t", 10, s, proposed=8, accepted=4) for p in prompts
                for rep, s in enumerate(seconds[p.id])}
    setups = {"ours-none": alone, "ours-slem-k2": row}
    summary = summarize_setup(row, setups, prompts)
    assert summary["lowest_prompt"]["prompt"] == "chat/mostly-slow"
    assert summary["lowest_prompt"]["speedup"] == pytest.approx(1 / 1.05)
    assert summary["per_prompt_speedup"]["chat/one-slow-run"] == pytest.approx(2.0)
    assert summarize_setup(alone, setups, prompts)["lowest_prompt"] is None  # the baseline has no floor
