"""`edge-specdec pair`: the simulated rounds are the real loop's, the ranking and its ties, the cheap look at two
tokenizer.json files, the refusal line of an unusable candidate, the report's JSON shape, the export of the best."""
from __future__ import annotations

import json
import shutil

import pytest

from edge_specdec.pairing import NO_DRAFT, FREE_DRAFTS, PairSettings, find_pair
from edge_specdec.pairing.candidates import admission, classify, look, read_vocabulary, relate
from edge_specdec.pairing.rank import Prediction, rank, within_noise
from edge_specdec.pairing.replay import greedy_answers, replay
from edge_specdec.runtime import Engine, SpeculativeConfig
from support import OTHER_VOCAB, SAME_VOCAB, run_cli

PROMPTS = ["def fib(n):\n    if n < 2:\n        return n\n", "a b a b a b a b", "The quick brown fox"]


def calls_of(session):
    """Spy on a session's target: (sequence length, tokens proposed) of every call."""
    seen, real = [], session.target.sync

    def sync(sequence, extra=()):
        seen.append((len(sequence), len(extra)))
        return real(sequence, extra)
    session.target.sync = sync
    return seen


@pytest.mark.parametrize("pair", [SAME_VOCAB, OTHER_VOCAB, "demo"], ids=["same-vocabulary", "other-vocabulary",
                                                                          "demo-answers-ending-in-eos"])
def test_simulated_rounds_are_those_of_a_real_greedy_run(bundle_dir, pair):
    from edge_specdec.demo import DEMO_BUNDLE
    from edge_specdec.pairing import PairSettings

    # the demo answers one of the built-in code prompts with its EOS alone, which a proposal runs over
    bundle, prompts = ((DEMO_BUNDLE, PairSettings(task="code").prompt_list()) if pair == "demo"
                       else (bundle_dir(*pair), PROMPTS))
    engine = Engine(bundle, concurrent=False, static_shapes=False)
    answers = greedy_answers(engine, prompts, 24 if pair != "demo" else 32)
    simulated = replay(engine, answers, SpeculativeConfig(algorithm="auto"))
    session = engine.session()
    for answer, sim in zip(answers, simulated):
        calls = calls_of(session)
        real = session.generate(answer.prompt, answer.config, SpeculativeConfig(clock=False, pool_scope=None))
        assert real.token_ids == answer.tokens == sim.result.token_ids
        assert [(c.sequence_length, c.proposed) for c in sim.calls] == calls
        for name in ("rounds", "draft_tokens_proposed", "draft_tokens_accepted", "suffix_tokens_proposed",
                     "suffix_tokens_accepted"):
            assert getattr(sim.result.stats, name) == getattr(real.stats, name), name
        assert sim.result.extra["algorithm"] == real.extra["algorithm"]
    assert sum(r.result.stats.draft_tokens_proposed for r in simulated) > 0  # the draft model drafted


def test_a_replayed_round_is_priced_by_the_loop_and_the_target_call():
    from edge_specdec.pairing.replay import Call, Replayed
    from edge_specdec.runtime.generate import Result, Stats

    run = Replayed(Result("", [1] * 7, Stats(new_tokens=7)), [Call(3, 2, None), Call(5, 4, 0.5), Call(9, 0, 0.25)],
                   prompt_length=3)
    # after the first round (2 tokens): two calls, 5 tokens; t(5) = 5, t(1) = 1
    assert run.seconds_per_token(lambda n: float(n)) == pytest.approx((0.5 + 5 + 0.25 + 1) / 5)
    assert run.target_sizes() == {5, 1}


def prediction(*speedups):
    return Prediction(list(speedups), 1, 0, 0, 0, 0, 1)


def test_ranking_marks_candidates_within_the_noise_as_a_tie():
    ranked = rank({"slow": prediction(1.0, 1.0, 1.0, 1.0), "a": prediction(1.50, 1.60, 1.40, 1.55),
                   "b": prediction(1.52, 1.58, 1.41, 1.50), "none": prediction(None)})
    assert [(r["name"], r["place"], r["tie"]) for r in ranked] == [
        ("b", 1, True), ("a", 1, True), ("slow", 3, False), ("none", None, False)] or \
        [(r["name"], r["place"], r["tie"]) for r in ranked] == [
        ("a", 1, True), ("b", 1, True), ("slow", 3, False), ("none", None, False)]
    assert not within_noise([2.0, 2.1, 1.9, 2.0], [1.0, 1.0, 1.0, 1.0])
    assert within_noise([1.05, 1.0], [1.0, 1.0])  # 2.5 % apart: within the simulation's margin
    # free copies against the target alone on the real pair: ahead on every prompt, by very different amounts from
    # one prompt to the next; that spread is the prompts', not noise (the band of run --compare called it a tie)
    assert not within_noise([1.04, 1.09, 1.32, 1.58, 1.0, 1.08], [1.0] * 6)


