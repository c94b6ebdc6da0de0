"""One exported model on one device: feed blocks of tokens, get logits, roll the KV cache back cheaply.

Rollback uses the attention mask of the stateful IR (measured in ../shared/DESIGN.md as exact and nearly
free, where trimming the state costs 30-300 ms): rejected cache slots stay where they are but get
attention_mask = 0 from then on, and position ids follow the logical position. When masked slots pile up,
the cache is compacted once by rewriting the state (rare, amortized).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import numpy as np
import openvino as ov

from ..errors import EdgeSpecdecError

# Exactness first: the CPU plugin otherwise keeps the KV cache in u8 and may quantize activations
# dynamically, and then a block of k tokens and k single tokens can differ in the last bits.
EXACT_CPU_CONFIG = {"KV_CACHE_PRECISION": "f32", "INFERENCE_PRECISION_HINT": "f32",
                    "DYNAMIC_QUANTIZATION_GROUP_SIZE": "0"}


class ContextOverflowError(EdgeSpecdecError):
    """The prompt plus the tokens to generate do not fit in the model's context."""


class ModelSession:
    """A stateful OpenVINO causal LM with block feeding and attention-mask rollback."""

    def __init__(self, model_xml: Path, device: str = "CPU", config: Optional[dict[str, Any]] = None,
                 max_context: Optional[int] = None, core: Optional[ov.Core] = None):
        core = core or ov.Core()
        cfg = dict(EXACT_CPU_CONFIG) if device.startswith("CPU") else {}
        cfg.update(config or {})
        self.device = device
        self.compiled = core.compile_model(str(model_xml), device, cfg)
        self.request = self.compiled.create_infer_request()
        self.max_context = max_context
        self.vocab_size = self.compiled.output("logits").get_partial_shape()[2].get_length()
        self._beam_idx = np.zeros(1, dtype=np.int32)
        self.reset()

    def reset(self) -> None:
        self.request.reset_state()
        self._flags = np.zeros(0, dtype=np.int64)  # one 0/1 per physical cache slot
        self.tokens: list[int] = []                  # the logical sequence the cache holds

    @property
    def length(self) -> int:
        return len(self.tokens)

    @property
    def physical_length(self) -> int:
        return len(self._flags)

    def feed(self, tokens: list[int]) -> np.ndarray:
        """Append tokens to the cache and return their logits, shape [len(tokens), vocab] (float32)."""
        n = len(tokens)
        if n == 0:
            raise ValueError("feed() needs at least one token")
        if self.max_context is not None and self.length + n > self.max_context:
            raise ContextOverflowError(f"{self.length + n} tokens exceed the model's context of {self.max_context}")
        if self.physical_length > self.length and self.physical_length + n > 2 * self.length + 64:
            self._compact()
        self._flags = np.concatenate([self._flags, np.ones(n, dtype=np.int64)])
        self.request.infer({
            "input_ids": np.asarray([tokens], dtype=np.int64),
            "attention_mask": self._flags[None, :],
            "position_ids": np.arange(self.length, self.length + n, dtype=np.int64)[None, :],
            "beam_idx": self._beam_idx,
        })
        self.tokens.extend(tokens)
        return self.request.get_tensor("logits").data[0].copy()

    def rollback(self, n: int) -> None:
        """Forget the last n tokens: their slots are masked out, nothing is copied."""
        if n <= 0:
            return
        if n > self.length:
            raise ValueError(f"cannot roll back {n} tokens from a cache of {self.length}")
        live = np.flatnonzero(self._flags)
        self._flags[live[-n:]] = 0
        del self.tokens[-n:]

    def truncate(self, length: int) -> None:
        """Keep only the first `length` tokens."""
        self.rollback(self.length - length)

    def _compact(self) -> None:
        """Drop the masked slots from the state (a state rewrite: rare, costs milliseconds)."""
        keep = np.flatnonzero(self._flags)
        for state in self.request.query_state():
            data = state.state.data
            state.state = ov.Tensor(np.ascontiguousarray(data[:, :, keep, :]))
        self._flags = np.ones(len(keep), dtype=np.int64)
