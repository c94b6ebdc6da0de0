"""Measurements of a session on its device: block invariance (exactness), and what steps and block sizes cost.

Each runs on a scratch context and leaves the session empty."""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Optional

import numpy as np

# the past of the long block-invariance probe: attention kernels may take other paths for a long context (split
# across threads, another tiling), and prompts of documents or tool schemas reach thousands of tokens
LONG_PAST = 8192
# the past of the probe after a real prefill: a prompt longer than a few dozen tokens is prefilled in long calls,
# whose kernels may write K/V (and attend) otherwise than short calls do, which a copied past cannot show
REAL_PAST = 160
# The call sizes longest_exact_call tries, ascending. The CPU plugin picks its matmul kernels by the number of rows:
# on an AVX2 CPU the real 1.5B int4 target's rows change bits beyond about 80 tokens a call; on a Xeon with AMX they
# stay the same up to 1024 at least. A long prompt is fed in pieces of the longest exact size (session.py, "Long
# blocks"): fewer, larger calls cost less per token on the Xeon. The probe's own cost grows with the largest size
# (its reference rows come from calls of SHORT_CALL tokens), which is why it stops at 256.
CALL_SIZES = (16, 32, 64, 128, 256)
# the calls the reference rows of longest_exact_call are fed in: sizes the block-invariance probe covers
SHORT_CALL = 8


@contextmanager
def _scratch(session, longest: int):
    """A scratch context of 4 random tokens for timing calls of up to `longest` tokens: yields timed(n), the
    seconds of one call of n tokens (rolled back after), and leaves the session empty and as it was set. The
    calls run alone even on a batching engine (a measurement of a batched call would time the others' blocks)."""
    saved, session.min_block = session.min_block, 1
    scheduler = getattr(session, "scheduler", None)
    if scheduler is not None:
        session.scheduler = None
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
        if scheduler is not None:
            session.scheduler = scheduler
        session.reset()


def step_seconds(session, reps: int = 8) -> float:
    """The median seconds of one single-token step after a short context (the first two calls warm up)."""
    with _scratch(session, 1) as timed:
        return float(np.median([timed(1) for _ in range(reps + 2)][2:]))


def fixed_block_pays(session, size: int, reps: int = 5) -> bool:
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


def cheapest_step(session, reps: int = 4, margin: float = 0.97) -> int:
    """The number of tokens a single step should take: the least a call may have (2 in a block-invariant
    session), or one more when that is cheaper by more than the margin, measured in a row on the device.

    The CPU plugin picks its matmul kernels by the number of rows, and more rows are not always slower (on
    Qwen2.5-1.5B int4 a block of 3 tokens is cheaper than a block of 2). Only for paged sessions (a masked
    session would keep every re-fed slot).
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


def prefill_copy_ratio(session, tokens: int, reps: int = 1) -> float:
    """The time a long prompt's prefill copy (session.py, "A long prompt's prefill in bf16") takes to feed `tokens`
    random tokens on an empty cache, as a share of the time the target's own prefill takes (in calls of its longest
    exact block): the least of `reps` interleaved runs of each, after one of each uncounted (a first call may repack
    weights). A run of a long prompt is seconds long, so one counted run of each is the default. Leaves the session
    empty."""
    ids = np.random.default_rng(3).integers(0, session.vocab_size, tokens).tolist()
    seconds: dict[bool, list[float]] = {True: [], False: []}
    try:
        for _ in range(reps + 1):
            for on_copy, runs in seconds.items():
                session.reset()
                if on_copy:
                    session.begin_long_prefill()
                start = time.perf_counter()
                session.feed(ids, rows=1)
                runs.append(time.perf_counter() - start)
    finally:
        session.reset()
    return min(seconds[True][1:]) / min(seconds[False][1:])


def fill_past(session, past: int, seed_tokens: int = 64, copy: bool = True) -> None:
    """Put a context of about `past` tokens into an empty paged session cheaply: a short real prefill of
    seed_tokens random tokens, whose KV blocks are then copied along the block table up to `past` (rounded down
    to whole blocks), the last block computed for real. The copies are not what the model would compute there
    (their positions repeat), but the
    attention kernels see a cache of that length with realistic values in the cache's own format (quantization
    scales included), which is what a probe of the kernels' paths at a long past needs, for the cost of one short
    call instead of a prefill of thousands of tokens. Other sessions (masked, NPU), and copy=False, get the real
    prefill.
    It does not reproduce what a real prefill writes (a long call's K/V may differ from a short call's in the last
    bits): passes_block_invariance probes after a real prefill of REAL_PAST tokens for that."""
    rng = np.random.default_rng(1)
    pool, block = getattr(session, "pool", None), getattr(session, "block_size", 0)
    seed = max(block, seed_tokens // block * block) if block else past
    if copy and pool is not None and block and past >= 2 * seed:
        session.feed(rng.integers(0, session.vocab_size, seed).tolist(), rows=1)
        whole = past // block * block
        session.reserve(whole + 64)
        table = session.blocks
        used, have = whole // block, seed // block
        try:
            with pool.lock:
                for name in pool.names:
                    data = pool.tensors[name].data  # a view of the block tensor (bf16 seen as f16: bits copied)
                    for i in range(have, used):
                        data[table[i]] = data[table[i % have]]
        except (RuntimeError, TypeError, ValueError):
            session.reset()
        else:  # the last block is computed for real: a re-fed token rewrites its slot with the model's values
            session.tokens.extend((session.tokens * (used // have + 1))[seed:whole - block])
            session.feed(rng.integers(0, session.vocab_size, block).tolist(), rows=1)
            return
    session.feed(rng.integers(0, session.vocab_size, past).tolist(), rows=1)


def is_block_invariant(session, past: int = 0, copy: bool = True) -> bool:
    """Does a block of tokens get bit-identical logits to the same tokens fed in smaller pieces, among them
    a lone token into the empty cache, single tokens after it and one block of each static size?

    past: first put a context of about this many tokens into the cache (`fill_past`), so that the pieces run
    against a long context, where the attention kernels may split their work otherwise; the whole block and the
    pieces then start after it (a rollback between them). Without a past the first piece is a lone token into
    the empty cache. copy=False: the past is a real prefill of that many tokens (see `fill_past`)."""
    sizes = [1, 4, 1, 1, 1, 1, 3, *sorted(session.static_sizes)]  # the whole block is longer than any static size
    rng = np.random.default_rng(0)
    if session.max_context is not None:
        past = max(0, min(past, session.max_context - sum(sizes) - 64))
    tokens = rng.integers(0, session.vocab_size, sum(sizes)).tolist()
    session.reset()
    if past:
        fill_past(session, past, copy=copy)
    whole = session.feed(tokens)
    session.rollback(len(tokens)) if past else session.reset()
    ends = np.cumsum(sizes)
    pieces = np.concatenate([session.feed(tokens[end - n:end]) for n, end in zip(sizes, ends)])
    session.reset()
    return bool(np.array_equal(whole, pieces))


PROBE_PROMPT = 40  # the prompt before longest_exact_call's calls
AFTER_CALL = 4  # the tokens of the short call after each long one


def _probe_fits(n: int, max_context: Optional[int], prompt: int = PROBE_PROMPT) -> bool:
    """Does longest_exact_call's probe of a call of n tokens fit a context of max_context tokens?"""
    return max_context is None or prompt + n + AFTER_CALL <= max_context


