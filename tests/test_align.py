"""edge-specdec align on the tiny fixtures: a mismatched draft learns its target's text, the new bundle is valid and
exact, a stopped align resumes, the budget and the token cap hold, bad inputs fail in one line."""
from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from edge_specdec.benchmark.prompt_file import read_prompt_file
from edge_specdec.benchmark.prompt_set import PROMPTS_FILE
from edge_specdec.bundle import load_bundle
from edge_specdec.cli import main
from edge_specdec.export.align import AlignSettings, TrainSettings, align_bundle
from edge_specdec.runtime import Engine, GenerationConfig
from support import tree_state

# The target of the tiny pairs and a draft that knows nothing of it: random weights, another tokenizer style
# (U+2581 BPE against byte-level BPE), another architecture. Its acceptance starts near zero.
TARGET, DRAFT = "qwen2-bytelevel", "llama-metaspace"
SUBJECTS = ["a list", "a string", "a file", "a dictionary", "the input", "numbers", "a queue", "a tree"]
VERBS = ["sorts", "parses", "reverses", "counts", "merges", "filters", "prints", "checks"]
INTERRUPT_AT_STEP = 3


def training_prompts(path: Path) -> Path:
    """Thirty-two plain-text prompts of our own (none of them a benchmark prompt)."""
    lines = [f"Write a function that {verb} {subject}." for verb in VERBS for subject in SUBJECTS[:4]]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def settings(prompts: Path, **changes) -> AlignSettings:
    train = TrainSettings(train_layers=2, learning_rate=3e-3, batch_tokens=512, epochs=3, soft_weight=0.5)
    base = dict(prompts=str(prompts), minutes=10, max_new_tokens=40, streams=4, eval_prompts=4, eval_tokens=24,
                train=train)
    return AlignSettings(**{**base, **changes})


def held_out_texts(count: int) -> list[str]:
    """The first prompt of each benchmark category: held-out text the tiny target (no chat template) continues."""
    return [items[0]["text"] for items in read_prompt_file(PROMPTS_FILE).values()][:count]


@pytest.fixture(scope="module")
def aligned(bundle_dir, tmp_path_factory):
    """One align run in three invocations: stopped after generation; resumed and interrupted (Ctrl-C) during
    training; resumed to the end."""
    source = bundle_dir(TARGET, DRAFT)
    root = tmp_path_factory.mktemp("align")
    prompts = training_prompts(root / "prompts.txt")
    out, work = root / "aligned", root / "work"
    runs: list[list[str]] = []

    def run(**options):
        runs.append([])
        return align_bundle(source, out, settings(prompts), work=work, progress=runs[-1].append, **options)

    def interrupt(step: int) -> None:
        if step == INTERRUPT_AT_STEP:
            raise KeyboardInterrupt

    first = run(stop_after="generate")
    data_after_generation = (work / "data.jsonl").read_bytes()
    out_after_first = out.exists()
    with pytest.raises(KeyboardInterrupt):
        run(resume=True, on_train_step=interrupt)
    out_after_second = out.exists()
    checkpoint_after_second = (work / "train" / "checkpoint.pt").is_file()
    written = run(resume=True, keep_work=True)
    return SimpleNamespace(source=source, out=out, work=work, runs=runs, first=first, written=written,
                           data_after_generation=data_after_generation, out_after_first=out_after_first,
                           out_after_second=out_after_second, checkpoint_after_second=checkpoint_after_second,
                           prompts=prompts)


def measured_acceptance(bundle: Path, prompts: list[str]) -> tuple[float, float]:
    """(acceptance, tokens per target pass) of the draft model alone (no lookup rounds), greedy, measured here."""
    engine = Engine(bundle)
    session = engine.session()
    proposed = accepted = tokens = passes = 0
    for text in prompts:
        result = session.generate(text, GenerationConfig(max_new_tokens=32), algorithm="slem", lookup=False)
        proposed += result.stats.draft_tokens_proposed
        accepted += result.stats.draft_tokens_accepted
        tokens += result.stats.new_tokens
        passes += result.stats.target_passes
    return accepted / max(1, proposed), tokens / passes


