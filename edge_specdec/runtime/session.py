"""One exported model on one device: feed blocks of tokens, get logits, roll the KV cache back cheaply.

A `CompiledLM` is what is loaded once and shared: the compiled model (its weights), its static copies, its
settings and whether it promises block invariance. A `ModelSession` is one decoding context on it: its own
infer requests and KV cache, nothing else, so many sessions decode on one CompiledLM with the weights held once.

Two ways to roll back, behind one interface (`open_model` picks per device profile):

- `PagedSession` (CPU, GPU): the paged-attention form of the IR, the form OpenVINO GenAI runs. The session owns
  the key/value block tensors, so a rollback is just a smaller past length, and nothing stale stays in the
  cache.
- `MaskedSession` (on request): the stateful IR. Rejected slots stay in the state, but they get
  attention_mask = 0 from then on. Position ids follow the logical position. When masked slots pile up, the
  state is compacted once.
- `NpuwSession` (NPU, see npu.py): the stateful IR under OpenVINO's NPU LLM pipeline, which owns the cache and
  trims it to the position ids of the next call. npu.py compiles such models itself and adds that to
  `open_model` (`OPENERS`), so this module needs nothing of it.

Block invariance: on the OpenVINO CPU plugin, a row of a block of n >= 2 tokens has bit-identical logits for any
n, while a single token takes another kernel path whose logits differ in the last bits (far more with dynamic
int8 activations than with f32). So a block-invariant session never feeds one token alone: it re-feeds the token
before it, whose cache slot is rewritten with the same values, or, when the cache is empty (a one-token prompt),
feeds a pad token after it and forgets the pad's slot (a row depends only on the tokens before it). Then
verifying k drafted tokens in one pass computes exactly what k single steps compute, and the speculative output
is bit-identical to the target alone even with the fast dynamic-quantization kernels. `is_block_invariant`
checks the property on the device when the model opens. In a masked session the physical layout of the masked
slots changes the attention sums, so it is exact only up to float noise (a near-tie can flip a greedy token),
and it always runs f32: a run on it reports `exact` False.

Long blocks (`CompiledLM.longest_block`): the same holds only up to a number of tokens a call, which depends on
the CPU. On an AVX2 CPU the real 1.5B int4 target's rows change bits once a call has more than about 80 tokens (the
plugin picks other matmul kernels for many rows), so a prompt prefilled in one call leaves other key/value bits in
its slots than the same tokens fed in blocks, and a reused prefix, a re-fed token or a later block sees them; on a
Xeon with AMX they stay the same up to 256 tokens at least. So open_model measures, with the precision, the longest
call that gives the bits of short calls (`probes.longest_exact_call`, one of `probes.CALL_SIZES`; an earlier
process's answer from the measurement cache, which keeps it with the verdict of exactness measured with it), and a
block-invariant session feeds a long block in even pieces of at most that many tokens; a batched call holds at
most that many (batching.py). Every call it makes has between 2 and that many tokens, the sizes the checks cover.

Fixed block sizes (`min_block`): OpenVINO's CPU plugin prepares every operation again when a call has another
number of tokens than the call before, and speculative decoding changes the block size all the time (a draft
step, a sync of a few tokens, blocks of varying length for the target). So a paged session can widen every
short block to `min_block` tokens by re-feeding the tokens before it, which rewrites their cache slots with the
same values (`fixed_block_pays` measures whether that wins). The same widening makes single steps cheaper where
a block of 3 costs less than a block of 2 (`cheapest_step`: the plugin picks its matmul kernels by the number of
rows).

One-token sequences after a long prompt (`ModelSession.sequences_from`): the CPU plugin's PagedAttention runs a
call with more than one token in a sequence through its mixed loop, which lays the whole past out again in scratch
buffers on every call; after a prompt of thousands of tokens that makes an exact 2-token step cost far more than a
lone token. Fed as one-token sequences over the session's same block table (past lengths p, p+1, ..., p+n-1), each
token takes a kernel that sums over the past in block order and re-lays nothing; pad sequences (token 0 at position
0 of a scratch block, no past) make more sequences than the model's threads and at least 2 rows, so that the
plugin's choice of loop and its split of the work never depend on the call's size or the thread count. A token's row
is then the same whatever the call that holds it, but not the row the block layout gives it, so a position must
always take the same layout: a session fed a prompt of at least SEQUENCES_AFTER tokens (`end_prompt`) feeds every
token after the end of the prompt's first turn past that length in this layout (for a prompt of one turn, every token
after the prompt; see "A chat's turns" below) and the tokens before in blocks, and a later request reuses a cache
only up to the first position its own prompt feeds in another layout (`shared_prefix`), so that a reused prefix
still equals a fresh prefill. Shorter prompts keep the block layout throughout. There is no lone-token rule in this
layout (no widening, no pad token), and the calls run on the dynamic model (a static copy is compiled for one block
size). open_model probes the layout on an exact CPU model (`probes.passes_sequences_layout`); a model that fails it
keeps the block layout throughout.

A long prompt's prefill in bf16 (`CompiledLM.prefill`; by default where it pays, see `_auto_prefill_may_pay`): on
CPUs with AMX a copy of the target compiled at bf16 computes a long prompt in about 0.55x dq's time. What it writes
keeps its bits across call sizes only for calls of at least PREFILL_LEAST tokens (calls of 2-4 take other kernels),
so it cannot run the exact decode steps: a session feeds the prompt of a long-prompt run but its last token (before
the sequences layout's boundary, `end_prompt`; in a chat, up to the end of its turn that holds most of the prompt,
see "A chat's turns" below) on that copy, in calls of PREFILL_LEAST to prefill_longest tokens
(pieces of a multiple of PREFILL_ALIGN tokens, the size its matmuls compute fastest, and the rest, padded up to such
a multiple where it falls just short: PREFILL_PAD_MOST), and every later token on the dq model as before. The copy
computes the cache only: its output layer is cut to a few ids (graph.keep_output_rows), so it does not hold the
target's output layer again, and the prompt's last token is the first one-token sequence on the dq model, whose row
gives the first token. The CPU plugin keeps a bf16 model's cache in bf16 and an f32 model's in f16 (a bf16 cache it
refuses there), but both take two bytes a value: the copy's request reads and writes the session's own blocks seen
as bf16, and before the target reads what it wrote, those blocks are converted to f16 where they lie, and back
before the copy goes on after them (prefill_blocks.py): the same values for every run, and no second set of blocks.
A fresh prefill of the same prompt then writes the same, and a short prompt's cache holds dq-written values; so a
later request reuses a cache only where its own prompt is prefilled the same way (`shared_prefix`), and the target
alone and every algorithm, feeding the prompt alike, keep writing the same tokens. The copy holds its own repacked
weights but the output layer's, and has a probe of its own, on the cache its calls write
(`probes.passes_prefill_calls`).

A chat's turns (`ModelSession.layout`): a conversation's next prompt holds the answer before it, which the target
wrote as it decoded (dq, one-token sequences after a long prompt); a fresh prefill of that prompt must write those
positions the same way for the cache to be reused, so which model and layout feed a position must not depend on how
long the prompt grew after it. A prompt's turns end where the chat template's answer opening ends (its generation
prompt, `answer_opening`: ChatML's "<|im_start|>assistant\n", as token ids; `answer_starts`) and at its last token.
The one-token sequences start after the first turn end past SEQUENCES_AFTER tokens; the copy prefills up to the last
turn end past SEQUENCES_AFTER whose turn holds at least COPY_TURN_SHARE of the prompt up to there (a document pasted
in: prefilling it all on the copy then takes about the time dq takes for the turn alone), and the sequences start
at that end instead. Both depend on the tokens up to a turn's end only, so a conversation's later turns (a question
after a long document, a chat that grows past SEQUENCES_AFTER) keep the layout of every position an earlier turn
wrote and reuse its whole cache, the answers too; a turn that moves the copy's end re-prefills from the old end. A
prompt without turns (plain text, or a template's opening spelled in other tokens) has one turn: the copy prefills
all but its last token. Only speed depends on finding the turns: the layout is a function of the prompt either way.

Static shapes (`CompiledLM.add_static`): a paged model can also have copies compiled for one block size each
(the token inputs reshaped to n); a session runs a call of that size on its copy, sharing its KV blocks: no
shape change, and static kernels. Each copy holds its own repacked weights, so the engine gives them only to
small models. A block-invariant model checks that every copy gives the bits of the dynamic model, and drops them
all if one does not. A paged model's compile cannot come from OpenVINO's cache, so the engine does not compile
the copies at load: it plans the sizes (`CompiledLM.plan_static`), and the first request that calls a planned
size compiles its copy (`CompiledLM.compile_planned`), in its own thread, before it starts decoding.
"""
from __future__ import annotations

import copy
import threading
from functools import partial
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import openvino as ov

from ..errors import EdgeSpecdecError
from .devices import (AUTO_PREFILL, AUTO_PREFILL_BYTES, AUTO_PREFILL_RATIO, DRAFT_GENERATION_TOKENS, KV_CACHES,
                      NPU_MAX_PROMPT, PRECISIONS, PREFILL_PRECISIONS, profile)
from .graph import LOGITS_ROWS, compile_for_block, compute_logits_rows, int4_group_size, keep_output_rows
from .prefill_blocks import KeptAside, to_copy, to_target
from .probes import (CONTEXT_ROOM, context_cuts_the_probe, longest_exact_call, passes_block_invariance,
                     passes_prefill_calls, passes_sequences_layout, prefill_call_fits, prefill_copy_ratio)