def test_the_cheap_look_reads_two_tokenizer_json_files(model_dir):
    target = classify(str(model_dir("qwen2-bytelevel")), "target")[0]
    same = classify(str(model_dir("qwen2-bytelevel-small")), "draft")[0]
    other = classify(str(model_dir("llama-metaspace")), "draft")[0]
    t = read_vocabulary(target)
    assert relate(t, read_vocabulary(same), "def f():")["relation"] == "identical"
    v = relate(t, read_vocabulary(other), "def fib(n): return n")
    assert v["relation"] == "heterogeneous"
    assert 0 < v["shared_share"] < 1 and 0 < v["text_share"] <= 1 and 0 < v["draft_share"] <= 1
    c = look(target, t, other, "def fib(n): return n")
    assert c.auto["greedy"] == "slem" and c.auto["sampled"] in ("tli", "slem") and c.weights_bytes > 0


def test_an_unusable_candidate_gets_one_line_with_the_reason_and_the_fix(model_dir, tmp_path):
    folder = tmp_path / "odd"
    shutil.copytree(model_dir("qwen2-bytelevel-small"), folder)
    config = json.loads((folder / "config.json").read_text())
    config["model_type"] = "no-such-architecture"
    (folder / "config.json").write_text(json.dumps(config))
    line = admission(classify(str(folder), "draft")[0])
    assert "no-such-architecture" in line and "\n" not in line
    assert "supported architecture" in line


@pytest.mark.slow
def test_pair_ranks_simulates_and_exports_the_best(model_dir, bundle_dir, tmp_path):
    drafts = tmp_path / "drafts"
    drafts.mkdir()
    for name in ("qwen2-bytelevel-small", "llama-metaspace", "gpt2-prefixspace"):
        shutil.copytree(model_dir(name), drafts / name)
    out = tmp_path / "best"
    result = run_cli("pair", str(bundle_dir(*SAME_VOCAB)), str(drafts), "--top", "1", "--prompts",
                     str(_prompts(tmp_path)), "--max-new-tokens", "16", "--export", str(out), "--json",
                     "--target-device", "CPU", "--draft-device", "CPU", timeout=900)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    names = [row["name"] for row in report["candidates"]]
    assert {NO_DRAFT, FREE_DRAFTS, "qwen2-bytelevel-small", "llama-metaspace", "gpt2-prefixspace"} <= set(names)
    rows = {row["name"]: row for row in report["candidates"]}
    assert rows[NO_DRAFT]["prediction"]["speedup"] == pytest.approx(1.0)
    simulated = [row for row in report["candidates"] if row["simulated"]]
    # no draft, free drafts, and the best draft by the cheap look: one of the identical vocabulary (the one in
    # the folder, or the target bundle's own)
    assert len(simulated) == 3
    best_look = next(row for row in simulated if row["source"])
    assert best_look["relation"] == "identical" and best_look["algorithm"]["greedy"] == "standard"
    assert rows["llama-metaspace"]["why_not_simulated"] and rows["gpt2-prefixspace"]["why_not_simulated"]
    assert report["best"] in {row["name"] for row in simulated}
    assert (out / "manifest.json").is_file() and report["exported"] == str(out)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".best.")]  # no work folder left
    assert "simulating" in result.stderr  # progress on stderr


