"""The draft model's window on a long sequence: the sequence's head and its most recent tokens, nothing between.

A draft proposes from what it has read, and what it proposes next depends mostly on the text just before it. A
prompt longer than the draft's context (or long enough that the draft's prefill of it costs more than its drafts
save) would otherwise leave the target alone for the whole run. With a window, the draft's cache holds at most
`size` tokens: the sequence's first `head` tokens and then its last tokens, from `start` on. The cache gets those
tokens at positions 0, 1, 2, ... as if they were a sequence of their own, since the rotary positions written into a
KV cache cannot be shifted later.

The head is the prompt's chat head where the prompt has one and it is short: what the chat template wrote before the
last user message's own text (the system prompt, earlier turns, the opening of the user turn; `chat_head_length`), so
that the draft reads the conversation's frame as well as its latest text. It must fit in CHAT_HEAD_TOKENS and a quarter
of the window; otherwise (and for a prompt that no chat template wrote) the head is the sequence's first
HEAD_TOKENS tokens, or an eighth of the window when that is fewer. A draft of another vocabulary counts its head in
its own tokens: the head's text re-tokenized by the draft (algorithms.py).

The window slides in large steps: while the sequence grows, the cache only appends (as without a window); once
the tokens after the head no longer fit in `tail`, the start moves forward by a multiple of `step` (half the tail),
and the draft's cache keeps the head and is fed the new tail again (a re-prefill of about half the tail, once per
`step` new tokens). The head is a function of the request and the start a function of the sequence's length, so a
run drafts from the same window whoever asks (a proposal drafted ahead on a guess, a later run on the same prompt):
reproducible and reusable.

Exact by construction: the target verifies every proposed token, and a sampled token's q is the distribution the
draft drew it from on the window it read. The window changes what is proposed, never what is kept.
"""
from __future__ import annotations

from bisect import bisect_right
from itertools import accumulate
from typing import Callable, NamedTuple, Optional, Sequence

# The default window (SpeculativeConfig.draft_window None): the draft reads at most this many tokens, or its own
# context if shorter. Below it a sequence is read whole, as without a window; above it the draft's per-step cost (it
# attends over all it holds) and its prefill of the prompt (paid before the first round drafts, and again by every
# request whose prompt differs) keep growing with the prompt, while what it proposes next is decided mostly by the
# recent text. A longer window's prefill costs more than a short answer's drafting saves after a long prompt; the
# size is the long-prompts suite's measurement on a real pair (benchmarks/RESULTS.md, "Long prompts"): what the
# draft keeps of its tokens hardly depends on the window's size there, while its first prefill grows with it.
DRAFT_WINDOW = 256
MIN_WINDOW = 16         # the smallest window a request may ask for (a head, a tail and room to draft)
HEAD_TOKENS = 64        # the most tokens of a fixed head (an eighth of the window when that is fewer)
CHAT_HEAD_TOKENS = 256  # the most tokens of a chat head kept as the head (a quarter of the window when that is fewer)
ROOM_TOKENS = 32        # room kept free for a round's drafted tokens (a quarter of the window when that is fewer)


class DraftWindow:
    """Which tokens of a sequence the draft's cache holds (see the module's docstring), and what sliding cost.

    size: the most tokens the draft's cache holds, drafted tokens included. chat_head: how many of the sequence's
    first tokens are the prompt's chat head (None: unknown); the head when it fits in chat_head_bound(size), else
    the fixed head."""

    def __init__(self, size: int, chat_head: Optional[int] = None):
        if size < MIN_WINDOW:
            raise ValueError(f"a draft window holds at least {MIN_WINDOW} tokens, not {size}")
        self.size = size
        self.keeps_chat_head = chat_head is not None and 0 < chat_head <= chat_head_bound(size)
        self.head = chat_head if self.keeps_chat_head else min(HEAD_TOKENS, size // 8)
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
        return {"draft_window": {"size": self.size, "head": self.head, "chat_head": self.keeps_chat_head,
                                 "slides": self.slides, "refed_tokens": self.refed_tokens}}


def chat_head_bound(size: int) -> int:
    """The most tokens a chat head may have to be a window's head: CHAT_HEAD_TOKENS, and a quarter of the window."""
    return min(CHAT_HEAD_TOKENS, size // 4)


def window_of(size: Optional[int], chat_head: Optional[int] = None) -> Optional[DraftWindow]:
    """A window of `size` tokens whose head is the chat head of `chat_head` tokens where it fits (see DraftWindow),
    or None (the draft reads the whole sequence)."""
    return DraftWindow(size, chat_head) if size else None


class ChatHead(NamedTuple):
    """A prompt's chat head (see chat_head_length): its length in the prompt's tokens, and its text as a draft of
    another vocabulary reads the prompt (a prefix of that text)."""
    tokens: int
    text: str


def chat_head_length(ids: Sequence[int], spell: Callable[[int], bytes], opening: bytes) -> Optional[int]:
    """How many of a prompt's first tokens are its chat head: the tokens before the last user message's own text,
    which starts where the last `opening` ends (the text the chat template writes before a user message:
    chat.ChatTemplate.user_opening). spell(id) is a token's text as the template writes it, a special token's too.
    None where the prompt holds no opening (no chat template wrote it). A token that the opening's end cuts is not
    in the head. A function of the prompt alone, so the window's head repeats with the request."""
    if not opening:
        return None
    pieces = [spell(t) for t in ids]
    at = b"".join(pieces).rfind(opening)
    return bisect_right(list(accumulate(map(len, pieces))), at + len(opening)) if at >= 0 else None
