"""Batched verification: the short blocks of several sessions in one call of a paged model.

The paged-attention IR takes several sequences in one call: their tokens one after another, with per-sequence
past lengths, block tables and subsequence boundaries. On a CPU a pass of a 1.5B target costs little more for
16 rows than for 4, so sessions that verify together pay the pass's fixed part once per round instead of once
per session. Sessions of a batching Engine share one BlockPool per model and a Scheduler; each session's thread
still runs its own decode loop (drafting, verification, rollback), and only the model calls meet here.

The Scheduler gathers calls without a fixed clock. When every session that is generating is waiting for a call,
the pending calls of the model that comes first in a round run (the draft's, then the target's): the sessions
that still draft go on drafting, together, while those done wait at the target, so that all of them verify in
one call, then draft together again. When some session is busy elsewhere (in Python between rounds, say), the
others wait for it, but only while nothing at all happens: after `max_wait` seconds without a call submitted or
finished, the pending calls run without it. The pending calls run as one call, a new session's prompt among
the others' blocks, and the output layer computes the logits of the rows each session asked for only. A call
holds at most the session's `longest_block` tokens in all (LONGEST_BATCHED where it has no bound): more pending
tokens than that run as several calls.

Exactness: each sequence's rows in a batched call must be bit-identical to what the session computes alone.
`batch_invariant` checks that on the device when the engine opens; an engine whose target fails it does not
batch (and says so).
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from .graph import LOGITS_ROWS

MAX_WAIT = 0.02  # seconds the first pending call of a model waits for the other sessions' calls
LONGEST_BATCHED = 1024  # tokens: a longer call (a long prompt) runs alone, so that one call's activations stay bounded


@dataclass
class Call:
    session: "PagedSession"  # noqa: F821 (session.py imports this module's users, not the other way)
    tokens: list[int]
    rows: int
    sequences: bool = False  # the tokens go as one-token sequences (session.py, "One-token sequences")
    since: float = field(default_factory=time.perf_counter)
    logits: Optional[np.ndarray] = None
    error: Optional[BaseException] = None

    @property
    def done(self) -> bool:
        return self.logits is not None or self.error is not None


class ModelQueue:
    """The pending calls of one model (one BlockPool), and the infer request that runs them together. Queues of
    a lower `rank` come first in a round (the draft's before the target's)."""

    def __init__(self, session, rank: int = 0):
        self.rank = rank
        self.pending: list[Call] = []
        self.running = False
        self.request = session.model.compiled.create_infer_request()
        session.pool.attach(self.request)
        self.pool = session.pool
        self.picks_rows = session.picks_rows
        self.calls = 0  # batched calls run, and the sequences in them (for the statistics)
        self.sequences = 0

    def run(self, batch: list[Call]) -> None:
        """Run the batch in groups of at most `limit` tokens in all (a longer call alone); a group of one call
        runs alone, the others together. Each call gets its logits or its error."""
        limit = batch[0].session.longest_block or LONGEST_BATCHED
        groups: list[list[Call]] = []
        for call in batch:
            if groups and sum(len(c.tokens) for c in groups[-1]) + len(call.tokens) <= limit:
                groups[-1].append(call)
            else:
                groups.append([call])
        for group in groups:
            try:
                if len(group) == 1:
                    call = group[0]
                    infer = call.session.infer_sequences if call.sequences else call.session.infer_alone
                    call.logits = infer(call.tokens, call.rows)
                else:
                    for call, logits in zip(group, self.together(group)):
                        call.logits = logits
            except BaseException as exc:  # handed to the sessions' threads
                for call in group:
                    call.error = exc

    def together(self, calls: list[Call]) -> list[np.ndarray]:
        """One call over several sessions' blocks; each session's last `rows` rows. A block goes as one sequence,
        the tokens of a session in the sequences layout as one-token sequences each; a call that holds those gets
        pad sequences when it has too few sequences for them (session.sequence_pads)."""
        from .session import call_inputs, sequence_pads

        sequences = []
        for call in calls:
            sequences += (call.session.sequences(call.tokens) if call.sequences
                          else [call.session.block_sequence(call.tokens)])
        ends = np.cumsum([len(c.tokens) for c in calls])
        pads = (sequence_pads(len(sequences), int(ends[-1]), calls[0].session.model.threads)
                if any(c.sequences for c in calls) else 0)
        x = call_inputs(sequences, pads, self.pool.scratch)
        if self.picks_rows:  # each session's last rows only
            x[LOGITS_ROWS] = np.concatenate([np.arange(end - c.rows, end) for c, end in zip(calls, ends)])
        with self.pool.lock:
            self.request.infer(x)
            logits = self.request.get_tensor("logits").data
            logits = logits.reshape(len(logits), -1)
            rows_end = np.cumsum([c.rows for c in calls]) if self.picks_rows else ends
            out = [logits[end - c.rows:end].copy() for c, end in zip(calls, rows_end)]
        self.calls += 1
        self.sequences += len(calls)
        return out


class Scheduler:
    """Gathers the model calls of an engine's sessions into batched calls (see the module docstring)."""

    def __init__(self, max_wait: float = MAX_WAIT, order: tuple = ()):
        """order: the BlockPools of the models in the order a round calls them (the draft's, then the target's);
        a pool not named comes last."""
        self.max_wait = max_wait
        self.ranks = {id(pool): rank for rank, pool in enumerate(order)}
        self.cond = threading.Condition()
        self.active = 0  # sessions inside generate()
        self.waiting = 0  # calls submitted and not yet computed
        self.last_activity = time.perf_counter()  # when a call was last submitted or finished
        self.queues: dict[int, ModelQueue] = {}  # by BlockPool

    @contextmanager
    def generating(self):
        """Count a session as generating: the others' calls wait for its calls (up to max_wait)."""
        with self.cond:
            self.active += 1
        try:
            yield
        finally:
            with self.cond:
                self.active -= 1
                self.cond.notify_all()

    def infer(self, session, tokens: list[int], rows: int, sequences: bool = False) -> np.ndarray:
        """The session's logits for its block, computed in a batch with other sessions' blocks when they come;
        sequences: its tokens go as one-token sequences (session.py, "One-token sequences")."""
        call = Call(session, list(tokens), rows, sequences)
        with self.cond:
            queue = self.queues.get(id(session.pool))
            if queue is None:
                rank = self.ranks.get(id(session.pool), len(self.ranks))
                queue = self.queues[id(session.pool)] = ModelQueue(session, rank)
            queue.pending.append(call)
            self.waiting += 1
            self.last_activity = time.perf_counter()
            self.cond.notify_all()
            try:
                while not call.done:
                    wait = self._wait_before_running(queue)
                    if wait == 0.0:
                        self._run(queue)
                    else:
                        self.cond.wait(wait)
            finally:
                if not call.done:  # interrupted while waiting (Ctrl-C): the call leaves the queue
                    if call in queue.pending:
                        queue.pending.remove(call)
                        self.waiting -= 1
        if call.error is not None:
            raise call.error
        return call.logits

    def _wait_before_running(self, queue: ModelQueue) -> Optional[float]:
        """0 if this thread should run the queue's batch now, else how long to wait (None: until notified)."""
        if queue.running or not queue.pending:
            return None
        earlier = any(q.pending or q.running for q in self.queues.values() if q.rank < queue.rank)
        if self.waiting >= self.active:  # every session waits for a call: the earliest model's calls go first
            return None if earlier else 0.0
        idle = time.perf_counter() - self.last_activity  # someone is busy elsewhere: wait while things happen
        return max(0.0, self.max_wait - idle)

    def _run(self, queue: ModelQueue) -> None:
        """Run the queue's pending calls, with the lock released meanwhile (called with it held)."""
        batch, queue.pending, queue.running = queue.pending, [], True
        self.cond.release()
        try:
            queue.run(batch)
        finally:
            self.cond.acquire()
            queue.running = False
            self.waiting -= len(batch)  # now, not when their threads wake: those sessions are computing again
            self.last_activity = time.perf_counter()
            self.cond.notify_all()

    def stats(self) -> dict:
        calls = sum(q.calls for q in self.queues.values())
        sequences = sum(q.sequences for q in self.queues.values())
        return {"batched_calls": calls, "mean_sequences_per_batched_call": sequences / calls if calls else 0.0}