@pytest.mark.slow
def test_align_raises_acceptance_on_held_out_prompts(aligned):
    prompts = held_out_texts(6)
    before = measured_acceptance(aligned.source, prompts)
    after = measured_acceptance(aligned.out, prompts)
    assert after[0] > before[0] + 0.15, (before, after)
    assert after[1] > before[1], (before, after)
    # held out: the training text never holds a benchmark prompt
    held_out = {item["text"] for items in read_prompt_file(PROMPTS_FILE).values() for item in items}
    records = [json.loads(line) for line in (aligned.work / "data.jsonl").read_text().splitlines()]
    assert records and not any(r["prompt"] in held_out for r in records)


@pytest.mark.slow
def test_aligned_bundle_is_valid_self_contained_and_lossless(aligned):
    bundle = load_bundle(aligned.out, verify=True)
    source = load_bundle(aligned.source)
    # the target, the vocabulary map and the draft's tokenizers are the source's own files, hard-linked
    for rel in [r for r in source.manifest["files"] if r.startswith("target/")] + ["vocab_map.npz",
                                                                                   "draft/openvino_tokenizer.xml"]:
        assert os.stat(aligned.out / rel).st_ino == os.stat(aligned.source / rel).st_ino, rel
        assert bundle.manifest["files"][rel] == source.manifest["files"][rel]
    # the draft model is new, in the source's weight format, and named after the original weights
    assert (bundle.manifest["files"]["draft/openvino_model.bin"]["sha256"]
            != source.manifest["files"]["draft/openvino_model.bin"]["sha256"])
    assert bundle.draft.info["weights"]["format"] == source.draft.info["weights"]["format"]
    assert bundle.draft.info["source"] == source.draft.info["source"]
    assert bundle.vocabulary == source.vocabulary
    on_disk = {p.relative_to(aligned.out).as_posix() for p in aligned.out.rglob("*") if p.is_file()}
    assert on_disk - {"manifest.json"} == set(bundle.manifest["files"])
    # every algorithm's greedy output is the target alone's
    engine = Engine(aligned.out)
    session = engine.session()
    config = GenerationConfig(max_new_tokens=24)
    for text in held_out_texts(3) + ["def parse(", "    return x"]:
        reference = session.generate(text, config, algorithm="none").token_ids
        for name in engine.algorithms():
            assert session.generate(text, config, algorithm=name).token_ids == reference, (name, text)


@pytest.mark.slow
def test_manifest_records_data_training_and_figures(aligned):
    record = load_bundle(aligned.out).manifest["alignment"]
    lines = (aligned.work / "data.jsonl").read_text().splitlines()
    data = [json.loads(line) for line in lines]
    assert record["data"]["prompts"] == len(data) == len(aligned.prompts.read_text().splitlines())
    assert record["data"]["target_tokens"] == sum(r["target_tokens"] for r in data)
    training = record["training"]
    assert training["steps"] > INTERRUPT_AT_STEP and training["best_step"] > 0
    assert training["validation_loss_after"] < training["validation_loss_before"]
    before, after = record["evaluation"]["before"], record["evaluation"]["after"]
    assert before["prompts"] == after["prompts"] == 4
    assert after["acceptance"] > before["acceptance"]
    assert after["tokens_per_target_pass"] > before["tokens_per_target_pass"]
    assert set(record["seconds_by_stage"]) >= {"baseline", "generate", "train", "export", "evaluate"}


