"""A model on the NPU, run the way OpenVINO's NPU LLM pipeline (NPUW) expects, as OpenVINO GenAI runs it.

What NPUW does with a stateful LLM (openvinotoolkit/openvino, src/plugins/intel_npu/src/plugin/npuw/
llm_compiled_model.cpp and llm_infer_request.cpp):

- It compiles two static graphs from the model: a prefill graph for prompts of up to NPUW_LLM_MAX_PROMPT_LEN
  tokens and a generate graph for NPUW_LLM_MAX_GENERATION_TOKEN_LEN tokens (1 by default; other values are
  rounded up to a multiple of 8, and the prompt and response lengths to multiples of 64). The KV cache it owns
  holds MAX_PROMPT_LEN + MIN_RESPONSE_LEN tokens; a call past that fails.
- A call of more than one token whose first position id is the first call's (0) is a new prompt: prefill. It
  returns the logits of the prompt's last token only. Any other call runs the generate graph, and first trims
  the cache to its first position id (`trim_kvcache_for_speculative_decoding`): a rollback is nothing more than
  the next call's position ids. A generate call of more tokens than MAX_GENERATION_TOKEN_LEN fails.

OpenVINO GenAI's speculative decoding with a draft on the NPU (openvinotoolkit/openvino.genai,
src/cpp/src/speculative_decoding/speculative_decoding_npu.cpp, with utils::compile_decoder_for_npu in
src/cpp/src/utils.cpp) relies on exactly that: it compiles the draft with the NPUW properties below (KV axes read
from the model's ReadValue shapes, MAX_PROMPT_LEN 1024 and MIN_RESPONSE_LEN 128 unless given), feeds it the
prompt once and then one token per call, rolls back by lowering its count of processed tokens, passes
input_ids, attention_mask (ones over the whole context) and position_ids and no beam_idx, and leaves the output
layer whole (NPUW cuts the LM head out itself). A target on the NPU gets MAX_GENERATION_TOKEN_LEN set to its
largest verification block.

`NpuwSession` does the same: the prompt in one prefill call (checked against the compiled bound with an error
that names the fix), later tokens in calls of at most the generation length, rollback by position ids.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np
import openvino as ov

from ..errors import EdgeSpecdecError
from .devices import DRAFT_GENERATION_TOKENS, NPU_MAX_PROMPT, NPU_MIN_RESPONSE
from .session import OPENERS, CompiledLM, ModelSession


class NpuPromptTooLongError(EdgeSpecdecError):
    """The prompt is longer than the NPU model was compiled for (NPUW_LLM_MAX_PROMPT_LEN)."""


# new tokens after a kept prefix from which a session prefills the whole context again instead of stepping
REPREFILL = 8


def align(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def kv_axes(model: ov.Model) -> tuple[int, int]:
    """(batch axis, sequence axis) of the KV cache, read from the first ReadValue's initializer shape as GenAI's
    get_kv_axes_pos does: the static 0 is the sequence, the dynamic dimension the batch. Default (0, 2)."""
    batch, seq = 0, 2
    for op in model.get_ops():
        if op.get_type_name() != "ReadValue" or op.get_input_size() < 1:
            continue
        shape = op.get_input_partial_shape(0)
        for i in range(shape.rank.get_length()):
            if shape[i].is_static and shape[i].get_length() == 0:
                seq = i
            elif shape[i].is_dynamic:
                batch = i
        break
    return batch, seq


def npuw_config(model: ov.Model, max_prompt: int = NPU_MAX_PROMPT, min_response: int = NPU_MIN_RESPONSE,
                generation_tokens: int = DRAFT_GENERATION_TOKENS) -> dict[str, Any]:
    """The properties GenAI's update_npu_config gives a decoder on the NPU, plus the generation length."""
    if max_prompt < 1 or min_response < 1 or generation_tokens < 1:
        raise EdgeSpecdecError(f"NPU lengths must be positive: max prompt {max_prompt}, min response "
                               f"{min_response}, generation tokens {generation_tokens}.")
    batch, seq = kv_axes(model)
    return {"NPU_USE_NPUW": "YES", "NPUW_LLM": "YES", "NPUW_LLM_BATCH_DIM": batch, "NPUW_LLM_SEQ_LEN_DIM": seq,
            "NPUW_LLM_MAX_PROMPT_LEN": max_prompt, "NPUW_LLM_MIN_RESPONSE_LEN": min_response,
            "NPUW_LLM_MAX_GENERATION_TOKEN_LEN": generation_tokens}


