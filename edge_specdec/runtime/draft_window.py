"""The draft model's window on a long sequence: the sequence's head and its most recent tokens, nothing between.

A draft proposes from what it has read, and what it proposes next depends mostly on the text just before it. A
prompt longer than the draft's context (or long enough that the draft's prefill of it costs more than its drafts
save) would otherwise leave the target alone for the whole run. With a window, the draft's cache holds at most
`size` tokens: the sequence's first `head` tokens (a chat template's head: its system turn and the start of the first
user turn) and then its last tokens, from `start` on. The cache gets those tokens at positions 0, 1, 2, ... as if
they were a sequence of their own, since the rotary positions written into a KV cache cannot be shifted later.

The window slides in large steps: while the sequence grows, the cache only appends (as without a window); once
the tokens after the head no longer fit in `tail`, the start moves forward by a multiple of `step` (half the tail),
and the draft's cache keeps the head and is fed the new tail again (a re-prefill of about half the tail, once per
`step` new tokens). The start is a function of the sequence's length alone, so a run drafts from the same window
whoever asks (a proposal drafted ahead on a guess, a later run on the same prompt): reproducible and reusable.

Exact by construction: the target verifies every proposed token, and a sampled token's q is the distribution the
draft drew it from on the window it read. The window changes what is proposed, never what is kept.
"""
from __future__ import annotations

from typing import Optional, Sequence

# The default window (SpeculativeConfig.draft_window None): the draft reads at most this many tokens, or its own
# context if shorter. Below it a sequence is read whole, as without a window; above it the draft's per-step cost (it
# attends over all it holds) and its prefill of the prompt (paid before the first round drafts, and again by every
# request whose prompt differs) keep growing with the prompt, while what it proposes next is decided mostly by the
# recent text. Chosen, not measured: the long-prompts benchmark suite is where to measure it on a real pair.
DRAFT_WINDOW = 2048
MIN_WINDOW = 16        # the smallest window a request may ask for (a head, a tail and room to draft)
HEAD_TOKENS = 64       # the most tokens of the head (an eighth of the window when that is fewer)
ROOM_TOKENS = 32       # room kept free for a round's drafted tokens (a quarter of the window when that is fewer)


class DraftWindow:
    """Which tokens of a sequence the draft's cache holds (see the module's docstring), and what sliding cost.

    size: the most tokens the draft's cache holds, drafted tokens included."""

    def __init__(self, size: int):
        if size < MIN_WINDOW:
            raise ValueError(f"a draft window holds at least {MIN_WINDOW} tokens, not {size}")
        self.size = size
        self.head = min(HEAD_TOKENS, size // 8)
        self.room = min(ROOM_TOKENS, size // 4)
        self.tail = size - self.head - self.room  # the most tokens after the head when a round starts
        self.step = max(1, self.tail // 2)
        self.start: Optional[int] = None  # where the tail starts in the sequence (head: the whole sequence)
        self.cut = False        # a sequence did not fit: the draft read a window of it
        self.slides = 0         # times the start moved forward after the first view (each a re-prefill)
        self.refed_tokens = 0   # tokens the draft was fed again at those slides

    def start_for(self, length: int) -> int:
        """Where the tail starts for a sequence of `length` tokens: right after the head while everything fits,
        else the first multiple of `step` past the head that leaves at most `tail` tokens."""
        over = length - self.head - self.tail
        return self.head if over <= 0 else self.head + self.step * -(-over // self.step)

    def view(self, sequence: Sequence[int]) -> list[int]:
        """The tokens the draft's cache holds for this sequence: all of them while they fit, else the head and the
        tail from the start; counts a slide when the start moved forward."""
        start = self.start_for(len(sequence))
        if self.start is not None and start > self.start:
            self.slides += 1
            self.refed_tokens += len(sequence) - start
        self.start = start
        if start == self.head:
            return list(sequence)
        self.cut = True
        return list(sequence[:self.head]) + list(sequence[start:])

    def most(self, k: int, cached: int) -> int:
        """The most tokens a round may draft with `cached` tokens in the draft's cache: the last drafted token is
        never fed, so up to the window's size plus one."""
        return max(1, min(k, self.size - cached + 1))

    def stats(self) -> dict:
        """What the window did in a run, for Result.extra (empty when every sequence fit)."""
        if not self.cut:
            return {}
        return {"draft_window": {"size": self.size, "slides": self.slides, "refed_tokens": self.refed_tokens}}


def window_of(size: Optional[int]) -> Optional[DraftWindow]:
    """A window of `size` tokens, or None (the draft reads the whole sequence)."""
    return DraftWindow(size) if size else None
