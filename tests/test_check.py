"""`edge-specdec check`: exactness verdicts that can fail, costs, the cost model, and errors without a traceback."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from edge_specdec.check import predict, run_check
from edge_specdec.cli import main
from edge_specdec.runtime.pipeline import DecodingSession

HETERO = ("qwen2-bytelevel", "llama-metaspace")


def test_check_passes_and_reports_costs(bundle_dir, capsys):
    bundle_dir(*HETERO)
    capsys.readouterr()  # what building the bundle printed
    assert main(["check", str(bundle_dir(*HETERO)), "--json", "--max-new-tokens", "12", "--sampling",
                 "--temperature", "0.7"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["block_invariant"]
    assert set(report["exactness"]) == {"prompt-lookup", "suffix", "slem", "tli", "slrs"}
    assert all(r["identical"] == r["runs"] == 3 for r in report["exactness"].values())
    blocks = report["costs"]["target_blocks_ms"]
    assert set(map(int, blocks)) == {1, 2, 3, 5, 9} and all(ms > 0 for ms in blocks.values())
    assert report["costs"]["draft_step_ms"] > 0
    # the prediction is the default run's measured time per output token against the target alone's
    prediction = report["prediction"]
    assert prediction["algorithm"] == "slem" == prediction["default_run"]["algorithm"]
    # beside it, the prediction of simulated rounds (edge-specdec pair's), on the same prompts
    simulated = prediction["simulated"]
    assert simulated["algorithm"] == "slem" and simulated["speedup"] > 0 and len(simulated["per_prompt"]) == 3
    # and for the sampled decoding asked for (--sampling): auto's sampled algorithm on sampled answers
    sampled = prediction["simulated_sampled"]
    assert sampled["decoding"].startswith("sampled (temperature 0.7") and sampled["algorithm"] in ("tli", "slem")
    assert sampled["speedup"] > 0 and len(sampled["per_prompt"]) == 3 and simulated["decoding"] == "greedy"
    assert prediction["predicted_speedup"] == prediction["default_run"]["speedup"] > 0
    assert prediction["default_run"]["max_new_tokens"] == 128
    assert prediction["ideal_speedup"] > 0


def test_the_prediction_runs_what_run_runs_by_default(bundle_dir, monkeypatch):
    """check predicts `run --compare`: the default algorithm with its guard and the bundle's default settings (the
    demo's repetition penalty), at run's length, warmed up; its exactness runs (no penalty, 64 tokens, every
    algorithm by name) measured another workload."""
    import dataclasses

    from edge_specdec.check import default_speedup
    from edge_specdec.runtime import Engine
    from edge_specdec.runtime.pipeline import DecodingSession

    engine = Engine(bundle_dir(*HETERO))
    engine.default_config = dataclasses.replace(engine.default_config, repetition_penalty=1.3)
    calls = []
    real = DecodingSession.generate

    reused = []

    def spy(self, prompt, config=None, speculative=None, **settings):
        calls.append((settings.get("algorithm"), config.repetition_penalty, config.max_new_tokens))
        result = real(self, prompt, config, speculative, **settings)
        reused.append(result.stats.prompt_tokens_reused)
        return result

    monkeypatch.setattr(DecodingSession, "generate", spy)
    measured = default_speedup(engine, ["def f(x):", "x = "])
    assert calls[:2] == [("auto", 1.3, 128), ("none", 1.3, 128)]  # the untimed warm-up
    assert calls[2:] == [("auto", 1.3, 128), ("none", 1.3, 128)] * 2
    # as in `run --compare`, each side prefills its whole prompt: the target alone does not reuse the default's
    assert reused == [0] * len(calls)
    assert measured["repetition_penalty"] == 1.3 and measured["speedup"] > 0


def test_the_measured_speedup_is_the_median_ratio_of_times_per_output_token():
    from types import SimpleNamespace

    from edge_specdec.check import loop_speedup
    from edge_specdec.runtime import Stats

    def run(seconds, first, tokens):
        return SimpleNamespace(stats=Stats(seconds=seconds, first_token_seconds=first, new_tokens=tokens))
    alone = [run(2.1, 0.1, 21), run(4.1, 0.1, 41), run(1.1, 0.1, 11)]
    drafted = [run(1.1, 0.1, 21), run(1.6, 0.1, 41), run(1.1, 0.1, 11)]  # 2x, 2.67x, 1x
    assert loop_speedup(alone, drafted) == pytest.approx(2.0)


def test_check_fails_when_an_algorithm_is_not_exact(bundle_dir, monkeypatch, capsys):
    real = DecodingSession.generate

    def broken(self, prompt, config=None, algorithm="auto", **options):
        result = real(self, prompt, config, algorithm=algorithm, **options)
        if algorithm == "tli":  # one wrong token, as a device with another kernel could give
            result.token_ids[-1] += 1
        return result
    monkeypatch.setattr(DecodingSession, "generate", broken)
    assert main(["check", str(bundle_dir(*HETERO)), "--max-new-tokens", "8"]) == 1
    out = capsys.readouterr().out  # the report is the command's output: stdout
    assert "tli: 0/3 identical" in out and "slem: 3/3 identical" in out and "check: FAILED" in out


@pytest.mark.slow
def test_an_absent_device_is_one_line_without_a_traceback(bundle_dir):
    out = subprocess.run([sys.executable, "-m", "edge_specdec.cli", "check", str(bundle_dir(*HETERO)),
                          "--draft-device", "NPU"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.strip().count("\n") == 0 and "NPU" in out.stderr


def test_the_cost_model():
    """a = 0: drafting never pays; high acceptance and a cheap draft: a long draft, a speedup near the yield."""
    flat = {1: 0.05, 2: 0.05, 3: 0.05, 5: 0.05, 9: 0.05}
    assert predict(0.0, 0.01, flat)["draft_length"] == 0
    good = predict(0.9, 0.001, flat)
    assert good["draft_length"] == 8
    assert good["predicted_speedup"] == pytest.approx((1 - 0.9 ** 9) / 0.1 * 0.05 / (8 * 0.001 + 0.05))
    # blocks that cost by their size: a shorter draft; t(4) interpolated between 3 and 5
    steep = {1: 0.05, 2: 0.06, 3: 0.07, 5: 0.09, 9: 0.13}
    assert predict(0.6, 0.005, steep)["rates"][3] == pytest.approx((1 - 0.6 ** 4) / 0.4 / (3 * 0.005 + 0.08))
    assert 1 <= predict(0.6, 0.005, steep)["draft_length"] < 8


def test_run_check_says_what_it_does(bundle_dir):
    lines: list[str] = []
    report = run_check(bundle_dir(*HETERO), max_new_tokens=6, prompts=["x = "], say=lines.append)
    assert report["ok"] and any(line.startswith("placement: target on CPU") for line in lines)
    assert any("prediction" in line or "drafting does not pay" in line for line in lines)



def test_check_predicts_the_sampled_decoding_a_bundles_defaults_ask_for():
    from types import SimpleNamespace

    from edge_specdec.check import sampling_to_predict
    from edge_specdec.pairing import Sampling
    from edge_specdec.runtime import GenerationConfig

    def engine(**defaults):
        return SimpleNamespace(default_config=GenerationConfig(**defaults))
    assert sampling_to_predict(engine()) is None  # greedy defaults: the greedy prediction alone
    assert sampling_to_predict(engine(temperature=0.6, top_p=0.9)) == Sampling(0.6, 0.9)
    assert sampling_to_predict(engine(), Sampling(1.0)) == Sampling(1.0)


def test_sampling_settings_without_sampling_are_refused(capsys):
    with pytest.raises(SystemExit, match="add --sampling"):
        main(["check", "--temperature", "0.5"])