from .spare_memory import release_mapped, releasing_mapped, trim_heap

ROLLBACK_METHODS = ("paged", "masked", "npuw")
# the most tokens one call of a block-invariant session holds where open_model did not measure it (a CompiledLM made
# otherwise): the longest piece measured exact on an AVX2 CPU (see "Long blocks" above)
LONGEST_BLOCK = 64
# How an exact session forms its calls (paged attention, blocks cut into pieces of at most the model's measured
# longest block, at least least_block tokens a call; on the CPU, the tokens after a long prompt as one-token
# sequences with their pad sequences, which a probe of its own checks): a verdict of exactness holds for one layout
# only, so the measurement cache keys its verdicts on this, and open_model reuses a verdict only with the longest
# block measured with it. Change it with any change to how calls are formed.
CALL_LAYOUT = "paged-v5-prefill-copy-calls-up-to-1024"
# A prompt of at least this many tokens makes an exact paged session on the CPU feed the tokens after it (after its
# first turn this long, see "A chat's turns" above) as one-token sequences (see "One-token sequences" above), and is
# prefilled on the long-prompt prefill copy where the session has one. Below it the mixed loop's re-laying of the past
# costs less than the one-token kernels' per-token price on a verification block; from it the copy's prefill (about
# 0.65x the first token) and the one-token steps win more (benchmarks/RESULTS.md, "Long prompts from 1024 tokens").
SEQUENCES_AFTER = 1024
# a long prompt is prefilled on the bf16 prefill model up to the end of its last turn that holds at least this share of
# the prompt up to there (see "A chat's turns" above): about the copy's prefill time over the target's on AMX, so that
# where the copy prefills the whole prompt again it takes about the time the target takes for the turn alone
COPY_TURN_SHARE = 0.6
# the fewest tokens a call on a long prompt's bf16 prefill model holds (see "A long prompt's prefill in bf16" above)
PREFILL_LEAST = 8
# the most tokens a call on it holds: the first of these its probe passes with, else the target's longest block.
# Longer calls prefill a long prompt faster and take more scratch memory (benchmarks/RESULTS.md, "Long prompts")
PREFILL_CALL_SIZES = (1024, 256)
# auto times the copy's prefill (against the target's) on a prompt of this many of its longest calls, or of what the
# context holds: the later calls attend to a past as long as a call, where bf16 gains most on CPUs without AMX, and
# the gain grows with the prompt, so a prompt of one call would undersell it
PREFILL_TIMED_CALLS = 2
# the most tokens a call on it holds while other sessions on the same engine generate: a call on the copy runs alone,
# holding the blocks' lock, and their steps wait for it
PREFILL_SHARED_LONGEST = 256
# a long prompt's prefill copy takes its calls in pieces of a multiple of this many tokens and then the rest: the CPU
# plugin's bf16 matmuls compute a call of such a size faster per token than a call of any other size (on AMX; see
# benchmarks/RESULTS.md, "Long prompts"), and the copy's rows are the same whatever the size of its calls
PREFILL_ALIGN = 128
# and a call on it that falls short of a multiple of its alignment by at most this fraction of it (56 of 128 tokens)
# is padded up to the multiple (pad tokens after its own, forgotten after the call): a call of 200-255 tokens takes
# longer than one of 256 (as one of 912-1023 than one of 1024), one of 72-127 about as long as or longer than one of
# 128, and shorter ones less than their multiple (benchmarks/RESULTS.md, "Long prompts")
PREFILL_PAD_MOST = 7 / 16
# the layout boundary of a prefill without end (begin_long_prefill): past any prompt
OPEN_PREFILL = 1 << 30
# the token ids the prefill copy's cut output layer computes: a few, so that its matmul stays an ordinary one
PREFILL_OUTPUT_IDS = 8


def answer_starts(tokens: list[int], opening: tuple[int, ...]) -> list[int]:
    """Where a prompt's turns end, ascending: the last token of each occurrence of `opening` (the chat template's
    text where an answer starts, as token ids), whose row gives that answer's first token, and the prompt's last
    token, which gives this run's."""
    n, last = len(opening), len(tokens) - 1
    starts = []
    if n and last >= n:
        ids = np.asarray(tokens)
        pattern = np.asarray(opening)
        for end in np.flatnonzero(ids[n - 1:last] == pattern[-1]) + n - 1:
            if np.array_equal(ids[end - n + 1:end + 1], pattern):
                starts.append(int(end))
    return starts + [last]


def common_prefix(a: list[int], b: list[int]) -> int:
    """The length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def layout_agreement(length: int, cached: tuple[int, Optional[int]], layout: tuple[int, Optional[int]]) -> int:
    """How many of a cache's first `length` tokens, fed in the `cached` layout, a run in `layout` feeds alike (each
    layout as (copy_end, sequences_from), see ModelSession.layout)."""
    agree = length
    if layout[0] != cached[0]:
        agree = min(agree, layout[0], cached[0])
    if layout[1] != cached[1]:
        agree = min(agree, *(b for b in (layout[1], cached[1]) if b is not None))
    return agree


def reusable_prefix(cached: list[int], cached_layout: tuple[int, Optional[int]], tokens: list[int],
                    layout: tuple[int, Optional[int]]) -> int:
    """How many of a cache's tokens (`cached`, fed in `cached_layout`) a prompt of `tokens`, fed in `layout`, may
    keep: those it starts with, up to the first position the prompt feeds in another layout or on another model.
    ModelSession.shared_prefix for a session's own cache, the server's prefix store for a stored one."""
    return min(common_prefix(cached, tokens), layout_agreement(len(cached), cached_layout, layout))


class ContextOverflowError(EdgeSpecdecError):
    """The prompt plus the tokens to generate do not fit in the model's context."""


class CompiledLM:
    """A causal LM compiled on one device, shared by every session decoding with it."""

    def __init__(self, compiled: ov.CompiledModel, rollback: str, device: str, precision: str,
                 max_context: Optional[int], block_invariant: bool, vocab_size: int,
                 output_ids: Optional[np.ndarray] = None, compile_static=None, session_type=None):
        self.compiled, self.rollback_method, self.device, self.precision = compiled, rollback, device, precision
        self.max_context = max_context
        self.block_invariant = block_invariant  # never feed a lone token (see the module docstring)
        self.vocab_size = vocab_size  # the model's, even when output_ids cuts what it computes
        # output_ids: the model computes logits for these token ids only (see graph.keep_output_rows); a session
        # widens its rows back to the whole vocabulary, with -inf for the ids left out
        self.output_ids = output_ids
        self._compile_static = compile_static  # n -> the model compiled for blocks of n tokens (paged only)
        self.session_type = session_type  # the ModelSession class of its sessions (None: by the rollback method)
        self.static: dict[int, ov.CompiledModel] = {}
        # block sizes whose copy is compiled when first asked for (plan_static), and the bit check for them
        self.planned: frozenset = frozenset()
        self._planned_invariant: Optional[Callable[["ModelSession"], bool]] = None
        self._lock = threading.Lock()  # static copies are compiled once, whoever asks
        self._plan_lock = threading.Lock()  # who compiles which planned size (held only to take one)
        self.kv_cache = ""  # the KV cache's element type asked for (open_model; "" where the device keeps its own)
        # the weights file the compiled model maps (open_model): its pages are given back while and after the model
        # first runs, when the device repacks the weights (spare_memory.py)
        self.weights_file: Optional[Path] = None
        # the most tokens a call of its block-invariant sessions holds (see "Long blocks" above; open_model measures it)
        self.longest_block = LONGEST_BLOCK
        self.exactness_note = ""  # why the model is not block-invariant, where open_model found it is not
        # whether its exact sessions feed the tokens after a long prompt as one-token sequences (see "One-token
        # sequences" above): a paged model on the CPU that passed the probe of that layout (open_model)
        self.sequences = False
        # the copy compiled at another precision that prefills long prompts (see "A long prompt's prefill in bf16"
        # above; open_model), its precision, and why a copy asked for is not used
        self.prefill: Optional[ov.CompiledModel] = None
        self.prefill_precision = ""
        self.prefill_longest = 0  # the most tokens one call on it holds (what its probe passed with)
        self.prefill_align = PREFILL_ALIGN  # its calls' pieces are a multiple of this many tokens (but the last)
        # the element type the copy reads the session's blocks as, where it is not theirs (bf16 on f16 blocks: the
        # session converts them between the copy's calls and the target's, see prefill_blocks.py)
        self.prefill_reads_as: Optional[ov.Type] = None
        self.prefill_note = ""
        self._threads: Optional[int] = None

    @property
    def threads(self) -> int:
        """The compiled model's INFERENCE_NUM_THREADS (1 where the device has no such setting)."""
        if self._threads is None:
            try:
                self._threads = int(self.compiled.get_property("INFERENCE_NUM_THREADS"))
            except (RuntimeError, TypeError, ValueError):
                self._threads = 1
        return self._threads

    @property
    def kv_bytes_per_token(self) -> Optional[float]:
        """Bytes one token takes in a paged model's KV cache (all layers, keys and values, the scales of a u8
        cache included), from the cache inputs' block shapes; None for other models (their cache is the
        device's)."""
        return kv_bytes_per_token(self.compiled) if self.rollback_method == "paged" else None

    def session(self, pool: Optional["BlockPool"] = None) -> "ModelSession":
        """A new decoding context: its own infer requests and KV cache, the weights shared. pool (paged only):
        draw its cache blocks from this pool, shared with other sessions (batched calls need that), instead of
        a pool of its own."""
        if self.session_type is not None:
            return self.session_type(self)
        if self.rollback_method == "paged":
            return PagedSession(self, pool)
        return MaskedSession(self)

    def add_static(self, sizes, invariant: Optional[Callable[["ModelSession"], bool]] = None) -> None:
        """Compile a copy of the model for each block size in `sizes` (see "Static shapes" above), now, in the
        calling thread. The copies serve only once they are ready, all at once: each has run once on a scratch
        session (OpenVINO prepares a compiled model on its first inference), and a block-invariant model keeps them
        only if they give the dynamic model's bits: invariant(session), when given, answers that for a scratch
        session that runs them (an answer an earlier process stored, or a probe), else the copies are checked
        here. Until then other sessions run those blocks on the dynamic model. Copies that give other bits are
        dropped with all of the model's copies (the earlier ones too), and the model plans no more."""
        if self._compile_static is None:
            return
        with self._lock:
            staged = {}
            for n in sorted(set(sizes) - set(self.static)):
                try:
                    staged[n] = self._compile_static(n)
                except RuntimeError:  # token inputs that do not take a static shape: stay dynamic
                    break
            if not staged:
                return
            trial = copy.copy(self)  # the same model, with the new copies: sessions on it run them
            trial.static = {**self.static, **staged}
            scratch = trial.session()
            with releasing_mapped(self.weights_file):  # each copy reads the mapped weights to repack its own
                for n in staged:
                    scratch.feed([0] * n, rows=1)
            if self.block_invariant:
                scratch.reset()
                exact = invariant(scratch) if invariant is not None else passes_block_invariance(scratch)
            release_mapped(self.weights_file)  # the pages the check read (embedding rows)
            if self.block_invariant:
                if not exact:
                    self.static, self.planned = {}, frozenset()
                    return
            self.static = trial.static  # one assignment: a session's next call sees all of them or none

    def plan_static(self, sizes, invariant: Optional[Callable[["ModelSession"], bool]] = None) -> None:
        """Compile a copy for each of these block sizes only when asked to (`compile_planned`), with add_static's
        check (invariant) for a block-invariant model."""
        if self._compile_static is not None:
            self.planned, self._planned_invariant = frozenset(sizes) - set(self.static), invariant

    def compile_planned(self, sizes=None) -> None:
        """Compile now, in the calling thread, the planned copies among `sizes` (None: all of them), smallest first.
        Each size is tried once, whatever comes of it: a thread that asks while another compiles it goes on without
        it, its calls of that size on the dynamic model until the copy serves."""
        for n in sorted(self.planned if sizes is None else frozenset(sizes) & self.planned):
            with self._plan_lock:
                if n not in self.planned:  # taken by another thread, or the plan dropped
                    continue
                self.planned = self.planned - {n}
            self.add_static({n}, invariant=self._planned_invariant)