def _prompts(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text("\n".join(p.replace("\n", "\\n") for p in PROMPTS))
    return path


def test_pair_settings_refuse_what_they_cannot_do():
    with pytest.raises(Exception, match="task"):
        PairSettings(task="poetry")
    with pytest.raises(Exception, match="max_new_tokens"):
        PairSettings(max_new_tokens=1)


def test_find_pair_refuses_an_unknown_source(tmp_path):
    with pytest.raises(Exception, match="no such file or folder"):
        find_pair(str(tmp_path / "nothing"), [])


def test_the_look_reports_every_candidate_and_refuses_a_broken_ir_in_one_line(model_dir, bundle_dir, tmp_path):
    from edge_specdec.cli.pair import describe

    drafts = tmp_path / "drafts"
    drafts.mkdir()
    shutil.copytree(model_dir("llama-metaspace"), drafts / "llama")
    shutil.copytree(bundle_dir(*OTHER_VOCAB) / "draft", drafts / "ir-without-config")
    (drafts / "ir-without-config" / "config.json").unlink()
    (drafts / "notes.txt").write_text("not a model")
    report = find_pair(str(model_dir("qwen2-bytelevel")), [str(drafts), str(bundle_dir(*SAME_VOCAB))],
                       PairSettings(look_only=True, top=1))
    json.dumps(report)  # JSON-ready
    assert set(report) >= {"target", "prompts", "task", "max_new_tokens", "candidates", "costs", "best", "sampled"}
    rows = {row["name"]: row for row in report["candidates"]}
    assert set(rows) == {NO_DRAFT, FREE_DRAFTS, "llama", "ir-without-config", SAME_VOCAB_BUNDLE(bundle_dir)}
    for row in rows.values():
        assert set(row) >= {"name", "source", "kind", "relation", "vocabulary", "algorithm", "weights_bytes",
                            "admitted", "refused", "simulated", "place", "tie"}
        assert not row["simulated"]
    broken = rows["ir-without-config"]
    assert not broken["admitted"] and "config.json" in broken["refused"] and "\n" not in broken["refused"]
    assert rows[SAME_VOCAB_BUNDLE(bundle_dir)]["relation"] == "identical"
    assert rows[SAME_VOCAB_BUNDLE(bundle_dir)]["cheap_place"] == 1  # the identical vocabulary first
    assert rows["llama"]["algorithm"]["greedy"] == "slem" and rows["llama"]["cheap_place"] is None
    text = describe(report)
    assert "not usable: --draft" in text and "nothing converted" in text


def SAME_VOCAB_BUNDLE(bundle_dir):
    return bundle_dir(*SAME_VOCAB).name


def test_clock_free_drafting_has_no_guard():
    with pytest.raises(Exception, match="clock"):
        SpeculativeConfig(clock=False, guard=True)
    assert not SpeculativeConfig(clock=False).clock


def test_the_timings_own_noise_makes_a_tie_too():
    from edge_specdec.pairing.rank import timing_noise

    a, b = [1.32, 1.33, 1.31, 1.32], [1.25, 1.26, 1.24, 1.25]  # 5.6 % apart: more than the simulation's margin
    assert not within_noise(a, b)
    assert within_noise(a, b, floor=timing_noise({1: [1.0, 0.9, 1.1, 1.0, 0.9, 1.1]}))
    assert timing_noise({1: [1.0] * 6}) == 0.0


def test_a_draft_larger_than_its_target_is_refused_by_the_look(model_dir):
    target = classify(str(model_dir("qwen2-bytelevel-small")), "target")[0]
    larger = classify(str(model_dir("qwen2-bytelevel")), "draft")[0]
    c = look(target, read_vocabulary(target), larger, "def f():")
    assert c.refused.startswith("the draft (") and "not smaller than the target" in c.refused


@pytest.mark.slow
def test_a_named_candidate_is_exported_from_a_hugging_face_target(model_dir, tmp_path):
    lines = []
    out = tmp_path / "chosen"
    report = find_pair(str(model_dir("qwen2-bytelevel")),
                       [str(model_dir("qwen2-bytelevel-small")), str(model_dir("llama-metaspace"))],
                       PairSettings(top=1, prompts=tuple(PROMPTS), max_new_tokens=12, export=out,
                                    export_candidate="model-llama-metaspace",
                                    engine={"target_device": "CPU", "draft_device": "CPU"}),
                       say=lines.append)
    rows = {row["name"]: row for row in report["candidates"]}
    # the named draft is simulated beside the best by the look, though it is below --top
    assert rows["model-llama-metaspace"]["simulated"] and rows["model-qwen2-bytelevel-small"]["simulated"]
    assert rows["model-llama-metaspace"]["algorithm"] == {"greedy": "slem", "sampled": "tli"} or \
        rows["model-llama-metaspace"]["algorithm"]["greedy"] == "slem"
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["vocabulary"]["relation"] == "heterogeneous" and report["exported"] == str(out)
    assert any("exporting the target" in line for line in lines)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chosen"]  # nothing else left beside it


def test_the_look_reads_a_gguf_header_as_its_tokenizer_json(tokenizer_dir, tmp_path):
    from edge_specdec.pairing.candidates import Source, gguf_vocabulary
    from edge_specdec.export.token_bytes import token_table
    from support import write_vocab_gguf

    folder = tokenizer_dir("bytelevel")
    from_gguf = gguf_vocabulary(write_vocab_gguf(folder, tmp_path / "v.gguf", "gpt-2"))
    table = token_table(folder)
    assert from_gguf.pieces == table.pieces and from_gguf.style == "bytelevel"
    source = classify(str(tmp_path / "v.gguf"), "draft")[0]
    assert isinstance(source, Source) and source.kind == "gguf"
    assert relate(read_vocabulary(source), from_gguf, "x")["relation"] == "identical"


def test_an_export_folder_that_holds_other_files_is_refused_before_anything_runs(bundle_dir, tmp_path):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(Exception, match="not an edge-specdec bundle"):
        find_pair(str(bundle_dir(*SAME_VOCAB)), [], PairSettings(export=out))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]