@pytest.mark.slow
def test_generation_records_the_targets_distribution_and_training_uses_it(aligned):
    records = [json.loads(line) for line in (aligned.work / "data.jsonl").read_text().splitlines()]
    for r in records:
        assert len(r["target_ids"]) == len(r["target_top"]) == r["target_tokens"]
        for token, (ids, logprobs) in zip(r["target_ids"], r["target_top"]):
            assert ids[0] == token and len(ids) == len(logprobs) == 8  # greedy: the most likely token
            assert logprobs == sorted(logprobs, reverse=True) and logprobs[0] <= 0
            assert 0.0 < sum(math.exp(v) for v in logprobs) <= 1.0 + 1e-3
    record = load_bundle(aligned.out).manifest["alignment"]
    training = record["training"]
    assert training["settings"]["soft_weight"] == 0.5 and "0.5 of the target's distribution" in record["method"]
    assert 0 < training["positions_with_target_distribution"] < training["loss_positions"]


@pytest.mark.slow
def test_stopped_align_resumes_where_it_stopped(aligned):
    first, second, third = aligned.runs
    assert aligned.first is None and not aligned.out_after_first and not aligned.out_after_second
    assert any("stopped after the generate stage" in m for m in first)
    assert aligned.checkpoint_after_second
    # neither resume generated again: the text is byte for byte what the first run wrote
    assert (aligned.work / "data.jsonl").read_bytes() == aligned.data_after_generation
    assert any("resuming" in m for m in second) and not any("generate:" in m for m in second + third)
    assert any(f"resuming at step {INTERRUPT_AT_STEP}" in m for m in third)
    assert aligned.written == aligned.out and (aligned.out / "manifest.json").is_file()


@pytest.mark.slow
def test_token_cap_ends_generation(bundle_dir, tmp_path):
    prompts = training_prompts(tmp_path / "prompts.txt")
    cap, streams, per_prompt = 150, 2, 40
    work = tmp_path / "work"
    align_bundle(bundle_dir(TARGET, DRAFT), tmp_path / "out", settings(prompts, tokens=cap, streams=streams,
                                                                        max_new_tokens=per_prompt,
                                                                        train=TrainSettings(soft_weight=0.0)),
                 work=work, stop_after="generate")
    data = [json.loads(line) for line in (work / "data.jsonl").read_text().splitlines()]
    # without --soft-weight, generation records the target's tokens but not its distribution
    assert all("target_top" not in r and len(r["target_ids"]) == r["target_tokens"] for r in data)
    total = sum(r["target_tokens"] for r in data)
    assert cap <= total < cap + streams * per_prompt
    assert len(data) < len(prompts.read_text().splitlines())
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_slow_probe_ends_generation_early_and_training_replans_from_its_own_rate(bundle_dir, tmp_path,
                                                                                   monkeypatch):
    """With a probed training rate so low that one pass over one answer already needs more than the budget,
    generation stops at its first finished answer (the others in flight are kept as far as they got) and training
    first plans the steps its deadline allows (one); measuring its real rate, it re-plans to its epochs. Batches of
    64 tokens: how far the answers in flight got depends on the machine's speed, and with batches of 512 three
    epochs of a short split fit in the one step the deadline allows, so the plan would not be the deadline's."""
    from edge_specdec.export.align import run as run_module
    monkeypatch.setattr(run_module, "probe_rate", lambda *args: {"fp32": 0.05, "bf16": 0.02})
    prompts = training_prompts(tmp_path / "prompts.txt")
    streams, work, messages = 3, tmp_path / "work", []
    train = dataclasses.replace(settings(prompts).train, batch_tokens=64)
    align_bundle(bundle_dir(TARGET, DRAFT), tmp_path / "out", settings(prompts, streams=streams, train=train),
                 work=work, stop_after="train", progress=messages.append)
    data = [json.loads(line) for line in (work / "data.jsonl").read_text().splitlines()]
    assert 1 <= len(data) <= streams
    assert sum(r["stop_reason"] != "stopped" for r in data) >= 1
    state = json.loads((work / "state.json").read_text())
    assert state["stages"]["plan"]["train_precision"] == "fp32"  # the faster of the two measured
    assert any("1 steps of 64 tokens, limited by the time left" in m for m in messages), messages
    assert any("re-planned from 1 to" in m for m in messages), messages
    assert state["stages"]["train"]["steps"] > 1


