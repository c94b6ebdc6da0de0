"""Drafters for a draft model whose vocabulary differs from the target's (Timor et al., ICML 2025).

All three talk to the decode loop like any drafter: propose(sequence, k) returns target tokens, and for
each either the distribution it was drawn from (rejection sampling) or None (the target keeps the token
only if it picks it itself; lossless for any proposal). The draft's cache follows the target's text through
`DraftTextContext`, so the tokens the target wrote itself (a correction, a bonus token) reach the draft as text.
They learn a round's outcome from that text, not from accept(): a count of target tokens says nothing of which
draft tokens spelled them.

- SLEMDrafter: draft tokens -> text -> target tokens (re-tokenized with a window, see retokenize.py).
- TLIDrafter: the draft samples only tokens that exist in both vocabularies, so each maps 1:1 to a target
  token and its (renormalized) probability is the proposal distribution of standard rejection sampling.
- SLRSDrafter lives in slrs.py.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from ..vocab_map import NO_TOKEN, VocabMap
from .drafters import Drafter, Proposal, draft_steps
from .retokenize import Retokenizer
from .sampling import GenerationConfig, distribution
from .session import ModelSession, common_prefix

RESPLIT = 2  # generated draft tokens re-tokenized together with newly accepted text


class DraftTextContext:
    """The draft model's view of the text: its own tokenization of the prompt, then of the accepted text.

    sync(sequence, own) brings the draft's cache to the text of the target's sequence: the draft tokens of the
    drafter's last proposal (`own`) that spell the accepted text are kept as they are (no tokenizer call on that
    path); other text is re-tokenized together with the last RESPLIT draft tokens, and the cache is rolled back to
    the first token that changed and fed only what it lacks.
    """

    def __init__(self, session: ModelSession, retokenizer: Retokenizer, vocab_map: VocabMap,
                 prompt_len: int, prompt_draft_ids: list[int]):
        self.session, self.retok, self.target_pieces = session, retokenizer, vocab_map.target
        self.prompt_len, self.n_prompt = prompt_len, len(prompt_draft_ids)
        self.ids = list(prompt_draft_ids)   # prompt + generated text, in draft tokens
        self.covered = 0                    # bytes of generated text that self.ids spell
        self.text = bytearray()             # generated text (target side)
        self.generated: list[int] = []      # the generated target tokens self.text spells
        self.ends = [0]                     # len(self.text) after each of them

    def sync(self, sequence: list[int], own: list[int]) -> tuple[Optional[np.ndarray], bytes]:
        """Returns the draft's logits for the next token (None while the draft has no tokens at all: a prompt of
        special tokens only, for a tokenizer that adds no BOS; the draft sits such rounds out) and the accepted
        bytes it could not spell (rare).

        The sequence usually extends the previous one; when it does not (concurrent mode drafts ahead on a
        guess that may not come true), the text and the draft tokens are cut back to where they agree.
        """
        generated = sequence[self.prompt_len:]
        keep = common_prefix(self.generated, generated)
        if keep < len(self.generated):
            del self.generated[keep:], self.ends[keep + 1:], self.text[self.ends[keep]:]
            while self.covered > len(self.text):
                self.covered -= len(self.retok.pieces.piece(self.ids.pop()) or b"")
        for token in generated[keep:]:
            self.text += self.target_pieces.piece(token) or b""
            self.generated.append(token)
            self.ends.append(len(self.text))
        pending = bytes(self.text[self.covered:])
        for token in own:  # the hot path: the target accepted the draft's own tokens
            piece = self.retok.pieces.piece(token)
            if not piece or not pending.startswith(piece):
                break
            self.ids.append(token)
            self.covered += len(piece)
            pending = pending[len(piece):]
        if pending:
            cut = max(self.n_prompt, len(self.ids) - RESPLIT)
            redo = self.retok.bytes_of(self.ids[cut:]) + pending
            ids = self.retok.continuation(self.ids[:cut], redo)
            self.covered += len(self.retok.bytes_of(ids)) - (len(redo) - len(pending))
            self.ids[cut:] = ids
            pending = bytes(self.text[self.covered:])
        return (self.session.sync(self.ids)[-1] if self.ids else None), pending


class _DraftTextDrafter(Drafter):
    """A drafter whose draft model follows the target's text through a DraftTextContext; it keeps the draft tokens
    of its last proposal, which the next sync takes as they are where they spell the accepted text."""

    def __init__(self, context: DraftTextContext):
        self.ctx = context
        self.last_draft: list[int] = []  # the draft tokens of this drafter's latest proposal

    def sync(self, sequence: list[int]) -> tuple[Optional[np.ndarray], bytes]:
        """The draft's cache brought to the sequence's text (see DraftTextContext.sync)."""
        own, self.last_draft = self.last_draft, []
        return self.ctx.sync(sequence, own)


class _TextDrafter(_DraftTextDrafter):
    """Shared by SLEM and SLRS: draft k tokens, turn their text into target tokens.

    confidence: stop drafting early when the draft's top probability falls below it (0 = never).
    """

    def __init__(self, context: DraftTextContext, target_retokenizer: Retokenizer, vocab_map: VocabMap,
                 config: GenerationConfig, rng: np.random.Generator, draft_eos: Optional[int],
                 confidence: float = 0.0):
        super().__init__(context)
        self.target_retok, self.vocab_map = target_retokenizer, vocab_map
        self.config, self.rng, self.draft_eos, self.confidence = config, rng, draft_eos, confidence
        self.special = ~vocab_map.draft.has_text
        if draft_eos is not None:
            self.special[draft_eos] = False

    def without_specials(self, row: np.ndarray) -> np.ndarray:
        """The draft's logits with its special tokens other than EOS removed (never drafted)."""
        return np.where(self.special, -np.inf, row)

    def draft_distribution(self, row: np.ndarray) -> np.ndarray:
        """q over the draft vocabulary when sampling: the config's transform of `without_specials(row)`."""
        return distribution(self.without_specials(row), self.config)

    def draft(self, row: np.ndarray, k: int) -> list[int]:
        """k draft tokens from the cache's current end (fewer if EOS comes first)."""
        steps = draft_steps(self.ctx.session, row, k, self.config, self.rng, self.confidence,
                            shape=lambda row, drafted: self.without_specials(row),
                            ends=lambda token: token == self.draft_eos)
        return [token for token, _ in steps]

    def to_target(self, sequence: list[int], drafted: list[int], skip: bytes = b"") -> list[int]:
        """The target tokens that spell the drafted text (after `skip` bytes already proposed)."""
        ended = bool(drafted) and drafted[-1] == self.draft_eos
        text = self.ctx.retok.bytes_of(drafted[:-1] if ended else drafted)[len(skip):]
        tokens = self.target_retok.continuation(sequence, text)
        if ended and self.target_retok.bytes_of(tokens) == text:
            tokens.append(int(self.vocab_map.draft_to_target[self.draft_eos]))
        return tokens


