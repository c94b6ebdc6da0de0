"""One exported model on one device: feed blocks of tokens, get logits, roll the KV cache back cheaply.

Two ways to roll back, behind one interface (`open_session` picks per device):

- `PagedSession` (CPU, GPU): the paged-attention form of the IR, the form OpenVINO GenAI runs. The session owns
  the key/value block tensors, so a rollback is just a smaller past length, and nothing stale stays in the
  cache.
- `MaskedSession` (NPU, or on request): the stateful IR. Rejected slots stay in the state, but they get
  attention_mask = 0 from then on. Position ids follow the logical position. When masked slots pile up, the
  state is compacted once.

Block invariance: measured on the OpenVINO CPU plugin, a row of a block of n >= 2 tokens has bit-identical
logits for any n. A single token takes another kernel path, and its logits differ in the last bits. With f32
activations the difference is about 1e-5; with dynamic int8 activations it is about 0.3. So a block-invariant
session never feeds one token alone: it re-feeds the token before it, whose cache slot is rewritten with the
same values, or, when the cache is empty (a one-token prompt), feeds a pad token after it and forgets the pad's
slot (a row depends only on the tokens before it). Then verifying k drafted tokens in one pass computes exactly what k single steps compute, and the
speculative output is bit-identical to the target alone even with the fast dynamic-quantization kernels.
`is_block_invariant` checks the property on the device when the session opens. In a masked session the
physical layout of the masked slots changes the attention sums, so it is exact only up to float noise (a
near-tie can flip a greedy token), and it always runs f32: a run on it reports `exact` False.

Fixed block sizes (`min_block`): OpenVINO's CPU plugin prepares every operation again when a call has another
number of tokens than the call before. Measured here, that costs about 4 ms on a 32-layer model of 7M parameters
whose step takes 2 ms, 3 ms on SmolLM2-135M (6 ms step) and 5 ms on Qwen2.5-1.5B int4 (37 ms step). Speculative
decoding changes the block size all the time (a draft step, a sync of a few tokens, blocks of varying length for
the target), so a paged session can widen every short block to `min_block` tokens by re-feeding the tokens
before it, which rewrites their cache slots with the same values. `fixed_block_pays` measures whether that wins.
The same widening makes single steps cheaper where a block of 3 costs less than a block of 2 (`cheapest_step`:
the plugin picks its matmul kernels by the number of rows).

Static shapes (`add_static`): a paged session can also hold copies of its model compiled for one block size
each (the token inputs reshaped to n), sharing the session's KV blocks. A call of that size runs its own copy:
no shape change, and static kernels. Measured on SmolLM2-135M int8 between Qwen2.5-1.5B blocks: a draft step
5.7-6.0 ms instead of 7.2 ms. Each copy holds its own repacked weights (SmolLM2-135M int8: 160 MB, Qwen2.5-1.5B
int4: 970 MB), so the pipeline gives them only to small models. A block-invariant session checks that every
copy gives the bits of the dynamic model, and drops them all if one does not.
"""
from __future__ import annotations

import time
from collections import Counter
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any, Optional

import numpy as np
import openvino as ov

from ..errors import EdgeSpecdecError

