"""The NPU path against a faked NPU that behaves as OpenVINO's NPU LLM pipeline (NPUW) does, and AUTO's measured
draft device.

`FakeNpuCore` answers for a machine with a CPU and an NPU. A model compiled for "NPU" runs on the CPU under an
emulation of NPUW's infer request (openvinotoolkit/openvino, src/plugins/intel_npu/src/plugin/npuw/
llm_infer_request.cpp): it records the properties, treats a call of more than one token at the first position
id as a new prompt (prefill, refused past NPUW_LLM_MAX_PROMPT_LEN, returning the last token's logits only),
trims its cache to the first position id of any other call, refuses a generate call of more tokens than
NPUW_LLM_MAX_GENERATION_TOKEN_LEN and a cache past its size, and takes no beam_idx. What OpenVINO GenAI's NPU
speculative decoding sends (speculative_decoding_npu.cpp) is what these tests ask of ours.
"""
from __future__ import annotations

import re
import time

import numpy as np
import openvino as ov
import pytest

from edge_specdec.bundle import load_bundle
from edge_specdec.errors import EdgeSpecdecError
from edge_specdec.runtime.devices import DeviceError, DeviceInfo, Placement, draft_candidates, measure_draft_device
from edge_specdec.runtime.npu import NpuPromptTooLongError
from edge_specdec.runtime.pipeline import Pipeline
from edge_specdec.runtime.measurements import MeasurementCache
from edge_specdec.runtime.sampling import GenerationConfig
from edge_specdec.runtime.session import ContextOverflowError, open_model

HETERO = ("qwen2-bytelevel", "llama-metaspace")
SAME_VOCAB = ("qwen2-bytelevel", "qwen2-bytelevel-small")
PROMPT = "def add(a, b):\n    return a + b\n\ndef mul(a, b):\n"


def rounded(value: int, multiple: int) -> int:
    return (value + multiple - 1) // multiple * multiple


class FakeNpuwRequest:
    """NPUW's LLM infer request, emulated on a CPU request of the stateful model."""

    def __init__(self, inner: ov.InferRequest, config: dict, log: list, delay: float):
        self.inner, self.log, self.delay = inner, log, delay
        self.max_prompt = rounded(int(config["NPUW_LLM_MAX_PROMPT_LEN"]), 64)
        self.total = self.max_prompt + rounded(int(config["NPUW_LLM_MIN_RESPONSE_LEN"]), 64)
        tokens = int(config.get("NPUW_LLM_MAX_GENERATION_TOKEN_LEN", 1))
        self.generation = tokens if tokens == 1 else rounded(tokens, 8)
        self.first_position, self.stored, self.logits = None, 0, None

    def infer(self, inputs: dict) -> None:
        assert set(inputs) == {"input_ids", "attention_mask", "position_ids"}, sorted(inputs)  # no beam_idx
        ids, mask, pos = (np.asarray(inputs[k]) for k in ("input_ids", "attention_mask", "position_ids"))
        n, start = ids.shape[1], int(pos[0, 0])
        assert mask.shape == (1, start + n) and mask.all(), "the mask covers the whole context with ones"
        assert (pos[0] == np.arange(start, start + n)).all()
        if self.first_position is None:
            self.first_position = start
        if n > 1 and start == self.first_position:
            if n > self.max_prompt:
                raise RuntimeError(f'Input prompt is longer than configured "NPUW_LLM_MAX_PROMPT_LEN": {self.max_prompt}')
            kind, self.stored = "prefill", 0
            self.inner.reset_state()
        else:
            assert start <= self.stored, f"position {start} past the {self.stored} tokens stored"
            if start < self.stored:  # trim_kvcache_for_speculative_decoding
                for state in self.inner.query_state():
                    state.state = ov.Tensor(np.ascontiguousarray(state.state.data[:, :, :start, :]))
            kind, trimmed, self.stored = "generate", self.stored - start, start
            if n > self.generation:
                raise RuntimeError('Input prompt length is greater than output "NPUW_LLM_MAX_GENERATION_TOKEN_LEN"')
            if self.stored + n > self.total:
                raise RuntimeError("KV-Cache is full.")
        time.sleep(self.delay)
        self.inner.infer({"input_ids": ids, "attention_mask": np.ones((1, self.stored + n), np.int64),
                          "position_ids": pos, "beam_idx": np.zeros(1, np.int32)})
        self.stored += n
        logits = self.inner.get_tensor("logits").data
        self.logits = ov.Tensor(np.ascontiguousarray(logits[:, -1:] if kind == "prefill" else logits))
        self.log.append((kind, start, n, trimmed if kind == "generate" else 0))

    def get_tensor(self, name: str) -> ov.Tensor:
        assert name == "logits"
        return self.logits

    def reset_state(self) -> None:
        self.inner.reset_state()