def test_chat_prompts_are_rendered_with_the_targets_template(monkeypatch):
    from edge_specdec.demo import DEMO_BUNDLE
    from edge_specdec.pairing import replay as replay_module

    seen = []
    real = replay_module.greedy_answers

    def spy(engine, prompts, max_new_tokens, say=lambda _: None):
        seen.extend(prompts)
        return real(engine, prompts, max_new_tokens, say)
    monkeypatch.setattr(replay_module, "greedy_answers", spy)
    report = find_pair(str(DEMO_BUNDLE), [], PairSettings(task="chat", top=0, max_new_tokens=6))
    assert report["task"] == "chat" and len(seen) == report["prompts"] == 6
    assert all(isinstance(p, list) and all(isinstance(t, int) for t in p) for p in seen)  # token ids, rendered
    assert {row["name"] for row in report["candidates"] if row["simulated"]} == {NO_DRAFT, FREE_DRAFTS}
    assert [row["name"] for row in report["candidates"] if row["source"]] == ["demo_bundle"]  # its own draft


def accepted_per_round(stats) -> float:
    """A run's tokens accepted per round: the draft model's and the free copies'."""
    return (stats.draft_tokens_accepted + stats.suffix_tokens_accepted + stats.pool_tokens_accepted) / stats.rounds


@pytest.mark.parametrize("confidence", [None, 0.0], ids=["confidence-stop", "full-rounds"])
@pytest.mark.parametrize("pair, algorithm", [(SAME_VOCAB, "standard"), (OTHER_VOCAB, "tli")],
                         ids=["same-vocabulary", "other-vocabulary"])
def test_simulated_sampled_rounds_accept_as_real_sampled_runs_do(bundle_dir, pair, algorithm, confidence):
    """The simulated acceptances per round (the target's sampled answers replayed, sampled.py) against real sampled
    runs of the same prompts and settings, with the draft's default confidence stop and with full rounds of 8
    drafted tokens: their means agree within four standard errors of their difference. (Drafting freely against
    the replayed answer, without the acceptances' law, accepts nothing here.)"""
    import dataclasses
    import statistics

    from edge_specdec.pairing.sampled import Sampling, sampled_answers

    engine = Engine(bundle_dir(*pair), concurrent=False, static_shapes=False)
    session = engine.session()
    speculative = SpeculativeConfig(algorithm="auto", confidence=confidence, num_assistant_tokens=8)
    simulated, real = [], []
    for repeat in range(12):
        answers = sampled_answers(engine, PROMPTS, 16, Sampling(temperature=1.0, seed=100 * repeat))
        assert engine.resolve_algorithm("auto", answers[0].config) == algorithm
        simulated += [accepted_per_round(r.result.stats) for r in replay(engine, answers, speculative)]
        for answer in answers:  # a real run on another seed: the same law, another sample
            config = dataclasses.replace(answer.config, seed=answer.config.seed + 50)
            result = session.generate(answer.prompt, config, dataclasses.replace(speculative, clock=False,
                                                                                  pool_scope=None))
            real.append(accepted_per_round(result.stats))
    assert statistics.fmean(real) > 0.2  # the real runs accept drafted tokens: there is something to predict
    gap = abs(statistics.fmean(simulated) - statistics.fmean(real))
    error = (statistics.variance(simulated) / len(simulated) + statistics.variance(real) / len(real)) ** 0.5
    assert gap <= 4 * error, (statistics.fmean(simulated), statistics.fmean(real), error)