class SLEMDrafter(_TextDrafter):
    """String-level exact match: the target keeps the longest prefix it would have written itself."""

    def propose(self, sequence: list[int], k: int) -> Proposal:
        row, pending = self.sync(sequence)
        return Proposal() if pending or row is None else self.slem_round(sequence, row, k)

    def slem_round(self, sequence: list[int], row: np.ndarray, k: int) -> Proposal:
        """Draft k tokens from row (the draft cache's current end) and propose their text."""
        drafted = self.draft(row, k)
        self.last_draft = drafted
        tokens = self.to_target(sequence, drafted)
        return Proposal(tokens, None if self.config.greedy else [None] * len(tokens))


class TLIDrafter(_DraftTextDrafter):
    """Token-level intersection: the draft samples inside the shared tokens; rejection sampling in the target's
    vocabulary."""

    def __init__(self, context: DraftTextContext, vocab_map: VocabMap, config: GenerationConfig,
                 rng: np.random.Generator, confidence: float = 0.0):
        super().__init__(context)
        self.config, self.rng, self.confidence = config, rng, confidence
        self.target_size = len(vocab_map.target)  # one entry per target logit
        self.d2t = vocab_map.draft_to_target[:context.session.vocab_size]
        self.shared = self.d2t != NO_TOKEN

    def propose(self, sequence: list[int], k: int) -> Proposal:
        row, pending = self.sync(sequence)
        if pending or row is None or not self.shared.any():
            return Proposal()
        steps = draft_steps(self.ctx.session, row, k, self.config, self.rng, self.confidence,
                            shape=lambda row, drafted: np.where(self.shared, row, -np.inf),
                            ends=lambda token: not self.ctx.retok.pieces.has_text[token])  # EOS ends the draft
        self.last_draft = [token for token, _ in steps]
        return Proposal([int(self.d2t[token]) for token, _ in steps],
                        None if self.config.greedy else [self.in_target(q) for _, q in steps])

    def in_target(self, q: np.ndarray) -> np.ndarray:
        """A draft distribution over the shared tokens, as a distribution over the target's vocabulary."""
        q_target = np.zeros(self.target_size)
        np.add.at(q_target, self.d2t[self.shared], q[self.shared])
        return q_target