class FakeNpuCompiled:
    def __init__(self, compiled: ov.CompiledModel, config: dict, log: list, delay: float):
        self.compiled, self.config, self.log, self.delay = compiled, config, log, delay

    def create_infer_request(self) -> FakeNpuwRequest:
        return FakeNpuwRequest(self.compiled.create_infer_request(), self.config, self.log, self.delay)


class FakeNpuCore:
    """An ov.Core on a machine with a CPU and an NPU; the NPU is the CPU under NPUW's rules, `delay` s slower a call."""

    def __init__(self, delay: float = 0.0):
        self.core, self.delay = ov.Core(), delay
        self.npu_models: list[tuple[ov.Model, dict]] = []  # what was compiled for the NPU, with its properties
        self.calls: list[tuple] = []  # (kind, first position, tokens, trimmed) of every NPU call

    @property
    def available_devices(self) -> list[str]:
        return ["CPU", "NPU"]

    def compile_model(self, model, device="CPU", config=None):
        if device != "NPU":
            return self.core.compile_model(model, device, config or {})
        assert not any(op.get_type_name() == "PagedAttentionExtension" for op in model.get_ops())
        self.npu_models.append((model, dict(config)))
        cpu = self.core.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32",
                                                  "DYNAMIC_QUANTIZATION_GROUP_SIZE": "0"})
        return FakeNpuCompiled(cpu, dict(config), self.calls, self.delay)

    def __getattr__(self, name):
        return getattr(self.core, name)


def draft_xml(bundle_dir):
    return load_bundle(bundle_dir(*HETERO)).draft.model_xml


def test_npu_compile_properties_are_genai_s(bundle_dir):
    core = FakeNpuCore()
    pipe = Pipeline(bundle_dir(*HETERO), target_device="CPU", draft_device="NPU", core=core, cache_dir="off")
    assert pipe.placement.draft == "NPU" and pipe.draft_model.rollback_method == "npuw"
    (model, config), = core.npu_models
    assert {k: config[k] for k in ("NPU_USE_NPUW", "NPUW_LLM", "NPUW_LLM_BATCH_DIM", "NPUW_LLM_SEQ_LEN_DIM",
                                   "NPUW_LLM_MAX_PROMPT_LEN", "NPUW_LLM_MAX_GENERATION_TOKEN_LEN")} == {
        "NPU_USE_NPUW": "YES", "NPUW_LLM": "YES", "NPUW_LLM_BATCH_DIM": 0, "NPUW_LLM_SEQ_LEN_DIM": 2,
        "NPUW_LLM_MAX_PROMPT_LEN": 1024, "NPUW_LLM_MAX_GENERATION_TOKEN_LEN": 1}
    assert config["NPUW_LLM_MIN_RESPONSE_LEN"] > 0
    # the output layer is left whole for NPUW (no vocabulary cut), and the stateful model keeps its cache inputs
    draft = load_bundle(bundle_dir(*HETERO)).draft
    assert model.output("logits").get_partial_shape()[-1].get_length() == draft.info["logits_size"]
    assert {i.get_any_name() for i in model.inputs} >= {"input_ids", "attention_mask", "position_ids"}


SELF_DRAFT = ("qwen2-bytelevel", "qwen2-bytelevel")  # the target drafting for itself: its drafts are right


