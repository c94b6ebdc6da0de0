"""The server's prefix store: the KV caches of recent conversations, kept in host memory beyond the slots.

A slot's session keeps its caches between requests (see slots.py). When a request is about to take a slot whose
cache it shares little with (another conversation), the slot's caches (the target's KV rows of its tokens and the
draft's) are copied into the store first; a later request whose prompt shares more with a stored cache than with
any free slot's gets that cache copied back into its slot instead of prefilling it again (`serve
--prefix-cache-mb N`; 0, the default, keeps no store).

Exact: a copy holds the cache's KV blocks byte for byte, so a restored slot holds the bits it had, and the run on
it keeps the longest common prefix of those tokens and its prompt exactly as a slot that was never reused would
(which writes what a fresh session writes: see generate()). Bounded: the store counts the bytes of every copy
(`nbytes`); a copy that would take it past its bound evicts the least recently used ones first, and one larger
than the whole bound is not kept, so the store never grows past it.

What can be copied: a paged session (PagedSession, the CPU and GPU default), whose KV blocks are tensors the
session owns (its BlockPool). The stateful form on the NPU (NpuwSession) keeps its cache inside OpenVINO's NPU
pipeline, which gives no way to read or write it: a draft there is not stored, and keeps whatever it holds (the
drafter re-syncs it, at no cost to exactness: the target decides every token). A masked target reuses no prefix
at all (not block-invariant), so there is nothing to store for it either.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ..runtime.session import PagedSession, common_prefix

# the fewest cached tokens a request must be about to drop from its slot for the slot's cache to be stored
MIN_STORED_TOKENS = 16


@dataclass
class KVCopy:
    """One session's cache, copied: its tokens and, per key/value tensor of its pool, the blocks that hold them."""
    tokens: list[int]
    blocks: dict[str, np.ndarray]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.blocks.values()) + 8 * len(self.tokens)


def copyable(session) -> bool:
    """Whether a session's cache can be copied out and back (a paged session; see the module's docstring)."""
    return isinstance(session, PagedSession)


def export_cache(session: PagedSession) -> KVCopy:
    """A copy of the part of the session's cache a later request may reuse (`reusable_tokens`: not the tokens fed
    as one-token sequences after a long prompt, see session.py): the blocks of those tokens, whole (a last block's
    slots past the tokens too)."""
    tokens = list(session.reusable_tokens)
    used = -(-len(tokens) // session.block_size)
    pool = session.pool
    with pool.lock:  # no call writes the tensors, nor grows them, meanwhile
        index = np.asarray(session.blocks[:used], dtype=np.int64)
        blocks = {name: pool.tensors[name].data[index].copy() for name in pool.names} if used else {}
    return KVCopy(tokens, blocks)


def import_cache(session: PagedSession, copy: KVCopy) -> None:
    """Make the session hold the copied cache: its tokens, the copied blocks in the session's own blocks. Whatever the
    session held goes (a long prompt's prefill copy's values in its blocks too: they are rewritten)."""
    used = -(-len(copy.tokens) // session.block_size)
    session.reset()
    session.reserve(len(copy.tokens))
    pool = session.pool
    with pool.lock:
        index = np.asarray(session.blocks[:used], dtype=np.int64)
        for name, data in copy.blocks.items():
            pool.tensors[name].data[index] = data
        session.tokens = list(copy.tokens)
        session.sequences_from = None  # a copy holds the block layout's tokens only
        session.copy_end = 0  # (the store keeps no cache a long prompt's prefill copy wrote)


@dataclass
class Entry:
    """A decoding session's caches: the target's (the key) and the draft's, if it could be copied."""
    target: KVCopy
    draft: Optional[KVCopy] = None
    nbytes: int = field(init=False)

    def __post_init__(self) -> None:
        self.nbytes = self.target.nbytes + (self.draft.nbytes if self.draft else 0)


@dataclass
class Prepared:
    """What PrefixStore.prepare did for one request."""
    restored: bool = False  # the slot's cache came from the store (a store hit)
    stored: bool = False    # the slot's previous cache went into the store
    evicted: int = 0        # entries evicted to make room (or not kept: larger than the whole store)


class PrefixStore:
    """An LRU of decoding sessions' caches, at most `max_bytes` in all; thread-safe (slots prepare in workers)."""

    def __init__(self, max_bytes: int, min_tokens: int = MIN_STORED_TOKENS):
        self.max_bytes, self.min_tokens = max_bytes, min_tokens
        self.entries: OrderedDict[int, Entry] = OrderedDict()  # least recently used first
        self.nbytes = 0
        self.hits = self.evictions = 0
        self._next = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.entries)

    def prepare(self, session, prompt_ids: list[int]) -> Prepared:
        """Before `session` (a DecodingSession, the request's slot) runs prompt_ids: keep its cache in the store if
        the request would drop at least min_tokens of it, and give it the stored cache that shares the most with
        the prompt if that is more than its own shares."""
        done = Prepared()
        target = session.target
        if not copyable(target) or not prompt_ids:
            return done
        limit = len(prompt_ids) - 1  # the run feeds the prompt's last token whatever is cached
        kept = min(target.shared_prefix(prompt_ids), limit)
        # The store keeps only caches the target wrote: one a long prompt's prefill copy wrote (session.py, "A long
        # prompt's prefill in bf16") may hold the copy's bf16 values, and what converting them for the target kept
        # aside stays with the session; and a prompt that the copy prefills may reuse none the target wrote.
        candidates = [] if target.prefills_long(prompt_ids) else self.entries.items()
        with self._lock:
            best, match = None, kept
            for key, entry in candidates:
                shared = min(common_prefix(entry.target.tokens, prompt_ids), limit)
                if shared > match:
                    best, match = key, shared
            restore = self.entries.pop(best) if best is not None else None
            if restore is not None:
                self.nbytes -= restore.nbytes
            own = target.reusable_tokens
            dropped = len(own) - (kept if restore is None else 0)
            covered = restore is not None and common_prefix(own, restore.target.tokens) == len(own)
            if dropped >= self.min_tokens and not covered and not target.prefilled_long:
                done.evicted += self._put(Entry(export_cache(target), self._draft_copy(session)))
                done.stored = True
            if restore is not None:
                import_cache(target, restore.target)
                if restore.draft is not None and copyable(session.draft):
                    import_cache(session.draft, restore.draft)
                self.hits += 1
                done.restored = True
        return done

    @staticmethod
    def _draft_copy(session) -> Optional[KVCopy]:
        draft = getattr(session, "draft", None)
        return export_cache(draft) if draft is not None and copyable(draft) else None

    def _put(self, entry: Entry) -> int:
        """Add an entry (superseding the entries whose tokens it starts with), evicting the least recently used
        ones until it fits; returns how many were evicted. Called with the lock held."""
        tokens = entry.target.tokens
        for key in [k for k, e in self.entries.items()
                    if common_prefix(e.target.tokens, tokens) == len(e.target.tokens)]:
            self.nbytes -= self.entries.pop(key).nbytes  # a prefix of the new one: restoring it gives no more
        evicted = 0
        if entry.nbytes > self.max_bytes:  # larger than the whole store: not kept
            self.evictions += 1
            return 1
        while self.entries and self.nbytes + entry.nbytes > self.max_bytes:
            self.nbytes -= self.entries.popitem(last=False)[1].nbytes
            evicted += 1
        self.entries[self._next] = entry
        self._next += 1
        self.nbytes += entry.nbytes
        self.evictions += evicted
        return evicted