def test_pair_predicts_sampled_decoding_with_autos_sampled_algorithm(bundle_dir):
    from edge_specdec.cli.pair import SAMPLING_DEFAULTS, describe
    from edge_specdec.pairing import Sampling

    lines = []
    report = find_pair(str(bundle_dir(*OTHER_VOCAB)), [], PairSettings(
        top=1, prompts=tuple(PROMPTS), max_new_tokens=12, sampling=Sampling(temperature=0.7, seed=3),
        engine={"target_device": "CPU", "draft_device": "CPU"}), say=lines.append)
    assert report["sampling"] == {"temperature": 0.7, "top_p": 1.0, "seed": 3}
    assert report["decoding"].startswith("sampled") and report["sampled"].startswith("simulated")
    drafted = next(row for row in report["candidates"] if row["source"])
    assert drafted["simulated"] and drafted["algorithm"]["sampled"] == "tli"
    assert drafted["prediction"]["speedup"] > 0 and drafted["prediction"]["drafted"] > 0
    assert any("sampled answers" in line for line in lines) and any("(tli)" in line for line in lines)
    assert "temperature 0.7" in describe(report).splitlines()[0]
    assert SAMPLING_DEFAULTS == (Sampling().temperature, Sampling().top_p, Sampling().seed)


def test_sampling_settings_refuse_what_they_cannot_do():
    from edge_specdec.pairing import Sampling

    with pytest.raises(Exception, match="temperature"):
        Sampling(temperature=0)
    with pytest.raises(Exception, match="top_p"):
        Sampling(top_p=1.5)
    with pytest.raises(Exception, match="sampling"):
        PairSettings(sampling={"temperature": 0.7})


@pytest.mark.slow  # `pair` end to end on the demo (the entry's fields have fast tests of their own)
def test_pairs_result_becomes_a_catalog_entry_that_pairs_prints(capsys, monkeypatch):
    import shlex
    import sys

    from edge_specdec.catalog import describe_pairs, entry_problem
    from edge_specdec.cli import main
    from edge_specdec.demo import DEMO_BUNDLE
    from edge_specdec.pairing import catalog_entry

    argv = ["pair", str(DEMO_BUNDLE), "--top", "1", "--max-new-tokens", "8", "--catalog-entry"]
    monkeypatch.setattr(sys, "argv", ["/somewhere/bin/edge-specdec", *argv])
    assert main(argv) == 0
    entries = json.loads(capsys.readouterr().out)
    (name, entry), = entries.items()
    assert name == "demo_bundle+demo_bundle" and entry_problem(entry) is None  # valid as the catalog reads it
    assert entry["target"] == entry["draft"] == str(DEMO_BUNDLE)
    assert (entry["target_weights"], entry["draft_weights"]) == ("int4", "int8")  # the demo's manifest
    assert entry["devices"]["target"] == "CPU" and entry["algorithm"] in ("slem", "tli", "standard")
    run, = entry["measured"]
    assert run["command"] == shlex.join(["edge-specdec", *argv])  # the command line as it was typed
    assert "predicted" in run["summary"] and "not a timed run" in run["summary"] and run["date"][:4].isdigit()
    assert "cores" in run["machine"]
    printed = describe_pairs(entries)
    assert f"machine: {run['machine']}; date: {run['date']}" in printed and f"command: {run['command']}" in printed
    with pytest.raises(Exception, match="without --look"):
        catalog_entry({"look_only": True, "candidates": []}, command="x")
    with pytest.raises(Exception, match="no draft model"):
        catalog_entry({"machine": {}, "candidates": [{"name": NO_DRAFT, "source": None, "prediction": {}}]},
                      command="x")


@pytest.mark.parametrize("given,expected", [({}, "off"), ({"long_prompt_precision": "auto"}, "off"),
                                            ({"long_prompt_precision": "bf16"}, "bf16")])
def test_pair_loads_no_long_prompt_prefill_copy_unless_asked(monkeypatch, tmp_path, given, expected):
    """Its replay prices decode rounds; auto's bf16 copy would hold memory in the base and each candidate's engine."""
    import edge_specdec.runtime as runtime
    from edge_specdec.pairing import PairSettings, _simulate

    configs = []

    class Stop(Exception):
        pass

    def engine(bundle, config, core=None):
        configs.append(config)
        raise Stop
    monkeypatch.setattr(runtime, "Engine", engine)
    with pytest.raises(Stop):
        _simulate(tmp_path, [], ["def f(x):"], PairSettings(engine=given), lambda _: None, None)
    assert [c.long_prompt_precision for c in configs] == [expected]