@pytest.mark.slow
@pytest.mark.parametrize("pair, algorithm", [(HETERO, "slem"), (HETERO, "tli"), (SELF_DRAFT, "standard")])
def test_a_draft_on_the_npu_is_lossless_and_calls_it_as_npuw_wants(bundle_dir, pair, algorithm):
    config = GenerationConfig(max_new_tokens=40)
    on_cpu = Pipeline(bundle_dir(*pair), target_device="CPU", draft_device="CPU", cache_dir="off")
    prompts = [PROMPT, PROMPT, "Once upon a time"]  # the same prompt again reuses the draft's cache; another not
    # the draft model drafts every round, and no pool: both pipelines see the same rounds
    options = dict(lookup=False, pool_scope=None)
    expected = [on_cpu.generate(p, config, algorithm="none", **options).token_ids for p in prompts]
    cpu_draft = [on_cpu.generate(p, config, algorithm=algorithm, **options).stats for p in prompts]
    core = FakeNpuCore()
    pipe = Pipeline(bundle_dir(*pair), target_device="CPU", draft_device="NPU", core=core, cache_dir="off")
    for prompt, want, cpu in zip(prompts, expected, cpu_draft):
        result = pipe.generate(prompt, config, algorithm=algorithm, **options)
        assert result.token_ids == want and result.exact
        # the NPU draft proposes what the same draft proposes on the CPU
        assert (result.stats.draft_tokens_proposed, result.stats.draft_tokens_accepted) == (
            cpu.draft_tokens_proposed, cpu.draft_tokens_accepted)
        if pair == SELF_DRAFT:
            assert result.stats.draft_tokens_accepted > result.stats.draft_tokens_proposed / 2
    kinds = [call[0] for call in core.calls]
    assert kinds.count("prefill") == 2 and kinds[0] == "prefill"  # the first and the third prompt
    assert all(n == 1 for kind, _, n, _ in core.calls if kind == "generate")  # one token a call, as GenAI's draft
    assert any(trimmed > 0 for *_, trimmed in core.calls)  # rejected tokens were rolled back by position ids


def test_npu_session_rows_follow_a_cpu_session(bundle_dir):
    """Prefill, a sync of several tokens (several one-token calls), a rollback and a step give the logits a CPU
    session computes for the same tokens, up to float noise."""
    xml, core = draft_xml(bundle_dir), FakeNpuCore()
    npu = open_model(xml, "NPU", core=core, block_invariant=False).session()
    cpu = open_model(xml, "CPU", rollback="masked", block_invariant=False).session()
    rng = np.random.default_rng(1)
    prompt, more, long = (rng.integers(3, 300, n).tolist() for n in (9, 4, 14))
    for session in (npu, cpu):
        session.reset()
    # the long stretch after a kept prefix is prefilled again with the whole context, the rest stepped
    steps = [(prompt, 1), (more, 3), ("rollback", 2), (more[2:3], 1), (prompt[:1], 1), (long, 2), (more, 4)]
    for tokens, rows in steps:
        if tokens == "rollback":
            npu.rollback(rows), cpu.rollback(rows)
            continue
        got, want = npu.feed(tokens, rows=rows), cpu.feed(tokens, rows=rows)
        assert got.shape == want.shape == (rows, npu.vocab_size)
        np.testing.assert_allclose(got, want, atol=2e-4)
    assert npu.tokens == cpu.tokens
    assert [call[:3] for call in core.calls if call[0] == "prefill"] == [("prefill", 0, 9), ("prefill", 0, 26)]


def test_a_prompt_longer_than_the_npu_was_compiled_for_names_the_fix(bundle_dir):
    """Without a draft window (draft_window=0) the NPU draft is fed the whole prompt, which it refuses."""
    pipe = Pipeline(bundle_dir(*HETERO), target_device="CPU", draft_device="NPU", core=FakeNpuCore(),
                    cache_dir="off", npu_max_prompt=64)
    with pytest.raises(NpuPromptTooLongError) as caught:
        pipe.generate(PROMPT * 12, GenerationConfig(max_new_tokens=4), algorithm="slem", lookup=False,
                      draft_window=0)
    message = str(caught.value)
    asked, bound, suggested = (int(x) for x in re.search(
        r"prompt is (\d+) tokens .* at most (\d+) .* --npu-max-prompt (\d+)", message).groups())
    assert bound == 64 and asked > bound and suggested >= asked and "NPUW_LLM_MAX_PROMPT_LEN" in message