def _reserve(pool: "BlockPool", table: list[int], n_tokens: int) -> None:
    """Extend a block table from its pool to hold n_tokens (doubling it, so that this is rare)."""
    needed = -(-n_tokens // pool.block_size)
    if needed > len(table):
        table += pool.allocate(max(needed, 2 * len(table)) - len(table))


def sequence_pads(sequences: int, tokens: int, threads: int) -> int:
    """The pad sequences a paged call of `sequences` sequences and `tokens` tokens in all gets when it holds
    one-token sequences of the sequences layout (see "One-token sequences" above): enough for more sequences than
    the model's threads (the CPU plugin's mixed loop then gives each kernel the query heads of one key/value head,
    whatever the thread count and the call's size) and at least 2 tokens."""
    return max(0, threads + 1 - sequences, 2 - tokens)


def call_inputs(sequences: list[tuple[list[int], int, np.ndarray]], pads: int, scratch: int) -> dict[str, np.ndarray]:
    """A paged call's inputs (but the logits rows) for sequences of (tokens, past length, block table), then `pads`
    pad sequences: token 0 at position 0 of the scratch block, with no past."""
    sequences = list(sequences) + [([0], 0, np.asarray([scratch], np.int32))] * pads
    lengths = [len(tokens) for tokens, _, _ in sequences]
    return {"input_ids": np.concatenate([np.asarray(t, np.int64) for t, _, _ in sequences]),
            "position_ids": np.concatenate([np.arange(p, p + len(t)) for t, p, _ in sequences]).astype(np.int64),
            "past_lens": np.asarray([p for _, p, _ in sequences], np.int32),
            "subsequence_begins": np.cumsum([0] + lengths).astype(np.int32),
            "block_indices": np.concatenate([table for _, _, table in sequences]).astype(np.int32),
            "block_indices_begins": np.cumsum([0] + [len(table) for _, _, table in sequences]).astype(np.int32),
            "max_context_len": np.asarray(max(p + len(t) for t, p, _ in sequences), np.int32)}


def kv_bytes_per_token(compiled: ov.CompiledModel) -> float:
    """Bytes a token takes in a paged model's cache: each key_cache.N / value_cache.N input's block of [heads, rows,
    columns] elements (a u8 cache keeps its scales in extra rows or columns) over the tokens a block holds."""
    caches = [p for p in compiled.inputs if p.get_any_name().startswith(("key_cache.", "value_cache."))]
    value = next(p for p in caches if p.get_any_name().startswith("value_cache."))
    tokens = value.get_partial_shape()[2].get_length()
    return sum(int(np.prod([d.get_length() for d in list(p.get_partial_shape())[1:]])) * p.get_element_type().size
               for p in caches) / tokens


class ModelSession:
    """One KV cache on a CompiledLM that holds `tokens`. Subclasses implement _infer, _forget and _restart."""

    rollback_method = ""

    def __init__(self, model: CompiledLM):
        self.model = model
        self.request = model.compiled.create_infer_request()
        self.device, self.precision, self.vocab_size = model.device, model.precision, model.vocab_size
        self.max_context, self.output_ids = model.max_context, model.output_ids
        self.block_invariant = model.block_invariant
        # the most tokens one call holds while the session is block-invariant (None: no bound; see longest_block)
        self.longest_call: Optional[int] = getattr(model, "longest_block", LONGEST_BLOCK)
        self.min_block = 1  # widen shorter blocks to this many tokens (see "Fixed block sizes" above)
        self.last_block = 0  # the tokens of the latest call on the device (a widened block's re-fed ones too)
        self.tokens: list[int] = []  # the logical sequence the cache holds
        # the first position fed as one-token sequences (see "One-token sequences" above; None: none is)
        self.sequences_from: Optional[int] = None
        # the positions before this one are (to be) written by the long-prompt prefill model (see "A long prompt's
        # prefill in bf16" above; 0: none is)
        self.copy_end = 0
        # the token ids of the text the chat template writes where an answer starts (see "A chat's turns" above;
        # set by the pipeline, empty: none known)
        self.answer_opening: tuple[int, ...] = ()
        # called with the cache's length after each call of a feed that takes several (a long prompt's pieces): a
        # run's watch of its prompt's prefill (generate.py), which reports progress and stops a cancelled run there
        self.between_calls: Optional[Callable[[int], None]] = None
        self.reset()

    @property
    def compiled(self) -> ov.CompiledModel:
        return self.model.compiled

    @property
    def length(self) -> int:
        return len(self.tokens)

    @property
    def longest_prompt(self) -> Optional[int]:
        """The most tokens a prompt fed to an empty cache may have (None: any that fits max_context)."""
        return None

    @property
    def least_block(self) -> int:
        """The fewest tokens a call feeds: a block-invariant session never feeds a lone token, and a call on the
        long-prompt prefill model holds at least PREFILL_LEAST."""
        if self.prefilling:
            return PREFILL_LEAST
        return 2 if self.block_invariant else 1

    @property
    def prefilling(self) -> bool:
        """Whether the next call runs on the long-prompt prefill model: the session has one and its cache is short
        of the boundary of a long prompt (see "A long prompt's prefill in bf16" above)."""
        return getattr(self.model, "prefill", None) is not None and self.length < self.copy_end

    def begin_long_prefill(self) -> None:
        """Make the calls from here on a long prompt's prefill calls (until a reset), as if a prompt without end
        were being fed: on the long-prompt prefill model where the session has one (its warm-up and its probe)."""
        self.copy_end = self.sequences_from = OPEN_PREFILL

    @property
    def prefilled_long(self) -> bool:
        """Whether the cache's first tokens are (to be) written by the long-prompt prefill model."""
        return self.copy_end > 0

    def prefills_long(self, tokens: list[int]) -> bool:
        """Whether a prompt of these tokens is prefilled (in part) on the long-prompt prefill model."""
        return self.layout(tokens)[0] > 0

    def layout(self, tokens: list[int]) -> tuple[int, Optional[int]]:
        """How a run on a prompt of these tokens feeds each position (see "A chat's turns" above): (copy_end,
        sequences_from): the positions before copy_end on the long-prompt prefill model (0: none), those from
        sequences_from on as one-token sequences (None: none), the others in the block layout on the model itself.
        The sequences start after the end of the prompt's first turn past SEQUENCES_AFTER tokens, or, where the copy
        prefills up to a turn's end, at that end (the copy computes the cache only: the row of a turn's end, which
        gives the answer's first token, is the target's). A position's layout depends only on the tokens up to its
        turn's end, so a conversation's later turns keep the layout of the positions an earlier turn wrote, unless a
        turn holds at least COPY_TURN_SHARE of the prompt up to its end."""
        if not self.takes_sequences or len(tokens) < SEQUENCES_AFTER:
            return 0, None
        starts = answer_starts(tokens, self.answer_opening)
        long = [(start, before) for start, before in zip(starts, [-1] + starts) if start + 1 >= SEQUENCES_AFTER]
        copy_end = 0
        if getattr(self.model, "prefill", None) is not None:
            # the last long turn that holds at least COPY_TURN_SHARE of the prompt up to its end
            copy_end = max((start for start, before in long if start - before >= COPY_TURN_SHARE * (start + 1)),
                           default=0)
        return copy_end, copy_end or long[0][0] + 1

    @property
    def cache_layout(self) -> tuple[int, Optional[int]]:
        """The layout the cache's tokens were fed in, as `layout` gives one: (copy_end, sequences_from)."""
        return self.copy_end, self.sequences_from

    @property
    def longest_block(self) -> Optional[int]:
        """The most tokens the next call holds (see "Long blocks" above; on the long-prompt prefill model, what its
        probe passed with); None: no bound."""
        if self.prefilling:
            return self.copy_call_longest
        return self.longest_call if self.block_invariant else None

    @property
    def copy_call_longest(self) -> int:
        """The most tokens a call on the long-prompt prefill copy holds: what its probe passed with."""
        return self.model.prefill_longest

    @property
    def static_sizes(self) -> frozenset:
        """Block sizes this session runs on a copy compiled for that size (see `CompiledLM.add_static`)."""
        return frozenset()

    @property
    def takes_sequences(self) -> bool:
        """Whether this session feeds the tokens after a long prompt as one-token sequences (see "One-token
        sequences" above): an exact session on a model that passed the probe of that layout."""
        return self.block_invariant and getattr(self.model, "sequences", False)

    def shared_prefix(self, tokens: list[int]) -> int:
        """How many of the cache's tokens a request whose prompt is `tokens` may keep: those it starts with, up to
        the first position the prompt would feed in another layout or on another model than the cache's was (see
        `layout`)."""
        return reusable_prefix(self.tokens, self.cache_layout, tokens, self.layout(tokens))

    def end_prompt(self, tokens: list[int]) -> None:
        """The prompt, these tokens, ends here: the positions from here on take the layout a run on this prompt
        gives them (`layout`), and so do the prompt's tokens still to be fed. The cache must hold at most the
        prompt's tokens, written as this prompt would write them (keep_prefix)."""
        if self.length > len(tokens):
            raise ValueError(f"the cache holds {self.length} tokens, more than the prompt's {len(tokens)}")
        layout = self.layout(tokens)
        if layout_agreement(self.length, self.cache_layout, layout) < self.length:
            raise ValueError("the cache holds tokens fed in another layout than this prompt feeds them: keep_prefix "
                             "first")
        self.copy_end, self.sequences_from = layout

    @property
    def block_floor(self) -> int:
        """The size short blocks are widened to (see "Fixed block sizes" above)."""
        return self.min_block

    def reset(self) -> None:
        self.tokens = []
        self.sequences_from = None
        self.copy_end = 0
        self._restart()

    def feed(self, tokens: list[int], rows: Optional[int] = None) -> np.ndarray:
        """Append tokens to the cache and return the logits of at least the last `rows` of them (default: all),
        shape [rows or more, vocab] (float32). Asking only for the rows you need skips the output layer for the
        rest (most of a prompt): a block-invariant call alone still computes at least 2, so that the output layer
        never runs on a single row (another kernel); in a batched call the rows of all its sessions together
        make the output layer's block, and each session gets just its own."""
        n = len(tokens)
        if n == 0:
            raise ValueError("feed() needs at least one token")
        if self.max_context is not None and self.length + n > self.max_context:
            raise ContextOverflowError(f"{self.length + n} tokens exceed the model's context of {self.max_context}")
        rows = n if rows is None else min(n, rows)
        start = self.sequences_from
        if start is not None and self.length + n > start:
            return self._feed_across(list(tokens), rows, start)
        if self.longest_block and n > self.longest_block:
            return self._feed_in_pieces(list(tokens), rows)
        least = self.least_block
        shortest = least if n >= least and n in self.static_sizes else max(self.block_floor, least)
        widen = max(0, min(shortest - n, self.length))
        block = list(tokens)
        if widen:  # re-feed the last cached tokens, whose cache slots get the same values again
            block = self.tokens[-widen:] + block
            self.rollback(widen)
        # an empty cache has nothing (more) to re-feed: pad the block after the tokens, then forget the pad (a call on
        # the prefill copy is padded up to its alignment the same way)
        pad = max(0, least - len(block), self._aligning_pad(len(block)))
        block += [block[-1]] * pad
        self.last_block = len(block)
        logits = self._widened(self._infer(block, rows + pad))
        self.tokens.extend(block)
        if pad:
            self.rollback(pad)
            logits = logits[:-pad]
        return logits[-rows:] if widen else logits

    def _aligning_pad(self, n: int) -> int:
        """The pad tokens that bring a call of n tokens on the long-prompt prefill copy up to the next multiple of its
        alignment (see PREFILL_PAD_MOST), where the copy's probe covers a call that long and the cache has room for
        them; 0 elsewhere. The copy's rows are the same whatever the size of its calls, and the pads lie after the
        call's own tokens, which do not attend to them: the cache of those tokens is what an unpadded call writes."""
        if not self.prefilling:
            return 0
        pad = self._copy_pad(n)
        return pad if self.length + n + pad <= self.room else 0

    def _copy_pad(self, n: int) -> int:
        """The pad a call of n tokens on the long-prompt prefill copy takes where the cache has room for it."""
        align = self.model.prefill_align
        pad = -n % align
        return 0 if pad > PREFILL_PAD_MOST * align or n + pad > self.copy_call_longest else pad

    @property
    def prefill_reach(self) -> int:
        """How far into the cache the prompt's prefill writes: the end of the prompt's part on the long-prompt
        prefill copy and the pad of the copy's last call (see PREFILL_PAD_MOST; 0 without the copy or the prompt's
        end), within the model's context. A run reserves room for it, so that the pad does not depend on how many
        new tokens the request asks for."""
        if not self.prefilling or self.copy_end == OPEN_PREFILL:
            return 0
        pieces = self._aligned_pieces(list(range(self.copy_end - self.length)), self.copy_call_longest,
                                      self.model.prefill_align)
        reach = self.copy_end + self._copy_pad(len(pieces[-1]))
        return reach if self.max_context is None else min(reach, self.max_context)

    @property
    def room(self) -> int:
        """How many tokens the cache holds without taking more memory."""
        return self.max_context if self.max_context is not None else 1 << 30

    def _widened(self, logits: np.ndarray) -> np.ndarray:
        """Rows of the model's output ids widened to the whole vocabulary (-inf for the ids left out)."""
        if self.output_ids is None:
            return logits
        wide = np.full((len(logits), self.vocab_size), -np.inf, dtype=np.float32)
        wide[:, self.output_ids] = logits
        return wide

    @staticmethod
    def _pieces(tokens: list[int], longest: Optional[int]) -> list[list[int]]:
        """The tokens in even pieces of at most `longest` tokens (each at least 2; one piece where there is no
        bound or they fit)."""
        if not longest or len(tokens) <= longest:
            return [tokens]
        count = -(-len(tokens) // longest)
        bounds = np.linspace(0, len(tokens), count + 1).round().astype(int)
        return [tokens[start:end] for start, end in zip(bounds[:-1], bounds[1:])]

    @staticmethod
    def _aligned_pieces(tokens: list[int], longest: int, align: int) -> list[list[int]]:
        """The tokens in pieces of the largest multiple of `align` up to `longest` tokens, then the rest, which holds
        at least PREFILL_LEAST (the last whole piece hands it `align` tokens where it would hold fewer); even
        pieces (_pieces) where they fit in one call, or where `longest` and `align` leave no room for that."""
        size = longest // align * align
        if len(tokens) <= longest or align < PREFILL_LEAST or size - align < PREFILL_LEAST:
            return ModelSession._pieces(tokens, longest)
        ends = list(range(size, len(tokens), size))
        if len(tokens) - ends[-1] < PREFILL_LEAST:
            ends[-1] -= align
        bounds = [0, *ends, len(tokens)]
        return [tokens[start:end] for start, end in zip(bounds[:-1], bounds[1:])]

    def _feed_parts(self, parts: list[tuple[list[int], Callable[[list[int], int], np.ndarray]]],
                    rows: int) -> np.ndarray:
        """Feed consecutive parts, each by its own feed(tokens, rows); the last `rows` rows of logits, from the
        parts that hold them (the others compute only their fewest rows)."""
        total, end, kept = sum(len(tokens) for tokens, _ in parts), 0, []
        for tokens, feed in parts:
            end += len(tokens)
            wanted = min(len(tokens), rows - (total - end))
            logits = feed(tokens, max(wanted, 1))
            if wanted > 0:
                kept.append(logits[-wanted:])
            if self.between_calls is not None and end < total:
                self.between_calls(self.length)
        return np.concatenate(kept)

    def _feed_blocks(self, tokens: list[int], rows: int) -> np.ndarray:
        """feed(), as a part of _feed_parts."""
        return self.feed(tokens, rows=rows)

    def _feed_in_pieces(self, tokens: list[int], rows: int) -> np.ndarray:
        """Feed a long block in even pieces of at most longest_block tokens (in the block layout), on the long-prompt
        prefill copy in aligned ones (see PREFILL_ALIGN); the last `rows` rows of logits."""
        if self.prefilling:
            pieces = self._aligned_pieces(tokens, self.longest_block, self.model.prefill_align)
        else:
            pieces = self._pieces(tokens, self.longest_block)
        return self._feed_parts([(piece, self._feed_blocks) for piece in pieces], rows)

    def _feed_across(self, tokens: list[int], rows: int, start: int) -> np.ndarray:
        """Feed tokens that reach the sequences layout's boundary `start`: those before it in the block layout,
        the others as one-token sequences, in pieces of at most longest_block tokens; the last `rows` rows."""
        head = max(0, start - self.length)
        if head and self.prefilling and rows > len(tokens) - head:
            raise ValueError(f"a long prompt's prefill copy computes the cache only: ask for at most the last "
                             f"{len(tokens) - head} rows")
        parts = [(tokens[:head], self._feed_blocks)] if head else []
        # (the sequences' pieces are the target's: longest_block is the prefill model's while the head is fed)
        pieces = self._pieces(tokens[head:], self.longest_call if self.block_invariant else None)
        return self._feed_parts(parts + [(piece, self._feed_sequences) for piece in pieces], rows)

    def _feed_sequences(self, tokens: list[int], rows: int) -> np.ndarray:
        """One call of tokens as one-token sequences (see "One-token sequences" above); the last `rows` rows."""
        self.last_block = len(tokens)
        logits = self._widened(self._infer_sequences(tokens, rows))
        self.tokens.extend(tokens)
        return logits[-rows:]

    def sync(self, sequence: list[int], extra: tuple[int, ...] | list[int] = ()) -> np.ndarray:
        """Bring the cache to sequence + extra and return the logits from sequence[-1] on (len(extra) + 1 rows).

        Keeps the longest prefix the cache shares with `sequence` (short of its last token, which is fed again for
        its logits), then feeds the rest in one block. Within one request: the sequences layout's boundary stays
        (see keep_prefix for a new request)."""
        self.rollback(self.length - min(common_prefix(self.tokens, sequence), len(sequence) - 1))
        rows = len(extra) + 1
        return self.feed(sequence[self.length:] + list(extra), rows=rows)[-rows:]

    def keep_prefix(self, tokens: list[int]) -> int:
        """For a new request: forget all but the longest prefix of the cache that `tokens` starts with, short of the
        last token of `tokens` (a call must feed it to get its logits), and of the first position the prompt feeds
        in another layout than the cache's (see shared_prefix). Returns how many tokens are kept."""
        keep = min(self.shared_prefix(tokens), len(tokens) - 1)
        self.truncate(keep)
        if not keep:
            self.copy_end = 0
        return keep

    def rollback(self, n: int) -> None:
        """Forget the last n tokens."""
        if n <= 0:
            return
        if n > self.length:
            raise ValueError(f"cannot roll back {n} tokens from a cache of {self.length}")
        self._forget(n)
        del self.tokens[-n:]

    def truncate(self, length: int) -> None:
        """Keep only the first `length` tokens; down to the sequences layout's boundary or below, the boundary goes
        too (the tokens kept are all in the block layout)."""
        self.rollback(self.length - length)
        if self.sequences_from is not None and length <= self.sequences_from:
            self.sequences_from = None

    def reserve(self, n_tokens: int) -> None:
        """Make room for n_tokens in the cache up front (a hint; the cache also grows on demand)."""

    def _infer(self, tokens: list[int], rows: int) -> np.ndarray:
        raise NotImplementedError

    def _infer_sequences(self, tokens: list[int], rows: int) -> np.ndarray:
        """The logits of the last `rows` tokens, fed as one-token sequences (only where takes_sequences)."""
        raise NotImplementedError

    def _forget(self, n: int) -> None:
        raise NotImplementedError

    def _restart(self) -> None:
        raise NotImplementedError


class BlockPool:
    """The key/value block tensors of a paged model, and which blocks are free.

    A session draws blocks from a pool into its block table (the `block_indices` the IR takes). A pool of its own
    makes a session independent; sessions that share a pool can be verified together in one call (see
    batching.py). Every call that reads or writes the tensors holds `lock`, and so does growing them (new,
    larger tensors, the old blocks copied, handed to every request attached), so a call never writes into
    tensors that are being replaced."""

    def __init__(self, compiled: ov.CompiledModel):
        self.names = [port.get_any_name() for port in compiled.inputs
                      if port.get_any_name().startswith(("key_cache.", "value_cache."))]
        value = next(p for p in compiled.inputs if p.get_any_name().startswith("value_cache."))
        self.block_size = value.get_partial_shape()[2].get_length()
        self.lock = threading.RLock()
        self.tensors: dict[str, ov.Tensor] = {}
        self.requests: list[tuple[ov.InferRequest, Optional[ov.Type]]] = []  # and the element type each reads
        self.free: list[int] = []
        self.capacity = 0
        self._scratch: Optional[int] = None

    @property
    def scratch(self) -> int:
        """A block of no session's table, for the pad sequences of the one-token-sequences layout (session.py):
        each writes token 0 at position 0 there, the same values every time."""
        with self.lock:
            if self._scratch is None:
                self._scratch = self.allocate(1)[0]
            return self._scratch

    def attach(self, request: ov.InferRequest, reads_as: Optional[ov.Type] = None) -> None:
        """Let a request run on this pool's tensors (now and after they grow); reads_as: it sees them as this
        element type of the same size (a long prompt's bf16 prefill copy on f16 blocks, see prefill_blocks.py)."""
        with self.lock:
            self.requests.append((request, reads_as))
            for name, tensor in self.tensors.items():
                request.set_tensor(name, _seen_as(tensor, reads_as))

    def detach(self, requests: list) -> None:
        """Stop handing these requests the pool's tensors (a session's, when it goes: a pool shared by an engine's
        sessions outlives them)."""
        gone = {id(request) for request in requests if request is not None}
        with self.lock:
            self.requests = [(request, seen) for request, seen in self.requests if id(request) not in gone]

    def allocate(self, n: int) -> list[int]:
        """n free block ids (the tensors grow, doubling, when too few are free)."""
        with self.lock:
            if len(self.free) < n:
                self._grow(max(2 * self.capacity, self.capacity + n - len(self.free)))
            taken, self.free = self.free[:n], self.free[n:]
            return taken

    def release(self, blocks: list[int]) -> None:
        with self.lock:
            self.free.extend(blocks)

    def _grow(self, blocks: int) -> None:
        for name in self.names:  # the first attached request's tensors give the element types and block shapes
            old = self.tensors[name] if name in self.tensors else self.requests[0][0].get_tensor(name)
            tensor = ov.Tensor(old.get_element_type(), [blocks] + list(old.get_shape())[1:])
            if self.capacity:
                tensor.data[:self.capacity] = old.data[:self.capacity]
            self.tensors[name] = tensor
            for request, reads_as in self.requests:
                request.set_tensor(name, _seen_as(tensor, reads_as))
        self.free.extend(range(self.capacity, blocks))
        self.capacity = blocks


def _seen_as(tensor: ov.Tensor, element_type: Optional[ov.Type]) -> ov.Tensor:
    """The tensor, or one on its memory that holds another element type of the same size."""
    if element_type is None or element_type == tensor.get_element_type():
        return tensor
    return ov.Tensor(tensor.data, tensor.get_shape(), element_type)


class PagedSession(ModelSession):
    """The paged-attention IR: the session's KV blocks come from a BlockPool; rollback is a smaller past length.

    With a scheduler (batching.Scheduler, set by the engine), its calls go through it: short blocks of sessions
    that share the pool are verified together in one call."""

    rollback_method = "paged"

    def __init__(self, model: CompiledLM, pool: Optional[BlockPool] = None):
        self.picks_rows = any(LOGITS_ROWS in port.get_names() for port in model.compiled.inputs)
        self.pool = pool or BlockPool(model.compiled)
        self.block_size = self.pool.block_size
        self.blocks: list[int] = []  # the block table: this session's blocks in the pool, in order
        self.scheduler = None
        self._static: dict[int, ov.InferRequest] = {}  # this session's requests on the model's static copies
        # its request on the long-prompt prefill model, which runs on the session's own blocks, the tokens of the
        # cache in the copy's element type where it reads them as another (see "A long prompt's prefill in bf16"
        # above, and prefill_blocks.py), and what converting them for the target kept aside
        self._prefill: Optional[ov.InferRequest] = None
        self._copy_written = 0
        self._kept_aside: Optional[KeptAside] = None
        self._x: dict[int, dict[str, np.ndarray]] = {}  # see _inputs
        super().__init__(model)
        self.pool.attach(self.request)

    def __del__(self) -> None:
        pool, blocks = getattr(self, "pool", None), getattr(self, "blocks", None)
        if pool is not None:
            if blocks:
                pool.release(blocks)
            pool.detach([getattr(self, "request", None), getattr(self, "_prefill", None),
                         *getattr(self, "_static", {}).values()])

    @property
    def static_sizes(self) -> frozenset:
        return frozenset(self.model.static)

    @property
    def block_floor(self) -> int:
        """min_block while this session's calls run alone; none while other sessions generate too: then its
        blocks go into batched calls, whose shape changes with every batch anyway and whose every row costs its
        logits."""
        return self.min_block if self.runs_alone else 1

    @property
    def copy_call_longest(self) -> int:
        """What the copy's probe passed with while this session's calls run alone; at most PREFILL_SHARED_LONGEST
        while other sessions generate too (the copy's bits are the same for every call size up to that)."""
        longest = self.model.prefill_longest
        return longest if self.runs_alone else min(longest, PREFILL_SHARED_LONGEST)

    @property
    def runs_alone(self) -> bool:
        """No other session of its engine's scheduler generates (or it has none)."""
        return self.scheduler is None or self.scheduler.active <= 1

    @property
    def room(self) -> int:
        """How many tokens the blocks this session holds take (at most the model's context)."""
        return min(len(self.blocks) * self.block_size, super().room)

    def add_static(self, sizes) -> None:
        """Give the model static copies for these block sizes (see `CompiledLM.add_static`); resets the session."""
        self.model.add_static(sizes)
        self.reset()

    def _request(self, n: int) -> ov.InferRequest:
        """The request a call of n tokens runs on: this session's request on the long-prompt prefill model while it
        prefills a long prompt, else on the static copy for n, if the model has one (each created on first use,
        sharing this session's KV blocks), else the dynamic one."""
        if self.prefilling:
            if self._prefill is None:
                self._prefill = self.model.prefill.create_infer_request()
                self.pool.attach(self._prefill, self.model.prefill_reads_as)
            return self._prefill
        copy = self.model.static.get(n)
        if copy is None:
            return self.request
        request = self._static.get(n)
        if request is None:
            request = self._static[n] = copy.create_infer_request()
            self.pool.attach(request)
        return request

    def _restart(self) -> None:
        # the blocks stay in the table for the next tokens; each call takes more as it needs them, and writes them
        # afresh: none holds the copy's values any more
        self._copy_written, self._kept_aside = 0, None

    @property
    def copy_state(self) -> tuple[int, Optional[KeptAside]]:
        """Where the long-prompt prefill copy's values stand in the blocks (prefill_blocks.py): how many tokens' blocks
        hold them as the copy wrote them, and what converting the others for the target kept aside (None: nothing
        converted). A copy of the cache carries both (serve/prefix_store.py)."""
        return self._copy_written, self._kept_aside

    @copy_state.setter
    def copy_state(self, state: tuple[int, Optional[KeptAside]]) -> None:
        self._copy_written, self._kept_aside = state

    def reserve(self, n_tokens: int) -> None:
        """Take enough blocks from the pool to hold n_tokens (doubling the table, so that this is rare). A session
        that takes the one-token-sequences layout takes its pool's scratch block first, so that the pads' block
        never doubles a pool sized to a run."""
        if self.takes_sequences:
            _ = self.pool.scratch  # taken on first use: here, before the run's blocks
        _reserve(self.pool, self.blocks, n_tokens)

    def _hand_over(self, on_copy: bool, past: int) -> None:
        """Before a call that reads the cache's first `past` tokens: those the prefill copy wrote in the element type
        of the model the call runs on, where the copy reads the blocks as another (see prefill_blocks.py): converted
        for the target once the copy's calls end, back for the copy when it goes on after them."""
        if self.model.prefill_reads_as is None:
            return
        try:
            if on_copy and self._kept_aside is not None:
                if past > self._kept_aside.positions:  # the target wrote tokens there: the copy cannot go on after them
                    raise ValueError(f"the prefill copy goes on at {past} after {self._kept_aside.positions} tokens")
                to_copy(self.pool, self.blocks, self._kept_aside, past, self.model.threads)
                self._kept_aside, self._copy_written = None, past
            elif not on_copy and self._copy_written:
                self._kept_aside = to_target(self.pool, self.blocks, min(past, self._copy_written), self.model.threads)
                self._copy_written = 0
        except BaseException:  # a conversion cut short leaves blocks of either type: the cache is not kept
            self.reset()
            raise

    def _infer(self, tokens: list[int], rows: int) -> np.ndarray:
        if self.scheduler is not None and not self.prefilling:  # a batch runs on one model: a prefill runs alone
            return self.scheduler.infer(self, tokens, rows)
        return self.infer_alone(tokens, rows)

    def infer_alone(self, tokens: list[int], rows: int) -> np.ndarray:
        """One call for this session's block alone (its static copy for the size, if any; logits for the last
        `rows` tokens only)."""
        past, n = self.length, len(tokens)
        total, rows = past + n, max(rows, self.least_block)
        self.reserve(total)
        used = -(-total // self.block_size)
        request = self._request(n)
        prefilling = request is self._prefill
        self._hand_over(prefilling, past)
        x = self._inputs(request, n, used, rows)
        x["input_ids"][:] = tokens
        x["position_ids"][:] = np.arange(past, total)
        x["past_lens"][0] = past
        x["block_indices"][:] = self.blocks[:used]
        x["block_indices_begins"][1] = used
        x["max_context_len"][...] = total
        if self.picks_rows:
            x[LOGITS_ROWS][:] = np.arange(n - rows, n)
        with self.pool.lock:
            request.infer()
            logits = request.get_tensor("logits").data
            logits = logits.reshape(len(logits), -1)[-rows:].copy()
        if prefilling:
            self._copy_written = total
        return logits

    def _infer_sequences(self, tokens: list[int], rows: int) -> np.ndarray:
        if self.scheduler is not None:
            return self.scheduler.infer(self, tokens, rows, sequences=True)
        return self.infer_sequences(tokens, rows)

    def block_sequence(self, tokens: list[int]) -> tuple[list[int], int, np.ndarray]:
        """This session's tokens as one sequence after its past (the block layout), as `sequences` gives them:
        (its tokens, its past length, its block table). Reserves the blocks they need."""
        past = self.length
        self.reserve(past + len(tokens))
        self._hand_over(False, past)
        return tokens, past, np.asarray(self.blocks[:-(-(past + len(tokens)) // self.block_size)], np.int32)

    def sequences(self, tokens: list[int]) -> list[tuple[list[int], int, np.ndarray]]:
        """This session's tokens as one-token sequences after its past, each (its token, its past length, its block
        table): the same table, as long as each position needs. Reserves the blocks they need."""
        past = self.length
        self.reserve(past + len(tokens))
        self._hand_over(False, past)
        blocks = np.asarray(self.blocks, np.int32)
        return [([token], p, blocks[:-(-(p + 1) // self.block_size)])
                for p, token in enumerate(tokens, start=past)]

    def infer_sequences(self, tokens: list[int], rows: int) -> np.ndarray:
        """One call for this session's tokens alone as one-token sequences, with the pad sequences they need (see
        "One-token sequences" above); the logits of the last `rows` tokens, of at least 2 rows computed (the output
        layer never runs on a single row: a pad's row makes the second where need be). On the dynamic model: a
        static copy is compiled for one number of tokens."""
        n = len(tokens)
        pads = sequence_pads(n, n, self.model.threads)
        x = call_inputs(self.sequences(tokens), pads, self.pool.scratch)
        computed = max(rows, 2)
        picked = np.arange(n - computed, n) if computed <= n else np.arange(computed)
        if self.picks_rows:
            x[LOGITS_ROWS] = picked
        for name, array in x.items():  # new tensors: the block layout's are bound again on its next call
            self.request.set_tensor(name, ov.Tensor(array, shared_memory=True))
        self._x.pop(id(self.request), None)
        first = int(picked[0]) if self.picks_rows else 0  # the position of the logits' first row
        with self.pool.lock:
            self.request.infer()
            logits = self.request.get_tensor("logits").data
            return logits.reshape(len(logits), -1)[n - rows - first:n - first].copy()

    def _inputs(self, request: ov.InferRequest, n: int, used: int, rows: int) -> dict[str, np.ndarray]:
        """The request's input tensors as numpy views, written in place each call (handing OpenVINO a dict of
        new arrays costs as much again as a small model's whole step); new ones only when a shape changes."""
        x, fresh = self._x.setdefault(id(request), {}), {}
        if not x:
            fresh.update(past_lens=np.zeros(1, np.int32), block_indices_begins=np.zeros(2, np.int32),
                         max_context_len=np.zeros((), np.int32))
        if len(x.get("input_ids", ())) != n:
            fresh.update(input_ids=np.zeros(n, np.int64), position_ids=np.zeros(n, np.int64),
                         subsequence_begins=np.array([0, n], np.int32))
        if self.picks_rows and len(x.get(LOGITS_ROWS, ())) != rows:
            fresh[LOGITS_ROWS] = np.zeros(rows, np.int64)
        if len(x.get("block_indices", ())) != used:
            fresh["block_indices"] = np.zeros(used, dtype=np.int32)
        for name, array in fresh.items():
            request.set_tensor(name, ov.Tensor(array, shared_memory=True))
        x.update(fresh)
        return x

    def _forget(self, n: int) -> None:
        pass  # the next call passes a smaller past length; the stale slots are overwritten


class MaskedSession(ModelSession):
    """The stateful IR with attention-mask rollback and occasional compaction."""

    rollback_method = "masked"

    def __init__(self, model: CompiledLM):
        self._beam_idx = np.zeros(1, dtype=np.int32)
        self._flags = np.zeros(0, dtype=np.int64)  # one 0/1 per physical cache slot
        super().__init__(model)

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


# rollback method -> the function that compiles a model for it, for the methods a module of its own runs: npu.py
# adds "npuw" when imported (the runtime package imports it); called as opener(core, model, device, max_context=,
# config=, npu_max_prompt=, npu_generation_tokens=)
OPENERS: dict[str, Callable[..., CompiledLM]] = {}


def default_rollback(device: str) -> str:
    """The device profile's rollback: paged attention where OpenVINO runs it (CPU, GPU), the stateful IR on the NPU."""
    return profile(device).rollback


def checked_rollback(device: str, rollback: str, precision: str) -> str:
    """The rollback method, checked to exist and to run on the device (and the precision to exist)."""
    if rollback not in ROLLBACK_METHODS:
        raise EdgeSpecdecError(f"unknown KV rollback method {rollback!r}: choose one of "
                               f"{', '.join(ROLLBACK_METHODS)}.")
    if precision not in PRECISIONS:
        raise EdgeSpecdecError(f"unknown precision {precision!r}: choose one of {', '.join(PRECISIONS)}.")
    if (rollback == "npuw") != (profile(device).kind == "NPU"):
        raise EdgeSpecdecError(
            f"the {rollback} KV rollback does not run on {device}: on the NPU, OpenVINO's NPU LLM pipeline owns the "
            f"KV cache and only the npuw rollback (by position ids) works there, and it works nowhere else. Leave "
            f"--kv-rollback out to get each device's own.")
    return rollback


def open_model(model_xml: Path, device: str = "CPU", *, core: Optional[ov.Core] = None,
               max_context: Optional[int] = None, rollback: Optional[str] = None, precision: str = "dq",
               block_invariant: bool = True, output_ids: Optional[np.ndarray] = None,
               config: Optional[dict[str, Any]] = None, known_invariant: Optional[dict] = None,
               known_longest: Optional[dict] = None, known_sequences: Optional[dict] = None,
               npu_max_prompt: int = NPU_MAX_PROMPT, npu_generation_tokens: int = DRAFT_GENERATION_TOKENS,
               kv_cache: Optional[str] = None, prefill_precision: Optional[str] = None,
               known_prefill: Optional[dict] = None, known_prefill_ratio: Optional[dict] = None) -> CompiledLM:
    """Compile one model for decoding.

    rollback: "paged", "masked" or "npuw" (default: the device's profile; the NPU takes only "npuw", see npu.py,
    with prompts of up to npu_max_prompt tokens and generate calls of npu_generation_tokens tokens). precision:
    "dq" or "f32" (where the device has the setting; a masked model always runs f32). block_invariant: sessions
    must give a block of tokens the logits of single steps (the target needs this; a draft does not). For a paged
    model that is checked on the device, trying the profile's precisions in order ("dq" falls back to "f32"); if
    none passes, the model is exact only up to float noise, and its runs say so (`Result.exact`).
    known_invariant: the outcome of that check per precision from an earlier process on this machine (see
    measurements.py); filled with what is measured. known_longest: the same for the longest exact call per
    precision (see "Long blocks" above), measured before the check, whose prefill it sets; a verdict is reused only
    with the longest call it was measured with, so where that is measured again, so is the verdict. known_sequences:
    the same for the one-token-sequences layout (see "One-token sequences" above; probed on an exact CPU model): a
    model that fails it stays exact in the block layout.
    output_ids: compute logits for these token ids only (a draft's smaller output layer, see keep_output_rows);
    the others come out as -inf.
    kv_cache: the KV cache's element type, f32, f16 or u8 (devices.KV_CACHES; None: the device's, f16 on the CPU
    and GPU). One that fails the block-invariance check (u8) leaves the model exact only up to float noise, and
    `CompiledLM.exactness_note` says why.
    prefill_precision: also compile a copy at this precision (devices.PREFILL_PRECISIONS) that prefills long prompts
    (see "A long prompt's prefill in bf16" above), on an exact model that takes the one-token-sequences layout,
    kept if the device computes at that precision and the copy passes its probe (known_prefill: that probe's
    verdict per precision, from an earlier process, filled with what is measured); "auto": AUTO_PREFILL where it
    pays (see `_auto_prefill_may_pay`; known_prefill_ratio: the copy's timing per precision, the same way);
    `CompiledLM.prefill_note` says why one is not kept.
    """
    core = core or ov.Core()
    device_profile = profile(device)
    rollback = checked_rollback(device, rollback or device_profile.rollback, precision)
    if kv_cache is not None and kv_cache not in KV_CACHES:
        raise EdgeSpecdecError(f"unknown KV cache type {kv_cache!r}: choose one of {', '.join(KV_CACHES)}.")
    if not device_profile.kv_cache or rollback == "npuw":
        kv_cache = None  # the NPU's pipeline keeps its own cache
    if rollback == "masked":
        precision = "f32"
    if prefill_precision not in (None, "auto", *PREFILL_PRECISIONS):
        raise EdgeSpecdecError(f"unknown prefill precision {prefill_precision!r}: choose one of auto, "
                               f"{', '.join(PREFILL_PRECISIONS)}.")
    model = core.read_model(str(model_xml))
    if rollback in OPENERS:
        lm = OPENERS[rollback](core, model, device, max_context=max_context, config=config,
                               npu_max_prompt=npu_max_prompt, npu_generation_tokens=npu_generation_tokens)
        lm.prefill_note = _needs_exact(prefill_precision)
        return lm
    vocab_size = model.output("logits").get_partial_shape()[-1].get_length()
    output_ids, config = _prepare_graph(model, rollback, device_profile.kind, vocab_size, output_ids, config)
    int4_group = int4_group_size(model)
    checks = known_invariant if known_invariant is not None else {}
    longest = known_longest if known_longest is not None else {}
    sequences = known_sequences if known_sequences is not None else {}
    first = None  # the precision asked for (the fastest), kept when none passes the check
    for attempt in device_profile.precision_attempts(precision):
        cfg = {**device_profile.precision_properties(attempt, int4_group), **(config or {}),
               **({"KV_CACHE_PRECISION": kv_cache} if kv_cache else {})}
        compile_static = partial(compile_for_block, core, model, device, cfg) if rollback == "paged" else None
        lm = CompiledLM(core.compile_model(model, device, cfg), rollback, device, attempt, max_context,
                        block_invariant=block_invariant and rollback == "paged", vocab_size=vocab_size,
                        output_ids=output_ids, compile_static=compile_static)
        lm.kv_cache = kv_cache or device_profile.kv_cache
        lm.weights_file = Path(model_xml).with_suffix(".bin")
        # the CPU plugin's PagedAttention takes one-token sequences in a loop of their own (see "One-token
        # sequences" above), if the layout's probe below passes
        lm.sequences = lm.block_invariant and device_profile.kind == "CPU"
        if not lm.block_invariant:
            lm.prefill_note = _needs_exact(prefill_precision)
            return lm
        measure_longest = type(longest.get(attempt)) is not int
        passed = None if measure_longest else checks.get(attempt)  # a verdict holds for the longest call it had
        lm.longest_block = longest.get(attempt, LONGEST_BLOCK)
        probe = None
        if passed is None:
            # the probe's first call repacks the weights, their mapped pages given back as it goes, before its
            # long past takes memory for its KV cache (LONG_PAST tokens)
            probe = lm.session()
            with releasing_mapped(lm.weights_file):
                probe.feed([0, 0], rows=1)
            if measure_longest:
                lm.longest_block = longest_exact_call(probe)
            probe.longest_call = lm.longest_block
            passed = passes_block_invariance(probe)
            # both are the machine's, for later processes; but a short context leaves the longest sizes untried,
            # and what it found then is this model's only: neither is kept
            if context_cuts_the_probe(max_context) and measure_longest:
                checks.pop(attempt, None)
            else:
                longest[attempt], checks[attempt] = lm.longest_block, passed
        if passed is True and lm.sequences:  # an exact model: may it feed one-token sequences after long prompts?
            known = sequences.get(attempt)
            if type(known) is bool:
                lm.sequences = known
            else:
                if probe is None:
                    probe = lm.session()
                    probe.longest_call = lm.longest_block
                with releasing_mapped(lm.weights_file):
                    lm.sequences = passes_sequences_layout(probe)
                sequences[attempt] = lm.sequences  # (the cache's key holds the bundle: its context too)
        if probe is not None:
            del probe  # its KV cache, which held that past, is freed here, and the heap gives its pages back
            trim_heap()
            release_mapped(lm.weights_file)
        if passed is True:  # a verdict passes only as a boolean true (a cached "no" is not one)
            known = known_prefill if known_prefill is not None else {}
            ratios = known_prefill_ratio if known_prefill_ratio is not None else {}
            auto = prefill_precision == "auto"
            wanted = AUTO_PREFILL if auto else prefill_precision
            if not lm.sequences:
                lm.prefill_note = _needs_exact(prefill_precision)
            elif wanted and (not auto or _auto_prefill_may_pay(lm, core, device, known, ratios)):
                _add_prefill(lm, core, model, device, {**cfg, **PREFILL_PRECISIONS[wanted]}, wanted, known,
                             ratios if auto else None)
            return lm
        first = first or lm
    lm = first  # no precision passed the bitwise check: exact up to float noise, like "masked"
    lm.block_invariant = False
    lm.prefill_note = _needs_exact(prefill_precision)
    lm.exactness_note = (f"the target's {lm.kv_cache} KV cache is not block-invariant on {device}" if kv_cache
                         else f"the target is not block-invariant on {device}")
    return lm


def _needs_exact(prefill_precision: Optional[str]) -> str:
    """Why a model that is not an exact paged CPU model taking the one-token-sequences layout has no prefill copy
    (none asked for: "")."""
    if not prefill_precision:
        return ""
    precision = AUTO_PREFILL if prefill_precision == "auto" else prefill_precision
    return (f"a {precision} prefill needs an exact paged model on the CPU that takes the one-token-sequences layout "
            f"after long prompts")


# the CPU plugin's OPTIMIZATION_CAPABILITIES entry of each prefill precision
CPU_CAPABILITY = {"bf16": "BF16", "f32": "FP32"}


def _auto_prefill_may_pay(lm: CompiledLM, core: ov.Core, device: str, known: dict, ratios: dict) -> bool:
    """Whether the default ("auto") long-prompt prefill compiles its AUTO_PREFILL copy for this exact CPU model: for a
    target of at least AUTO_PREFILL_BYTES of weights (a smaller one prefills quickly anyway, and the copy holds its
    weights again), on a CPU with that arithmetic, on an f16 KV cache (the one the copy shares), and
    unless this machine has already found the copy failing its probe or too slow to pay for its memory (known, ratios:
    see _add_prefill). Otherwise says why in lm.prefill_note and compiles nothing."""
    ratio = ratios.get(AUTO_PREFILL)
    why = ""
    if lm.weights_file.stat().st_size < AUTO_PREFILL_BYTES:
        why = f"a target under {AUTO_PREFILL_BYTES >> 20} MB prefills quickly without it"
    elif CPU_CAPABILITY[AUTO_PREFILL] not in core.get_property(device, "OPTIMIZATION_CAPABILITIES"):
        why = f"{device} has no {AUTO_PREFILL} arithmetic"
    elif lm.kv_cache != "f16":
        why = f"the {lm.kv_cache} KV cache does not take a {AUTO_PREFILL} copy's"
    elif known.get(AUTO_PREFILL) is False:
        why = (f"the {AUTO_PREFILL} copy did not compile or pass its probe on this machine (--long-prompt-precision "
               f"{AUTO_PREFILL} says why)")
    elif ratio is not None and ratio > AUTO_PREFILL_RATIO:
        why = _too_slow(ratio)
    if why:
        lm.prefill_note = f"no {AUTO_PREFILL} prefill copy: {why}"
    return not why


def _too_slow(ratio: float) -> str:
    """Why auto drops a copy whose prefill took `ratio` of the target's time."""
    return (f"it prefilled in {ratio:.2f}x the target's time on this machine, more than the {AUTO_PREFILL_RATIO}x "
            f"that pays for its memory (--long-prompt-precision {AUTO_PREFILL} keeps it)")


def _add_prefill(lm: CompiledLM, core: ov.Core, model: ov.Model, device: str, cfg: dict, precision: str,
                 known: dict, ratios: Optional[dict] = None) -> None:
    """Give an exact model its long-prompt prefill copy at `precision` (see "A long prompt's prefill in bf16"
    above), compiled with cfg, if the device computes at that precision and the copy passes its probe (known: the
    probe's verdict per precision from an earlier process, filled with what is measured). ratios: keep it only if it
    prefills in at most AUTO_PREFILL_RATIO of the target's time (ratios[precision], measured once, the same way). The
    copy computes the cache only: its output layer keeps PREFILL_OUTPUT_IDS token ids (its rows are never read)."""
    def refuse(note: str) -> None:
        """No copy, and why; auto remembers the machine's no (as the probe's), so later loads compile none."""
        lm.prefill_note = note
        if ratios is not None:
            known[precision] = False

    model = model.clone()
    keep_output_rows(model, np.arange(PREFILL_OUTPUT_IDS))  # where the layer has another form it stays whole
    try:
        compiled = core.compile_model(model, device, cfg)
    except RuntimeError as error:  # such as the CPU plugin refusing a bf16 model an f32 cache
        reason = str(error).strip().splitlines()[-1]
        kv_cache = cfg.get("KV_CACHE_PRECISION", "f16")
        fix = f"; with the target's {kv_cache} KV cache: --kv-cache f16 takes it" if kv_cache != "f16" else ""
        return refuse(f"the {precision} copy does not compile on {device} ({reason}{fix}): long prompts are "
                      f"prefilled as before")
    hint = compiled.get_property("INFERENCE_PRECISION_HINT")
    computed = hint.to_string() if hasattr(hint, "to_string") else str(hint)
    wanted = cfg.get("INFERENCE_PRECISION_HINT")
    if wanted and computed != wanted:
        return refuse(f"{device} has no {precision} arithmetic ({computed}): long prompts are prefilled as before")
    if [p.get_partial_shape() for p in _cache_inputs(compiled)] != \
            [p.get_partial_shape() for p in _cache_inputs(lm.compiled)]:
        return refuse(f"the {precision} copy's KV blocks have another shape: long prompts are prefilled as before")
    # the copy runs on the target's own blocks: of its element type, or bf16 on f16 ones (prefill_blocks.py)
    types = {(p.get_element_type(), q.get_element_type())
             for p, q in zip(_cache_inputs(compiled), _cache_inputs(lm.compiled))}
    if not (all(theirs == ours for theirs, ours in types) or types == {(ov.Type.bf16, ov.Type.f16)}):
        theirs, ours = sorted((pair for pair in types if pair[0] != pair[1]), key=str)[0]
        return refuse(f"the {precision} copy writes its KV cache in {theirs}, which the target's {ours} blocks do "
                      f"not hold (--kv-cache f16 takes it): long prompts are prefilled as before")
    # the calls tried, longest first: those the probe can test whole in the model's context
    sizes = [n for n in sorted({*PREFILL_CALL_SIZES, lm.longest_block}, reverse=True)
             if prefill_call_fits(n, lm.max_context)]
    if not sizes:
        return refuse(f"the target's context of {lm.max_context} tokens is too short to probe the {precision} copy's "
                      f"calls: long prompts are prefilled as before")
    lm.prefill_reads_as = ov.Type.bf16 if types == {(ov.Type.bf16, ov.Type.f16)} else None
    lm.prefill, lm.prefill_precision = compiled, precision
    verdict = known.get(precision)  # the longest call it passed with, or False
    if verdict is not False and verdict not in sizes:
        probe = lm.session()
        probe.longest_call = lm.longest_block
        verdict = False
        with releasing_mapped(lm.weights_file):
            for longest in sizes:
                lm.prefill_longest = longest  # the probe's calls of that many tokens go to the copy whole
                if passes_prefill_calls(probe, longest):
                    verdict = longest
                    break
        known[precision] = verdict
        del probe
        trim_heap()
    lm.prefill_longest = verdict or 0
    if verdict and ratios is not None and precision not in ratios:
        probe = lm.session()
        tokens = PREFILL_TIMED_CALLS * verdict
        if lm.max_context:
            tokens = min(tokens, lm.max_context - CONTEXT_ROOM)
        with releasing_mapped(lm.weights_file):
            ratios[precision] = round(prefill_copy_ratio(probe, tokens), 3)
        del probe
        trim_heap()
    if not verdict:
        lm.prefill_note = (f"the {precision} prefill copy gives other rows in calls of other sizes on {device}: long "
                           f"prompts are prefilled as before")
    elif ratios is not None and ratios[precision] > AUTO_PREFILL_RATIO:
        lm.prefill_note = f"no {precision} prefill copy: {_too_slow(ratios[precision])}"
    else:
        return
    lm.prefill, lm.prefill_precision, lm.prefill_reads_as, lm.prefill_longest = None, "", None, 0


def _cache_inputs(compiled: ov.CompiledModel) -> list:
    """A paged model's key/value cache inputs, in order."""
    return [p for p in compiled.inputs if p.get_any_name().startswith(("key_cache.", "value_cache."))]


def _prepare_graph(model: ov.Model, rollback: str, device_kind: str, vocab_size: int,
                   output_ids: Optional[np.ndarray], config: Optional[dict[str, Any]]
                   ) -> tuple[Optional[np.ndarray], Optional[dict[str, Any]]]:
    """Rewrite a model's graph before it compiles: a smaller output layer (output_ids, or None where it cannot
    be cut) and, for paged rollback, PagedAttention with logits for the rows asked for. Returns the output ids
    kept and the compile properties to use."""
    if output_ids is not None:
        output_ids = np.unique(np.asarray(output_ids, dtype=np.int64))
        if len(output_ids) >= vocab_size or not keep_output_rows(model, output_ids):
            output_ids = None  # nothing to leave out, or an output layer of another shape: keep it whole
    if rollback == "paged" and device_kind == "CPU":
        # OpenVINO's CPU plugin cannot import the cached blob of a paged model: the blob loses the runtime info
        # of its PagedAttention nodes (k_head_size, num_k_heads), so the import fails, the model is compiled
        # again and the blob rewritten, every time (test_paged_blob_import_still_fails watches for a fix).
        # Writing it is pure cost (a gigabyte for a 1.5B model): no cache for these.
        config = {key: value for key, value in (config or {}).items() if key != "CACHE_DIR"}
    if rollback == "paged":
        from openvino._offline_transformations import paged_attention_transformation  # private API, pinned
        paged_attention_transformation(model)
        compute_logits_rows(model)
    return output_ids, config


def open_session(model_xml: Path, device: str = "CPU", **options) -> ModelSession:
    """A session on a model compiled for it alone (tests and tools; the Engine shares one model among sessions)."""
    return open_model(model_xml, device, **options).session()