@pytest.mark.slow
def test_target_files_are_copied_when_they_cannot_be_linked(aligned, tmp_path, monkeypatch):
    from edge_specdec.export.align import assemble

    def no_links(src, dst):
        raise OSError(18, "Invalid cross-device link")
    monkeypatch.setattr(assemble.os, "link", no_links)
    source = load_bundle(aligned.source)
    messages = []
    dest = tmp_path / "bundle"
    built = assemble.build_bundle(source, aligned.work / "draft-hf", aligned.work / "draft-ir",
                                  assemble.weight_settings(source), {}, dest, messages.append)
    assemble.write_manifest(dest, built["manifest"], alignment={"test": True})
    assert built["linked"] == 0 and built["copied"] > 0
    assert any("copied, not hard-linked" in m for m in messages)
    rel = "target/openvino_model.bin"
    assert os.stat(dest / rel).st_ino != os.stat(aligned.source / rel).st_ino
    assert load_bundle(dest, verify=True).manifest["alignment"] == {"test": True}


def test_a_spent_budget_stops_before_generating(bundle_dir, tmp_path, capsys):
    prompts = training_prompts(tmp_path / "prompts.txt")
    bundle = bundle_dir(TARGET, DRAFT)
    capsys.readouterr()  # what building the fixtures printed
    code = main(["align", str(bundle), "--out", str(tmp_path / "out"), "--prompts",
                 str(prompts), "--minutes", "0.001", "--eval-prompts", "1", "--eval-tokens", "4", "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and "--minutes" in err[0], err
    assert not (tmp_path / "out").exists() and not (tmp_path / ".out.align-work" / "data.jsonl").exists()


def bad_inputs(tmp_path: Path, source: Path, other_model: Path) -> dict[str, tuple[list[str], str]]:
    moved = tmp_path / "moved-bundle"  # a bundle whose recorded draft source is not on this machine
    moved.mkdir()
    for path in source.rglob("*"):
        if path.is_file():
            (moved / path.relative_to(source)).parent.mkdir(parents=True, exist_ok=True)
            os.link(path, moved / path.relative_to(source))
    manifest = json.loads((source / "manifest.json").read_text())
    manifest["draft"]["source"]["given"] = str(tmp_path / "gone" / "draft")
    (moved / "manifest.json").unlink()
    (moved / "manifest.json").write_text(json.dumps(manifest))
    out = str(tmp_path / "out")
    return {
        "missing bundle": (["align", str(tmp_path / "nope"), "--out", out], "no bundle at"),
        "draft source not found": (["align", str(source), "--out", out, "--draft-source",
                                    str(tmp_path / "missing")], "--draft-source"),
        "recorded draft source gone": (["align", str(moved), "--out", out], "--draft-source PATH"),
        "a draft source that is another model": (["align", str(source), "--out", out, "--draft-source",
                                                  str(other_model)], "--draft-source"),
        "zero minutes": (["align", str(source), "--out", out, "--minutes", "0"], "--minutes 0"),
        "resume with nothing to resume": (["align", str(source), "--out", out, "--resume"], "--resume"),
        "a soft weight over 1": (["align", str(source), "--out", out, "--soft-weight", "1.5"], "--soft-weight 1.5"),
    }


@pytest.mark.parametrize("case", ["missing bundle", "draft source not found", "recorded draft source gone",
                                  "a draft source that is another model", "zero minutes",
                                  "resume with nothing to resume", "a soft weight over 1"])
def test_bad_inputs_fail_in_one_line_and_write_nothing(bundle_dir, model_dir, tmp_path, capsys, case):
    source = bundle_dir(TARGET, DRAFT)
    args, expected = bad_inputs(tmp_path, source, model_dir("gpt2-prefixspace"))[case]
    before = tree_state(tmp_path)
    capsys.readouterr()  # what building the fixtures printed
    assert main(args) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("edge-specdec: error:") and expected in err[0], err
    assert tree_state(tmp_path) == before