@pytest.mark.parametrize("pair, algorithm", [(HETERO, "slem"), (SELF_DRAFT, "standard")])
def test_by_default_an_npu_draft_reads_a_window_within_the_prompt_it_was_compiled_for(bundle_dir, pair, algorithm):
    """A prompt longer than npu_max_prompt: the draft's window is no longer than that, so the draft drafts (its
    prefill and its re-prefills fit) and the output is the target alone's."""
    pipe = Pipeline(bundle_dir(*pair), target_device="CPU", draft_device="NPU", core=FakeNpuCore(),
                    cache_dir="off", npu_max_prompt=64)
    config = GenerationConfig(max_new_tokens=40, logprobs=True)
    alone = pipe.generate(PROMPT * 12, config, algorithm="none")
    run = pipe.generate(PROMPT * 12, config, algorithm=algorithm, lookup=False, guard=False, confidence=0.0)
    assert run.token_ids == alone.token_ids and [lp.logprob for lp in run.logprobs] == [
        lp.logprob for lp in alone.logprobs]
    assert run.stats.draft_tokens_proposed > 0 and run.extra["draft_window"]["size"] == 64
    assert run.extra["draft_window"]["slides"] >= 1


def test_a_full_npu_cache_is_a_context_overflow(bundle_dir):
    core = FakeNpuCore()
    session = open_model(draft_xml(bundle_dir), "NPU", core=core, block_invariant=False, npu_max_prompt=64,
                         config={"NPUW_LLM_MIN_RESPONSE_LEN": 64}).session()
    assert session.max_context == 128
    session.feed(list(range(3, 63)), rows=1)
    with pytest.raises(ContextOverflowError):
        for token in range(3, 200):
            session.feed([token])
    assert session.length == 128 and core.calls[-1][1] + core.calls[-1][2] == 128  # never past NPUW's cache


def test_rollbacks_that_npuw_does_not_own_are_refused(bundle_dir):
    with pytest.raises(EdgeSpecdecError, match="npuw"):
        open_model(draft_xml(bundle_dir), "NPU", core=FakeNpuCore(), rollback="masked", block_invariant=False)
    with pytest.raises(EdgeSpecdecError, match="npuw"):
        open_model(draft_xml(bundle_dir), "CPU", rollback="npuw", block_invariant=False)


def test_an_asymmetric_int4_draft_is_refused_before_the_npu_compiles_it(bundle_dir):
    bundle = load_bundle(bundle_dir(*HETERO))
    bundle.draft.info["weights"] = {**bundle.draft.info["weights"], "format": "int4", "sym": False}
    core = FakeNpuCore()
    with pytest.raises(DeviceError, match="--draft-preset npu"):
        Pipeline(bundle, target_device="CPU", draft_device="NPU", core=core, cache_dir="off")
    assert core.npu_models == []


def test_auto_keeps_a_slow_npu_s_draft_on_the_cpu_and_remembers(bundle_dir, tmp_path):
    core = FakeNpuCore(delay=0.05)
    pipe = Pipeline(bundle_dir(*HETERO), draft_device="AUTO", core=core, cache_dir=tmp_path)
    assert pipe.placement.draft == "CPU"
    line = pipe.placement.describe()
    assert "kept on the CPU" in line and "NPU" in line and "measured now" in line
    assert len(core.npu_models) == 1  # compiled once, to be timed
    again = FakeNpuCore(delay=0.05)
    pipe = Pipeline(bundle_dir(*HETERO), draft_device="AUTO", core=again, cache_dir=tmp_path)
    assert pipe.placement.draft == "CPU" and "measured before" in pipe.placement.describe()
    assert again.npu_models == []  # decided from the remembered timings, without compiling for the NPU


DEVICES = [DeviceInfo("CPU"), DeviceInfo("GPU.0", "integrated"), DeviceInfo("NPU")]