def batch_invariant(model, sessions: int = 3, seed: int = 0) -> bool:
    """Do sessions sharing a pool get, in one batched call, bit-identical rows to what each computes alone?

    Random prompts of different lengths, then blocks of 2 to 6 tokens of which each session asks for the logits
    of its last 1 to all rows, alone and together, over three rounds with rollbacks in between, and in each
    round one session starting over with a new prompt of 20 tokens or more (a prompt joins a batched call, which
    holds at most the session's longest_block tokens), and where the model takes the one-token-sequences layout
    (session.py), in each round another session in that layout, from its length then on; the sessions are left
    empty."""
    from .session import BlockPool

    rng = np.random.default_rng(seed)
    pool = BlockPool(model.compiled)
    group = [model.session(pool) for _ in range(sessions)]
    queue = ModelQueue(group[0])
    try:
        for s in group:
            s.feed(rng.integers(0, s.vocab_size, int(rng.integers(3, 40))).tolist())
        for _ in range(3):
            blocks = [rng.integers(0, s.vocab_size, int(rng.integers(2, 7))).tolist() for s in group]
            rows = [int(rng.integers(1, len(block) + 1)) for block in blocks]
            newcomer = int(rng.integers(0, sessions))  # this one starts over with a prompt
            group[newcomer].reset()
            # with the others' blocks of up to 6: one call (a machine whose longest exact call is short: a short one)
            most = max(3, (group[newcomer].longest_block or 120) - 12)
            blocks[newcomer] = rng.integers(0, model.vocab_size, int(rng.integers(min(20, most - 1), most))).tolist()
            rows[newcomer] = 1
            after = group[(newcomer + 1) % sessions]
            if after.takes_sequences and after.sequences_from is None:
                after.sequences_from = after.length
            layouts = [s.sequences_from is not None for s in group]
            alone = [(s.infer_sequences if seq else s.infer_alone)(block, r)[-r:]
                     for s, block, r, seq in zip(group, blocks, rows, layouts)]
            together = queue.together([Call(s, block, r, seq)
                                       for s, block, r, seq in zip(group, blocks, rows, layouts)])
            if not all(np.array_equal(a, b) for a, b in zip(alone, together)):
                return False
            for s, block in zip(group, blocks):  # keep part of each block, as verification does
                s.tokens.extend(block)
                s.rollback(int(rng.integers(0, len(block))))
        return True
    finally:
        for s in group:
            s.reset()