def context_cuts_the_probe(max_context: Optional[int]) -> bool:
    """Does a context of max_context tokens leave out some of longest_exact_call's sizes? Its answer is then this
    context's, not the machine's, and is not kept as the machine's measurement."""
    return not _probe_fits(max(CALL_SIZES), max_context)


def longest_exact_call(session, sizes=CALL_SIZES, prompt: int = PROBE_PROMPT) -> int:
    """The most tokens one call may hold and still write and compute what short calls do: the largest of `sizes`
    for which a call of that many tokens, and a call of every smaller size, gives bit for bit the rows of the same
    tokens fed in calls of SHORT_CALL tokens, and so does a short call after it (which reads the key/value slots the
    long call wrote). All after a prompt of `prompt` tokens; SHORT_CALL if even the smallest size differs. Leaves
    the session empty."""
    sizes = sorted(n for n in sizes if _probe_fits(n, session.max_context, prompt))
    if not sizes:
        return SHORT_CALL
    top = sizes[-1]
    tokens = np.random.default_rng(2).integers(0, session.vocab_size, prompt + top + AFTER_CALL).tolist()
    head, block = tokens[:prompt], tokens[prompt:]
    saved, session.longest_call = session.longest_call, None  # the calls below go to the device as they are
    try:
        session.reset()
        for start in range(0, prompt, SHORT_CALL):
            session.feed(head[start:start + SHORT_CALL], rows=1)
        reference = np.concatenate([session.feed(block[start:start + SHORT_CALL])
                                    for start in range(0, len(block), SHORT_CALL)])
        longest = SHORT_CALL
        for n in sizes:
            session.truncate(prompt)
            rows = session.feed(block[:n])
            after = session.feed(block[n:n + AFTER_CALL])
            if not (np.array_equal(rows, reference[:n]) and np.array_equal(after, reference[n:n + AFTER_CALL])):
                break
            longest = n
        return longest
    finally:
        session.longest_call = saved
        session.reset()


# the calls passes_sequences_layout feeds its tokens in, one after another, against one call of them all
SEQUENCE_CALLS = (1, 2, 5)