@pytest.mark.parametrize("timings, chosen", [({"GPU.0": 4.0, "NPU": 6.0, "CPU": 10.0}, "GPU.0"),
                                             ({"GPU.0": 14.0, "NPU": 6.0, "CPU": 10.0}, "NPU"),
                                             ({"GPU.0": 14.0, "NPU": 33.0, "CPU": 10.0}, "CPU")])
def test_auto_takes_the_fastest_measured_draft_device(timings, chosen):
    measured = []

    def step_ms(device):
        measured.append(device)
        return timings[device]
    plan = MeasurementCache(None, {})
    start = Placement("CPU", "GPU.0", ["target: no discrete GPU", "draft: integrated GPU found"])
    placement = measure_draft_device(start, DEVICES, step_ms, plan)
    assert placement.draft == chosen and sorted(measured) == sorted(timings)
    assert placement.reasons[0] == "target: no discrete GPU" and len(placement.reasons) == 2
    assert f"{timings['NPU']:.1f} ms" in placement.describe()
    measured.clear()
    assert measure_draft_device(start, DEVICES, step_ms, plan).draft == chosen and measured == []


def test_draft_candidates_leave_the_target_s_device_out():
    devices = DEVICES + [DeviceInfo("GPU.1", "discrete")]
    assert draft_candidates(devices, "GPU.1") == ["GPU.0", "NPU", "CPU"]
    assert draft_candidates(devices, "CPU") == ["GPU.0", "NPU", "GPU.1", "CPU"]
    assert draft_candidates([DeviceInfo("CPU")], "CPU") == ["CPU"]


def test_check_times_the_draft_on_every_device_and_recommends_the_fastest(bundle_dir):
    from edge_specdec.check import run_check

    report = run_check(bundle_dir(*HETERO), core=FakeNpuCore(delay=0.03), cache_dir="off", max_new_tokens=8)
    assert report["ok"] and report["placement"]["draft"] == "CPU"
    steps = report["costs"]["draft_step_ms_by_device"]
    assert set(steps) == {"NPU", "CPU"} and steps["NPU"] > 30 > steps["CPU"]
    assert report["prediction"]["draft_device"] == "CPU"


@pytest.mark.slow
def test_the_npu_preset_exports_symmetric_int8_that_the_npu_path_takes(model_dir, tmp_path):
    from edge_specdec.cli import main

    out = tmp_path / "npu-bundle"
    assert main(["export", "--target", str(model_dir(HETERO[0])), "--draft", str(model_dir(HETERO[1])),
                 "--out", str(out), "--draft-preset", "npu", "--quiet"]) == 0
    weights = load_bundle(out).draft.info["weights"]
    assert weights["format"] == "int8" and weights["sym"] and weights["preset"] == "npu"
    assert weights["elements_by_type"].get("i8", 0) > 0 and "u8" not in weights["elements_by_type"]  # symmetric
    core = FakeNpuCore()
    pipe = Pipeline(out, target_device="CPU", draft_device="NPU", core=core, cache_dir="off")
    assert pipe.generate(PROMPT, GenerationConfig(max_new_tokens=8), algorithm="slem").exact and core.calls


@pytest.mark.parametrize("argv, expected", [
    (["--draft-preset", "npu"], {"format": "int8", "sym": True}),
    (["--draft-preset", "npu", "--draft-weights", "int4"], {"format": "int4", "sym": True, "group_size": 128}),
    (["--draft-preset", "gpu"], {"format": "int4", "sym": False, "group_size": 128, "ratio": 1.0}),
    ([], None)])
def test_draft_presets_fill_what_the_command_line_leaves_out(argv, expected):
    import argparse

    from edge_specdec.cli import export as export_cli

    parser = argparse.ArgumentParser()
    export_cli.add_parser(parser.add_subparsers())
    args = parser.parse_args(["export", "--target", "t", "--out", "o", *argv])
    export_cli._apply_preset(args)
    export_cli._apply_pair(args)
    weights = export_cli._weights(args, "draft")
    if expected is None:  # nothing given: the export's own default (int8 for a draft it converts, an IR's own)
        assert weights is None
        return
    settings = weights.validate("draft")
    assert {k: getattr(settings, k) for k in expected} == expected