class NpuwLimits:
    """The lengths NPUW compiled for, as it rounds them."""

    def __init__(self, config: dict[str, Any]):
        self.max_prompt = align(int(config["NPUW_LLM_MAX_PROMPT_LEN"]), 64)
        self.capacity = self.max_prompt + align(int(config["NPUW_LLM_MIN_RESPONSE_LEN"]), 64)
        tokens = int(config["NPUW_LLM_MAX_GENERATION_TOKEN_LEN"])
        self.generation_tokens = tokens if tokens == 1 else align(tokens, 8)


def chunks(start: int, stop: int, size: int) -> list[tuple[int, int]]:
    return [(i, min(i + size, stop)) for i in range(start, stop, size)]


class NpuwSession(ModelSession):
    """The NPU's stateful model under NPUW: prefill once, generate calls of at most the generation length,
    rollback by the next call's position ids (NPUW trims its own cache to them)."""

    rollback_method = "npuw"

    def __init__(self, model):
        self.limits: NpuwLimits = model.npuw_limits
        super().__init__(model)

    @property
    def longest_prompt(self) -> int:
        """NPUW's prefill takes at most the prompt length it was compiled for."""
        return self.limits.max_prompt

    def _restart(self) -> None:
        self.request.reset_state()

    def _call(self, tokens: list[int], start: int) -> np.ndarray:
        n = len(tokens)
        self.request.infer({"input_ids": np.asarray([tokens], dtype=np.int64),
                            "attention_mask": np.ones((1, start + n), dtype=np.int64),
                            "position_ids": np.arange(start, start + n, dtype=np.int64)[None, :]})
        return self.request.get_tensor("logits").data[0].copy()  # the next call overwrites the tensor

    def _infer(self, tokens: list[int], rows: int) -> np.ndarray:
        start = self.length
        if start and len(tokens) - rows >= REPREFILL and start + len(tokens) - rows < self.limits.max_prompt:
            # a long stretch of new tokens after a kept prefix (a new prompt): one prefill of the whole context
            # beats that many one-token calls; GenAI's NPU chat prefills the whole history at every turn too
            tokens, start = self.tokens + list(tokens), 0
        n = len(tokens)
        out: list[np.ndarray] = []
        first = n - rows  # the first position whose logits are asked for
        done = 0
        if start == 0 and first >= 1:  # a new prompt: one prefill call, ending at the first row asked for
            done = first + 1
            if done > self.limits.max_prompt:
                raise NpuPromptTooLongError(
                    f"the prompt is {done} tokens for the model on the NPU, compiled for prompts of at most "
                    f"{self.limits.max_prompt} (NPUW_LLM_MAX_PROMPT_LEN): pass --npu-max-prompt {align(done, 64)}"
                    f" or more (the NPU compiles again), or run this model on the CPU or a GPU (--draft-device / "
                    f"--target-device).")
            out.append(self._call(tokens[:done], 0)[-1:])  # prefill gives the last token's logits only
        for lo, hi in chunks(done, n, self.limits.generation_tokens):
            logits = self._call(tokens[lo:hi], start + lo)
            if hi > first:
                out.append(logits[-(hi - max(lo, first)):])
        return np.concatenate(out)[-rows:]

    def _forget(self, n: int) -> None:
        pass  # the next call's position ids make NPUW trim its cache


def npuw_max_context(limits: NpuwLimits, model_context: Optional[int]) -> int:
    """A session's context on the NPU: what NPUW's cache holds, at most the model's own."""
    return min(limits.capacity, model_context) if model_context else limits.capacity


def open_npuw_model(core: ov.Core, model: ov.Model, device: str, *, max_context: Optional[int] = None,
                    config: Optional[dict[str, Any]] = None, npu_max_prompt: int = NPU_MAX_PROMPT,
                    npu_generation_tokens: int = DRAFT_GENERATION_TOKENS) -> CompiledLM:
    """A model compiled for the NPU under NPUW (session.open_model's "npuw" rollback): prompts of up to
    npu_max_prompt tokens, generate calls of npu_generation_tokens tokens. Not block-invariant; the output layer
    stays whole: NPUW splits the LM head out itself."""
    cfg = {**npuw_config(model, npu_max_prompt, generation_tokens=npu_generation_tokens), **(config or {})}
    limits = NpuwLimits(cfg)
    vocab_size = model.output("logits").get_partial_shape()[-1].get_length()
    lm = CompiledLM(core.compile_model(model, device, cfg), "npuw", device, "npu",
                    npuw_max_context(limits, max_context), block_invariant=False, vocab_size=vocab_size,
                    session_type=NpuwSession)
    lm.npuw_limits = limits
    return lm


OPENERS["npuw"] = open_npuw_model
