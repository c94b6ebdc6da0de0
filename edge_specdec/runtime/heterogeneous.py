"""Drafters for a draft model whose vocabulary differs from the target's (Timor et al., ICML 2025).

All three talk to the decode loop like any drafter: propose(sequence, k) returns target tokens, and for
each either the distribution it was drawn from (rejection sampling) or None (the target keeps the token
only if it picks it itself; lossless for any proposal). The draft's cache follows the target's text through
`DraftTextContext`, so the tokens the target wrote itself (a correction, a bonus token) reach the draft as text.
They learn a round's outcome from that text, not from accept(): a count of target tokens says nothing of which
draft tokens spelled them. Under a constraint (structured output) each compiles it for the draft's own vocabulary
(grammar.DraftGrammar, kept on the draft's spelling of the output) and masks its draft logits with it, so it
proposes only text the grammar allows.

- SLEMDrafter: draft tokens -> text -> target tokens (re-tokenized with a window, see retokenize.py).
- TLIDrafter: the draft samples only tokens that exist in both vocabularies, so each maps 1:1 to a target
  token and its (renormalized) probability is the proposal distribution of standard rejection sampling.
- SLRSDrafter lives in slrs.py.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import numpy as np

from ..vocab_map import NO_TOKEN, TokenBytes, VocabMap
from .draft_window import DraftWindow
from .drafters import Drafter, Proposal, draft_steps, steered
from .grammar import DraftGrammar, GrammarTokenizer
from .retokenize import Retokenizer
from .sampling import GenerationConfig, distribution
from .session import ModelSession, common_prefix

RESPLIT = 2  # generated draft tokens re-tokenized together with newly accepted text


def draft_prompt_ids(prompt_ids: list[int], target_pieces: TokenBytes, retokenizer: Retokenizer,
                     twins: dict[int, int]) -> list[int]:
    """A prompt in the draft's tokens: its text re-tokenized by the draft, with each of the target's special tokens
    that has a twin in the draft's vocabulary (a special token of the same name, such as ChatML's <|im_start|> and
    <|im_end|>, which Qwen and SmolLM2 both have) as that twin, so that the draft sees where the turns of a chat
    start and end; the target's other special tokens spell nothing here, as everywhere the draft reads text."""
    ids: list[int] = []
    segment = bytearray()

    def flush():
        if segment:
            ids.extend(retokenizer.continuation(ids, bytes(segment)) if ids else
                       retokenizer.encode(bytes(segment).decode("utf-8", errors="replace")))
            segment.clear()
    for token in prompt_ids:
        if token in twins:
            flush()
            ids.append(twins[token])
        else:
            segment.extend(target_pieces.piece(token) or b"")
    flush()
    return ids


class DraftTextContext:
    """The draft model's view of the text: its own tokenization of the prompt, then of the accepted text.

    sync(sequence, own) brings the draft's cache to the text of the target's sequence: the draft tokens of the
    drafter's last proposal (`own`) that spell the accepted text are kept as they are (no tokenizer call on that
    path); other text is re-tokenized together with the last RESPLIT draft tokens, and the cache is rolled back to
    the first token that changed and fed only what it lacks.

    grammar_tokenizer: the draft's vocabulary as structured output's grammar engine reads it, built when a
    constrained run first asks (None: a drafter of this context drafts freely under a constraint).
    window: the draft's cache holds only this window of the text (draft_window.py; None: all of it). It is cut in
    the draft's own tokens, so a window is measured in what the draft's context counts: the draft tokens of the
    whole text (the prompt re-tokenized by the draft, then the accepted text) are one spelling of it, and the
    window is its head and its tail, which is the text cut at a boundary of that spelling.
    """

    def __init__(self, session: ModelSession, retokenizer: Retokenizer, vocab_map: VocabMap,
                 prompt_len: int, prompt_draft_ids: list[int],
                 grammar_tokenizer: Optional[Callable[[], GrammarTokenizer]] = None,
                 window: Optional[DraftWindow] = None):
        self.session, self.retok, self.target_pieces = session, retokenizer, vocab_map.target
        self.grammar_tokenizer, self.window = grammar_tokenizer, window
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
        return (self.session.sync(self.view())[-1] if self.ids else None), pending

    def view(self) -> list[int]:
        """The draft tokens the draft's cache holds for the text: the window of self.ids, or all of them."""
        return self.window.view(self.ids) if self.window is not None else list(self.ids)

    def most(self, k: int) -> int:
        """The most draft tokens a round may draft from the cache's current end (the window's room)."""
        return self.window.most(k, self.session.length) if self.window is not None else k

    @property
    def output_ids(self) -> list[int]:
        """The generated text in draft tokens (they spell it exactly after a sync that left nothing pending)."""
        return self.ids[self.n_prompt:]