def passes_sequences_layout(session, past: int = LONG_PAST) -> bool:
    """Do tokens fed as one-token sequences after a past of about `past` tokens (session.py, "One-token sequences";
    the past cheap, see `fill_past`, capped by the model's context) get the same rows, bit for bit, in one call of
    them all as in calls of SEQUENCE_CALLS tokens one after another (which read the key/value slots the calls
    before wrote)? Leaves the session empty."""
    rng = np.random.default_rng(5)
    tokens = rng.integers(0, session.vocab_size, sum(SEQUENCE_CALLS)).tolist()
    if session.max_context is not None:
        past = max(0, min(past, session.max_context - len(tokens) - 64))
    try:
        session.reset()
        if past:  # (a short context leaves none: the tokens then start at position 0)
            fill_past(session, past)
        session.sequences_from = session.length
        whole = session.feed(tokens)
        session.rollback(len(tokens))
        ends = np.cumsum(SEQUENCE_CALLS)
        pieces = np.concatenate([session.feed(tokens[end - n:end]) for n, end in zip(SEQUENCE_CALLS, ends)])
        return bool(np.array_equal(whole, pieces))
    finally:
        session.reset()


# the calls passes_prefill_calls feeds its tokens in, one after another, against one call of them all: each at least
# session.PREFILL_LEAST tokens
PREFILL_CALLS = (8, 13, 8, 21, 34)


CONTEXT_ROOM = 64  # the tokens the copy's probe (passes_prefill_calls) and timing leave free at the context's end


def prefill_call_fits(n: int, max_context: Optional[int]) -> bool:
    """Does passes_prefill_calls test a call of n tokens whole, after its real prefill of REAL_PAST tokens too, in a
    context of max_context tokens? (It cuts its call and its pasts to the context otherwise.)"""
    return max_context is None or REAL_PAST + n + CONTEXT_ROOM <= max_context


def passes_prefill_calls(session, longest: int, past: int = LONG_PAST) -> bool:
    """Do tokens fed on a long prompt's prefill model (session.py, "A long prompt's prefill in bf16") write the same
    cache, bit for bit, in one call of them all (`longest` tokens, or as many as the context leaves room for; the
    model's prefill_longest must let a call hold them) as in calls of PREFILL_CALLS tokens and then the rest, one
    after another (each later call reads the slots the ones before it wrote), on an empty cache, after a real
    prefill of REAL_PAST tokens and after a past of about `past` tokens (cheap, see `fill_past`; capped by the
    model's context)? The cache is all that model computes for a prompt. Every call of the probe runs on that
    model. Leaves the session empty."""
    rng = np.random.default_rng(7)
    sizes = list(PREFILL_CALLS)
    room = (session.max_context or 1 << 30) - CONTEXT_ROOM - sum(sizes)
    rest = min(longest - sum(sizes), room)
    if rest >= PREFILL_CALLS[0]:
        sizes.append(rest)
    tokens = rng.integers(0, session.vocab_size, sum(sizes)).tolist()
    limit = None if session.max_context is None else session.max_context - len(tokens) - CONTEXT_ROOM
    ends = np.cumsum(sizes)
    try:
        for before, copy in ((0, True), (REAL_PAST, False), (past, True)):
            before = before if limit is None else max(0, min(before, limit))
            session.reset()
            session.begin_long_prefill()  # every call below is a long prompt's prefill call
            if before:
                fill_past(session, before, copy=copy)
            start = session.length
            session.feed(tokens, rows=1)
            whole = written_cache(session, start, session.length)
            session.rollback(len(tokens))
            for n, end in zip(sizes, ends):
                session.feed(tokens[end - n:end], rows=1)
            if not all(np.array_equal(a, b) for a, b in zip(whole, written_cache(session, start, session.length))):
                return False
        return True
    finally:
        session.reset()


def written_cache(session, start: int, end: int) -> list[np.ndarray]:
    """The bytes a paged session's calls wrote at positions start..end-1 of its cache (as they lie: a long prompt's
    prefill copy's bf16 values until the target reads them): one array of [positions, heads, bytes] per key/value
    input."""
    pool, table = session.pool, session.blocks
    positions = np.arange(start, end)
    blocks, slots = np.asarray(table)[positions // pool.block_size], positions % pool.block_size
    with pool.lock:
        return [np.ascontiguousarray(pool.tensors[name].data[blocks, :, slots]).view(np.uint8) for name in pool.names]


def passes_block_invariance(session) -> bool:
    """The check a target's session must pass to be exact: the probe on an empty cache, after a real prefill of
    REAL_PAST tokens (what a prompt of that length leaves), and after a past of LONG_PAST tokens (capped by the
    model's context; cheap, see `fill_past`). The one-token-sequences layout has a probe of its own
    (passes_sequences_layout): a model that fails it keeps the block layout and stays exact."""
    return (is_block_invariant(session) and is_block_invariant(session, past=REAL_PAST, copy=False)
            and is_block_invariant(session, past=LONG_PAST))
