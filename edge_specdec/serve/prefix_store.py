"""The server's prefix store: the KV caches of recent conversations, kept in host memory beyond the slots.

A slot's session keeps its caches between requests (see slots.py). When a request is about to take a slot whose
cache it shares little with (another conversation), the slot's caches (the target's KV rows of its tokens and the
draft's) are copied into the store first; a later request whose prompt shares more with a stored cache than with
any free slot's gets that cache copied back into its slot instead of prefilling it again (`serve
--prefix-cache-mb N`; 0, the default, keeps no store).

Exact: a copy holds the cache's KV blocks byte for byte, with the layout its tokens were fed in and, where a long
prompt's bf16 prefill copy wrote them, what converting its values for the target kept aside, so a restored slot is
the slot that was stored, and the run on it keeps the cache as that slot would (the longest common prefix of its
tokens and the prompt, up to the first position the prompt feeds in another layout: `ModelSession.shared_prefix`),
which writes what a fresh session writes (see generate()). Bounded: the store counts the bytes of every copy
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

from ..runtime.prefill_blocks import KeptAside
from ..runtime.session import PagedSession, reusable_prefix

# the fewest cached tokens a request must be about to drop from its slot for the slot's cache to be stored
MIN_STORED_TOKENS = 16


@dataclass
class KVCopy:
    """One session's cache, copied: its tokens and, per key/value tensor of its pool, the blocks that hold them; the
    layout they were fed in (session.py: `ModelSession.layout`) and where the long-prompt prefill copy's values
    stand in them (`PagedSession.copy_state`), so that a restored session is the session that was copied."""
    tokens: list[int]
    blocks: dict[str, np.ndarray]
    layout: tuple[int, Optional[int]] = (0, None)
    copy_state: tuple[int, Optional[KeptAside]] = (0, None)

    @property
    def nbytes(self) -> int:
        kept = self.copy_state[1]
        aside = sum(i.nbytes + v.nbytes for i, v in kept.values.values()) if kept is not None else 0
        return sum(a.nbytes for a in self.blocks.values()) + 8 * len(self.tokens) + aside

    def shared_prefix(self, tokens: list[int], layout: tuple[int, Optional[int]]) -> int:
        """How many of the copy's tokens a prompt of these tokens, fed in `layout`, may keep (as
        ModelSession.shared_prefix counts them for a session's own cache)."""
        return reusable_prefix(self.tokens, self.layout, tokens, layout)


def copyable(session) -> bool:
    """Whether a session's cache can be copied out and back (a paged session; see the module's docstring)."""
    return isinstance(session, PagedSession)


def export_cache(session: PagedSession) -> KVCopy:
    """A copy of the session's cache: the blocks of its tokens, whole (a last block's slots past the tokens too),
    with their layout and the prefill copy's state (what converting its values kept aside, copied)."""
    tokens = list(session.tokens)
    used = -(-len(tokens) // session.block_size)
    pool = session.pool
    written, kept = session.copy_state
    if kept is not None:
        kept = KeptAside(kept.positions, {name: (index.copy(), bits.copy()) for name, (index, bits)
                                          in kept.values.items()})
    with pool.lock:  # no call writes the tensors, nor grows them, meanwhile
        index = np.asarray(session.blocks[:used], dtype=np.int64)
        blocks = {name: pool.tensors[name].data[index].copy() for name in pool.names} if used else {}
    return KVCopy(tokens, blocks, session.cache_layout, (written, kept))


def import_cache(session: PagedSession, copy: KVCopy) -> None:
    """Make the session hold the copied cache: its tokens, the copied blocks in the session's own blocks, their
    layout and the prefill copy's state (whose kept-aside values are placed by their order in the block table, not by
    block number, so they hold in other blocks; the session never changes them in place). Whatever the session held
    goes."""
    used = -(-len(copy.tokens) // session.block_size)
    session.reset()
    session.reserve(len(copy.tokens))
    pool = session.pool
    with pool.lock:
        index = np.asarray(session.blocks[:used], dtype=np.int64)
        for name, data in copy.blocks.items():
            pool.tensors[name].data[index] = data
        session.tokens = list(copy.tokens)
        session.copy_end, session.sequences_from = copy.layout
        session.copy_state = copy.copy_state


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
        layout = target.layout(prompt_ids)
        kept = min(reusable_prefix(target.tokens, target.cache_layout, prompt_ids, layout), limit)
        with self._lock:
            best, match = None, kept
            for key, entry in self.entries.items():
                shared = min(entry.target.shared_prefix(prompt_ids, layout), limit)
                if shared > match:
                    best, match = key, shared
            restore = self.entries.pop(best) if best is not None else None
            if restore is not None:
                self.nbytes -= restore.nbytes
            own = target.tokens
            dropped = len(own) - (kept if restore is None else 0)
            covered = restore is not None and restore.target.shared_prefix(own, target.cache_layout) == len(own)
            if dropped >= self.min_tokens and not covered:
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
        """Add an entry (superseding the entries whose tokens it starts with, fed in the layout it feeds them in),
        evicting the least recently used ones until it fits; returns how many were evicted. Called with the lock
        held."""
        new = entry.target
        for key in [k for k, e in self.entries.items()
                    if new.shared_prefix(e.target.tokens, e.target.layout) == len(e.target.tokens)]:
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