# Activation precisions on the CPU. "dq": int8 dynamic quantization of the activations of int4/int8 weight
# matmuls (the plugin's default kernels, much faster on small CPUs). "f32": plain float32 arithmetic, closest to
# the original model. Both keep the KV cache in f32: a u8 cache is quantized per block, so it is not exact
# across rollbacks. bf16 inference is not used: on AVX-512 BF16 CPUs it was no faster here and not exact.
CPU_PRECISIONS = {
    "dq": {"KV_CACHE_PRECISION": "f32", "INFERENCE_PRECISION_HINT": "f32"},
    "f32": {"KV_CACHE_PRECISION": "f32", "INFERENCE_PRECISION_HINT": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": "0"},
}
ROLLBACK_METHODS = ("paged", "masked")
LOGITS_FROM = "logits_from"  # an input we add to the paged IR: the first token whose logits are computed


def int4_group_size(model: ov.Model) -> Optional[int]:
    """The group size of the model's int4 weights (stored as [rows, groups, group size]), or None."""
    shapes = [op.get_output_shape(0) for op in model.get_ops()
              if op.get_type_name() == "Constant" and op.get_element_type() in (ov.Type.u4, ov.Type.i4)]
    sizes = Counter(shape[-1] for shape in shapes if len(shape) == 3 and shape[-1] > 1)  # > 1: not zero points
    return int(sizes.most_common(1)[0][0]) if sizes else None


def cpu_precision(precision: str, int4_group: Optional[int] = None) -> dict[str, str]:
    """The CPU properties of a precision. With "dq" on int4 weights quantized in groups of g, the activations are
    quantized in groups of g too (the plugin's default is 32). Measured on Qwen2.5-1.5B int4, g = 128: a step
    31.6 ms instead of 36.7, a block of 5 tokens 34.7 ms instead of 44.0; groups of 256 took twice as long, and an
    int8 draft (per-channel weights) was the same with any group."""
    config = dict(CPU_PRECISIONS[precision])
    if precision == "dq" and int4_group and int4_group > 0:
        config["DYNAMIC_QUANTIZATION_GROUP_SIZE"] = str(int4_group)
    return config


class ContextOverflowError(EdgeSpecdecError):
    """The prompt plus the tokens to generate do not fit in the model's context."""


class ModelSession:
    """A causal LM with a KV cache that holds `tokens`. Subclasses implement _infer, _forget and _restart."""

    rollback_method = ""

    def __init__(self, compiled: ov.CompiledModel, device: str, precision: str, max_context: Optional[int],
                 block_invariant: bool, vocab_size: int, output_ids: Optional[np.ndarray] = None):
        self.compiled = compiled
        self.request = compiled.create_infer_request()
        self.device = device
        self.precision = precision
        self.max_context = max_context
        # output_ids: the model computes logits for these token ids only (see keep_output_rows); feed() widens
        # its rows back to the whole vocabulary, with -inf for the ids left out
        self.output_ids = output_ids
        self.vocab_size = vocab_size  # the model's, even when output_ids cuts what it computes
        self.block_invariant = block_invariant  # never feed a lone token (see the module docstring)
        self.min_block = 1  # widen shorter blocks to this many tokens (see "Fixed block sizes" above)
        self.tokens: list[int] = []  # the logical sequence the cache holds
        self.reset()

    @property
    def length(self) -> int:
        return len(self.tokens)

    @property
    def least_block(self) -> int:
        """The fewest tokens a call feeds: a block-invariant session never feeds a lone token."""
        return 2 if self.block_invariant else 1

    @property
    def static_sizes(self) -> frozenset:
        """Block sizes this session runs on a copy compiled for that size (see `add_static`)."""
        return frozenset()

    def reset(self) -> None:
        self.tokens = []
        self._restart()

    def feed(self, tokens: list[int], rows: Optional[int] = None) -> np.ndarray:
        """Append tokens to the cache and return the logits of the last `rows` of them (default: all),
        shape [rows, vocab] (float32). Asking only for the rows you need skips the output layer for the rest
        (most of a prompt): a block-invariant session still computes at least 2, as a block always has."""
        n = len(tokens)
        if n == 0:
            raise ValueError("feed() needs at least one token")
        if self.max_context is not None and self.length + n > self.max_context:
            raise ContextOverflowError(f"{self.length + n} tokens exceed the model's context of {self.max_context}")
        rows = n if rows is None else min(n, rows)
        least = self.least_block
        shortest = least if n >= least and n in self.static_sizes else max(self.min_block, least)
        widen = min(shortest - n, self.length)
        if widen > 0:  # re-feed the last cached tokens, whose cache slots get the same values again
            previous = self.tokens[-widen:]
            self.rollback(widen)
            return self.feed(previous + list(tokens), rows=rows)[-rows:]
        if n < least:  # an empty cache has nothing to re-feed: pad the block after the tokens, then forget the pad
            pad = least - n
            logits = self.feed(list(tokens) + [tokens[-1]] * pad, rows=rows + pad)
            self.rollback(pad)
            return logits[:-pad]
        rows = max(rows, least)
        logits = self._infer(tokens, rows)
        self.tokens.extend(tokens)
        if self.output_ids is not None:
            wide = np.full((len(logits), self.vocab_size), -np.inf, dtype=np.float32)
            wide[:, self.output_ids] = logits
            logits = wide
        return logits

    def rollback(self, n: int) -> None:
        """Forget the last n tokens."""
        if n <= 0:
            return
        if n > self.length:
            raise ValueError(f"cannot roll back {n} tokens from a cache of {self.length}")
        self._forget(n)
        del self.tokens[-n:]

    def truncate(self, length: int) -> None:
        """Keep only the first `length` tokens."""
        self.rollback(self.length - length)

    def reserve(self, n_tokens: int) -> None:
        """Make room for n_tokens in the cache up front (a hint; the cache also grows on demand)."""

    def _infer(self, tokens: list[int], rows: int) -> np.ndarray:
        raise NotImplementedError

    def _forget(self, n: int) -> None:
        raise NotImplementedError

    def _restart(self) -> None:
        raise NotImplementedError


class PagedSession(ModelSession):
    """The paged-attention IR: the session owns the KV blocks; rollback is a smaller past length."""

    rollback_method = "paged"

    def __init__(self, compiled: ov.CompiledModel, *args, compile_static=None, **kwargs):
        self._caches = [port.get_any_name() for port in compiled.inputs
                        if port.get_any_name().startswith(("key_cache.", "value_cache."))]
        value = next(p for p in compiled.inputs if p.get_any_name().startswith("value_cache."))
        self.block_size = value.get_partial_shape()[2].get_length()
        self._sliced = any(LOGITS_FROM in port.get_names() for port in compiled.inputs)
        self._blocks = 0
        self._compile_static = compile_static  # n -> the model compiled for blocks of n tokens (see add_static)
        self._static: dict[int, ov.InferRequest] = {}
        self._x: dict[int, dict[str, np.ndarray]] = {}  # see _inputs
        super().__init__(compiled, *args, **kwargs)

    @property
    def static_sizes(self) -> frozenset:
        return frozenset(self._static)

    def add_static(self, sizes) -> None:
        """Compile a copy of the model for each block size in `sizes` (see "Static shapes" above). A
        block-invariant session keeps them only if they give the dynamic model's bits; resets the session."""
        new = sorted(set(sizes) - set(self._static))
        if not new or self._compile_static is None:
            return
        for n in new:
            try:
                request = self._compile_static(n).create_infer_request()
            except RuntimeError:  # token inputs that do not take a static shape: stay dynamic
                break
            for name in self._caches:
                request.set_tensor(name, self.request.get_tensor(name))
            self._static[n] = request
        if self.block_invariant and not is_block_invariant(self):
            self._static.clear()
        self.reset()

    def _restart(self) -> None:
        if not self._blocks:
            self.reserve(4 * self.block_size)

    def reserve(self, n_tokens: int) -> None:
        """Grow the block tensors to hold n_tokens (doubling, so growth is rare; old blocks are copied)."""
        needed = -(-n_tokens // self.block_size)
        if needed <= self._blocks:
            return
        blocks = max(needed, 2 * self._blocks)
        for name in self._caches:
            old = self.request.get_tensor(name)
            tensor = ov.Tensor(old.get_element_type(), [blocks] + list(old.get_shape())[1:])
            if self._blocks:
                tensor.data[:self._blocks] = old.data[:self._blocks]
            for request in (self.request, *self._static.values()):
                request.set_tensor(name, tensor)
        self._blocks = blocks

    def _infer(self, tokens: list[int], rows: int) -> np.ndarray:
        past, n = self.length, len(tokens)
        total = past + n
        self.reserve(total)
        used = -(-total // self.block_size)
        request = self._static.get(n, self.request)
        x = self._inputs(request, n, used)
        x["input_ids"][:] = tokens
        x["position_ids"][:] = np.arange(past, total)
        x["past_lens"][0] = past
        x["block_indices_begins"][1] = used
        x["max_context_len"][...] = total
        if self._sliced:
            x[LOGITS_FROM][0] = n - rows
        request.infer()
        logits = request.get_tensor("logits").data
        return logits.reshape(len(logits), -1)[-rows:].copy()

    def _inputs(self, request: ov.InferRequest, n: int, used: int) -> dict[str, np.ndarray]:
        """The request's input tensors as numpy views, written in place each call (handing OpenVINO a dict of
        new arrays costs as much again as a small model's whole step); new ones only when a shape changes."""
        x, fresh = self._x.setdefault(id(request), {}), {}
        if not x:
            fresh.update(past_lens=np.zeros(1, np.int32), block_indices_begins=np.zeros(2, np.int32),
                         max_context_len=np.zeros((), np.int32))
            if self._sliced:
                fresh[LOGITS_FROM] = np.zeros(1, np.int64)
        if len(x.get("input_ids", ())) != n:
            fresh.update(input_ids=np.zeros(n, np.int64), position_ids=np.zeros(n, np.int64),
                         subsequence_begins=np.array([0, n], np.int32))
        if len(x.get("block_indices", ())) != used:
            fresh["block_indices"] = np.arange(used, dtype=np.int32)
        for name, array in fresh.items():
            request.set_tensor(name, ov.Tensor(array, shared_memory=True))
        x.update(fresh)
        return x

    def _forget(self, n: int) -> None:
        pass  # the next call passes a smaller past length; the stale slots are overwritten


class MaskedSession(ModelSession):
    """The stateful IR with attention-mask rollback and occasional compaction."""

    rollback_method = "masked"

    def __init__(self, *args, **kwargs):
        self._beam_idx = np.zeros(1, dtype=np.int32)
        self._flags = np.zeros(0, dtype=np.int64)  # one 0/1 per physical cache slot
        super().__init__(*args, **kwargs)

    @property
    def physical_length(self) -> int:
        return len(self._flags)

    def _restart(self) -> None:
        self.request.reset_state()
        self._flags = np.zeros(0, dtype=np.int64)

    def _infer(self, tokens: list[int], rows: int) -> np.ndarray:
        n = len(tokens)
        if self.physical_length > self.length and self.physical_length + n > 2 * self.length + 64:
            self._compact()
        flags = np.concatenate([self._flags, np.ones(n, dtype=np.int64)])
        self.request.infer({
            "input_ids": np.asarray([tokens], dtype=np.int64),
            "attention_mask": flags[None, :],
            "position_ids": np.arange(self.length, self.length + n, dtype=np.int64)[None, :],
            "beam_idx": self._beam_idx,
        })
        self._flags = flags
        return self.request.get_tensor("logits").data[0, n - rows:].copy()

    def _forget(self, n: int) -> None:
        live = np.flatnonzero(self._flags)
        self._flags[live[-n:]] = 0

    def _compact(self) -> None:
        """Drop the masked slots from the state (a state rewrite: rare, costs milliseconds)."""
        keep = np.flatnonzero(self._flags)
        for state in self.request.query_state():
            data = state.state.data
            state.state = ov.Tensor(np.ascontiguousarray(data[:, :, keep, :]))
        self._flags = np.ones(len(keep), dtype=np.int64)


def default_rollback(device: str) -> str:
    """Paged attention where OpenVINO runs it (CPU, GPU); the stateful IR elsewhere (NPU)."""
    return "masked" if device.upper().startswith("NPU") else "paged"


def open_session(model_xml: Path, device: str = "CPU", *, core: Optional[ov.Core] = None,
                 max_context: Optional[int] = None, rollback: Optional[str] = None, precision: str = "dq",
                 exact_blocks: bool = True, output_ids: Optional[np.ndarray] = None,
                 config: Optional[dict[str, Any]] = None) -> ModelSession:
    """Compile one model for decoding.

    rollback: "paged" or "masked" (default: per device). precision: "dq" or "f32" (CPU only; a masked session
    always runs f32). exact_blocks: the session must give a block of tokens the logits of single steps (the
    target needs this; a draft does not). For a paged session that is checked on the device, and "dq" falls back
    to "f32" if the check fails. output_ids: compute logits for these token ids only (a draft's smaller output
    layer, see keep_output_rows); the others come out as -inf.
    """
    core = core or ov.Core()
    rollback = rollback or default_rollback(device)
    if rollback not in ROLLBACK_METHODS:
        raise EdgeSpecdecError(f"unknown KV rollback method {rollback!r}: choose one of {', '.join(ROLLBACK_METHODS)}.")
    if precision not in CPU_PRECISIONS:
        raise EdgeSpecdecError(f"unknown precision {precision!r}: choose one of {', '.join(CPU_PRECISIONS)}.")
    if rollback == "masked":
        precision = "f32"
    model = core.read_model(str(model_xml))
    vocab_size = model.output("logits").get_partial_shape()[-1].get_length()
    if output_ids is not None:
        output_ids = np.unique(np.asarray(output_ids, dtype=np.int64))
        if len(output_ids) >= vocab_size or not keep_output_rows(model, output_ids):
            output_ids = None  # nothing to leave out, or an output layer of another shape: keep it whole
    if rollback == "paged":
        from openvino._offline_transformations import paged_attention_transformation  # private API, pinned
        paged_attention_transformation(model)
        compute_logits_from(model)
    kind = PagedSession if rollback == "paged" else MaskedSession
    int4_group = int4_group_size(model)
    for attempt in ([precision, "f32"] if precision != "f32" else ["f32"]):
        cfg = cpu_precision(attempt, int4_group) if device.upper().startswith("CPU") else {}
        cfg.update(config or {})
        paged = {"compile_static": partial(compile_for_block, core, model, device, cfg)} if kind is PagedSession else {}
        session = kind(core.compile_model(model, device, cfg), device, attempt, max_context,
                       block_invariant=exact_blocks and rollback == "paged", output_ids=output_ids,
                       vocab_size=vocab_size, **paged)
        if not session.block_invariant or is_block_invariant(session):
            return session
    session.block_invariant = False  # f32 failed the bitwise check too: exact up to float noise, like "masked"
    return session


def compile_for_block(core: ov.Core, model: ov.Model, device: str, config: dict, n: int) -> ov.CompiledModel:
    """The paged model compiled for blocks of exactly n tokens: its token inputs get the static shape [n]."""
    copy = model.clone()
    copy.reshape({name: ov.PartialShape([n]) for name in ("input_ids", "position_ids")})
    return core.compile_model(copy, device, config)


def _output_matmul(model: ov.Model):
    """The node that computes the logits from the last hidden state (a MatMul in the IRs optimum-intel writes)."""
    return model.output("logits").get_node().input_value(0).get_node()


def compute_logits_from(model: ov.Model) -> None:
    """Let the paged IR compute logits only from token `logits_from` on: a Slice before the output layer.

    For a prompt of a few dozen tokens and a vocabulary of 150k, the output layer's rows we do not need cost
    about as much as a whole decode step.
    """
    import openvino.opset13 as ops

    matmul = _output_matmul(model)
    if matmul.get_type_name() != "MatMul":  # an IR of another shape (a softcap, a cast): leave it whole
        return
    start = ops.parameter([1], ov.Type.i64, name=LOGITS_FROM)
    start.output(0).get_tensor().set_names({LOGITS_FROM})
    hidden = matmul.input_value(0)
    sliced = ops.slice(hidden, start, ops.constant(np.array([np.iinfo(np.int64).max])),
                       ops.constant(np.array([1])), ops.constant(np.array([0])))
    matmul.input(0).replace_source_output(sliced.output(0))
    model.add_parameters([start])
    model.validate_nodes_and_infer_types()


def keep_output_rows(model: ov.Model, ids: np.ndarray) -> bool:
    """Cut the output layer down to the rows of the token ids `ids` (sorted, unique); False if it has no such form.

    The output layer of a small draft is a large part of its step: Qwen2.5-0.5B reads 136 MB of int8 lm_head
    weights per token, a quarter of the model. The output layer gets a copy of its weight-decompression chain in
    which every constant with one row per token (int8/int4 values, scales, zero points) holds only the kept rows,
    so the plugin still runs a compressed matmul; the embedding, if it shares the weight, keeps the original.
    The logits output then has len(ids) columns.
    """
    import openvino.opset13 as ops

    matmul = _output_matmul(model)
    vocab = model.output("logits").get_partial_shape()[-1]
    if matmul.get_type_name() != "MatMul" or not vocab.is_static or not matmul.get_attributes().get("transpose_b"):
        return False
    vocab = vocab.get_length()
    rebuild = {"Convert": lambda node, x: ops.convert(x[0], node.get_output_element_type(0)),
               "Subtract": lambda node, x: ops.subtract(x[0], x[1]),
               "Multiply": lambda node, x: ops.multiply(x[0], x[1]),
               "Reshape": lambda node, x: ops.reshape(x[0], x[1], node.get_attributes()["special_zero"])}

    def cut(output: ov.Output, reshape_target: bool = False) -> Optional[ov.Output]:
        node = output.get_node()
        kind = node.get_type_name()
        if kind == "Constant":
            shape = list(output.get_shape())
            if shape and shape[0] == vocab:
                per_row = np.asarray(node.get_data()).view(np.uint8).reshape(vocab, -1)  # packed int4 too
                tensor = ov.Tensor(node.get_output_element_type(0), ov.Shape([len(ids)] + shape[1:]))
                tensor.data.view(np.uint8).reshape(len(ids), -1)[:] = per_row[ids]
                return ov.op.Constant(tensor).output(0)
            if reshape_target and shape and np.asarray(node.get_data())[0] == vocab:
                target = np.asarray(node.get_data()).copy()  # a group-quantized weight folded back to 2-D
                target[0] = len(ids)
                return ops.constant(target).output(0)
            return output  # a scalar or a per-column constant: shared as it is
        inputs = [cut(port.get_source_output(), kind == "Reshape" and port.get_index() == 1)
                  for port in node.inputs()]
        if kind not in rebuild or any(x is None for x in inputs):
            return None  # a chain of another form: keep the layer whole
        return rebuild[kind](node, inputs).output(0)

    weight = cut(matmul.input_value(1))
    if weight is None or weight.get_partial_shape()[0] != len(ids):
        return False
    matmul.input(1).replace_source_output(weight)
    model.validate_nodes_and_infer_types()
    return True


@contextmanager
def _scratch(session: ModelSession, longest: int):
    """A scratch context of 4 random tokens for timing calls of up to `longest` tokens: yields timed(n), the
    seconds of one call of n tokens (rolled back after), and leaves the session empty and as it was set."""
    saved, session.min_block = session.min_block, 1
    ids = np.random.default_rng(0).integers(0, session.vocab_size, longest + 4).tolist()

    def timed(n: int) -> float:
        start = time.perf_counter()
        session.feed(ids[4:4 + n], rows=1)
        seconds = time.perf_counter() - start
        session.rollback(n)
        return seconds

    try:
        session.reset()
        session.feed(ids[:4])
        yield timed
    finally:
        session.min_block = saved
        session.reset()


def fixed_block_pays(session: ModelSession, size: int, reps: int = 3) -> bool:
    """Is a block of `size` tokens on every call cheaper than a single step plus a change of shape?

    Measures on the device, with a scratch context, interleaved: the cost of a single step after a single step c1,
    of a block of `size` after a block cs, and of a block right after a single step (cs + the cost of the shape
    change s). Wins if cs <= c1 + s: true for small models, whose step is mostly fixed costs, false for a big
    target whose every token costs compute.
    Only for paged sessions (a masked session would keep every re-fed slot).
    """
    if session.rollback_method != "paged" or size < 2:
        return False
    one, switched, block = [], [], []
    with _scratch(session, size) as timed:
        for _ in range(reps + 1):  # interleaved, so that the machine's drift hits all three alike
            timed(1)
            one.append(timed(1))            # a single step after a single step
            switched.append(timed(size))    # a block after a single step: a change of shape
            block.append(timed(size))       # a block after a block
    c1, cs_switched, cs = (float(np.median(x[1:])) for x in (one, switched, block))  # [0] warmed up
    return cs <= c1 + (cs_switched - cs)


def cheapest_step(session: ModelSession, reps: int = 4, margin: float = 0.97) -> int:
    """The number of tokens a single step should take: the least a call may have (2 in a block-invariant
    session), or one more when that is cheaper by more than the margin, measured in a row on the device.

    The CPU plugin picks its matmul kernels by the number of rows, and more rows are not always slower: on
    Qwen2.5-1.5B int4 (activations quantized in groups of 128) a block of 3 tokens took 29.3 ms, a block of 2
    31.5 ms. Only for paged sessions (a masked session would keep every re-fed slot).
    """
    least = session.least_block
    if session.rollback_method != "paged":
        return least
    costs: dict[int, list[float]] = {least: [], least + 1: []}
    with _scratch(session, least + 1) as timed:
        for _ in range(reps):  # interleaved rounds; in each, the first two calls of a size pay its shape change
            for n, seconds in costs.items():
                seconds += [timed(n) for _ in range(4)][2:]
    return least + 1 if np.median(costs[least + 1]) < margin * np.median(costs[least]) else least


def is_block_invariant(session: ModelSession) -> bool:
    """Does a block of tokens get bit-identical logits to the same tokens fed in smaller pieces, among them
    a lone token into the empty cache, single tokens after it and one block of each static size?"""
    sizes = [1, 4, 1, 1, 1, 1, 3, *sorted(session.static_sizes)]  # the whole block is longer than any static size
    tokens = np.random.default_rng(0).integers(0, session.vocab_size, sum(sizes)).tolist()
    session.reset()
    whole = session.feed(tokens)
    session.reset()
    ends = np.cumsum(sizes)
    pieces = np.concatenate([session.feed(tokens[end - n:end]) for n, end in zip(sizes, ends)])
    session.reset()
    return bool(np.array_equal(whole, pieces))