class _DraftTextDrafter(Drafter):
    """A drafter whose draft model follows the target's text through a DraftTextContext; it keeps the draft tokens
    of its last proposal, which the next sync takes as they are where they spell the accepted text."""

    def __init__(self, context: DraftTextContext):
        self.ctx = context
        self.last_draft: list[int] = []  # the draft tokens of this drafter's latest proposal
        self.grammar: Optional[DraftGrammar] = None  # the run's constraint in the draft's vocabulary

    def constrain(self, grammar) -> None:
        """The run's constraint (from the target's grammar.GrammarState), compiled for the draft's vocabulary: the
        draft's logits are masked with it from now on."""
        if self.ctx.grammar_tokenizer is not None:
            self.grammar = DraftGrammar(self.ctx.grammar_tokenizer(), grammar.constraint)

    def stats(self) -> dict:
        window = self.ctx.window.stats() if self.ctx.window is not None else {}
        return {**(self.grammar.stats() if self.grammar is not None else {}), **window}

    def sync(self, sequence: list[int]) -> tuple[Optional[np.ndarray], bytes]:
        """The draft's cache brought to the sequence's text (see DraftTextContext.sync), and the draft's grammar to
        the draft tokens that spell it. With bytes pending (the draft could not spell them) the round drafts
        nothing, so the grammar waits for the next."""
        own, self.last_draft = self.last_draft, []
        row, pending = self.ctx.sync(sequence, own)
        if self.grammar is not None and not pending:
            self.grammar.follow(self.ctx.output_ids)
        return row, pending

    def restrict(self, row: np.ndarray, after: Sequence[int] = ()) -> Optional[np.ndarray]:
        """row (draft logits) with the ids the draft's grammar refuses after the output and the drafted tokens
        `after` set to -inf; row itself without a grammar or when it has no mask to give (out of step: the round
        drafts freely); None when the grammar allows none of the ids the row can draft (drafting stops)."""
        allowed = self.grammar.allowed(after) if self.grammar is not None else None
        if allowed is None:
            return row
        masked = np.where(allowed, row, -np.inf)
        return masked if np.isfinite(masked).any() else None

    @property
    def drafting_freely(self) -> bool:
        """Under a constraint, this round's draft is not masked (the draft's grammar is out of step): the decode
        loop cuts the proposal where the grammar refuses it. Cutting a token drawn from a distribution q would
        bias rejection sampling (the target would draw from p where it must draw from max(0, p - q)), so such a
        round proposes its tokens without q: verification then treats each as deterministic, which is lossless
        for any proposal, cut or not."""
        return self.grammar is not None and not self.grammar.in_step


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

    def shape(self, row: np.ndarray, after: Sequence[int] = ()) -> Optional[np.ndarray]:
        """The logits the draft picks from after the output and the drafted tokens `after`: its special tokens
        other than EOS removed, and what the grammar refuses (see `restrict`; None: nothing can be drafted)."""
        return self.restrict(self.without_specials(row), after)

    def draft_distribution(self, row: np.ndarray, after: Sequence[int] = ()) -> Optional[np.ndarray]:
        """q over the draft vocabulary when sampling: the config's transform of `shape(row, after)`."""
        row = self.shape(row, after)
        return None if row is None else distribution(row, self.config)

    def draft(self, row: np.ndarray, k: int, after: Sequence[int] = ()) -> list[int]:
        """k draft tokens from the cache's current end, which is `after` past the output (fewer if EOS comes first
        or the grammar allows nothing more)."""
        steps = draft_steps(self.ctx.session, row, self.ctx.most(k), self.config, self.rng, self.confidence,
                            shape=lambda row, drafted: self.shape(row, [*after, *drafted]),
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
        steps = draft_steps(self.ctx.session, row, self.ctx.most(k), self.config, self.rng, self.confidence,
                            shape=lambda row, drafted: self.restrict(np.where(self.shared, row, -np.inf), drafted),
                            ends=lambda token: not self.ctx.retok.pieces.has_text[token],  # EOS ends the draft
                            pick=steered(self.steer, sequence))
        self.last_draft = [token for token, _ in steps]
        return Proposal([int(self.d2t[token]) for token, _ in steps],
                        None if self.config.greedy or self.drafting_freely else [self.in_target(q) for _, q in steps])

    def in_target(self, q: np.ndarray) -> np.ndarray:
        """A draft distribution over the shared tokens, as a distribution over the target's vocabulary."""
        q_target = np.zeros(self.target_size)
        np.add.at(q_target, self.d2t[self.shared], q[self.shared])
        return q_target
