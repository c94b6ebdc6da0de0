"""Structured output: a constraint (constraint.py: JSON schema, any JSON object, regular expression, Lark or GBNF
grammar) that every generated token must follow, enforced with llguidance's byte-level matcher.

The decode loop masks the target's logits with the grammar at every position it verifies (`GrammarState.mask`),
so the output is what the constrained target alone writes, whatever was proposed; the drafter's proposals are
cut to the part the grammar allows (`GrammarState.valid_prefix`), a draft model's own picks are masked as it
drafts (`GrammarState.walk` for a draft of the target's vocabulary, `DraftGrammar` for one of another vocabulary),
and where the grammar forces the next tokens they are proposed without the draft (`GrammarState.forced`).
llguidance is imported only when a request carries a constraint.
"""
from __future__ import annotations

from contextlib import contextmanager
from functools import lru_cache
from typing import Any, Callable, Iterator, Optional, Sequence, Union

import numpy as np

from ..errors import EdgeSpecdecError
from ..vocab_map import TokenBytes
from .constraint import Constraint
from .session import common_prefix

SPECIAL = b"\xff"  # llguidance's mark for a token that is not text (its bytes can never match a grammar)
# What a constraint may cost llguidance to compile: its lexer's initial fuel (about 50 units a microsecond, so a few
# ms). A constraint past it is refused; it also bounds one computation of forced bytes (to about a quarter of it),
# so a long forced literal is computed a piece at a time
GRAMMAR_FUEL = 100_000
# llguidance spells the bytes a grammar forces with the tokenizer at every mask and fast-forward; only the first
# tokens are ever used (a round takes a few), so only this many bytes of them are spelled (or 4 tokens' worth, for a
# vocabulary of longer tokens)
SPELL_BYTES = 512


class GrammarTokenizer:
    """A vocabulary as llguidance sees it, built from the bundle's token-bytes table (no tokenizers or
    transformers import): every id's bytes, special tokens marked as never-text, the logits' width (ids past
    the tokenizer's, padding, are special too) and the end-of-sequence ids. `encode` (text -> ids, specials
    dropped) spells the forced bytes the way the model's own tokenizer does. Build one per vocabulary and keep
    it: it indexes the whole vocabulary."""

    def __init__(self, pieces: TokenBytes, width: int, eos_ids: list[int], encode: Callable[[str], list[int]],
                 special_texts: Optional[dict[int, str]] = None, spell_bytes: Optional[int] = SPELL_BYTES):
        from llguidance import LLTokenizer

        self.width = width
        special_texts = special_texts or {}
        tokens, specials = [], []
        for i in range(width):
            piece = pieces.piece(i) if i < len(pieces) else None
            if piece is None:
                specials.append(i)
                piece = SPECIAL + special_texts.get(i, f"<[{i}]>").encode()
            tokens.append(piece)
        has_text = pieces.has_text
        longest = int(np.diff(pieces.offsets).max()) if len(pieces) else 0
        spell_limit = float("inf") if spell_bytes is None else max(spell_bytes, 4 * longest)

        class Wrapper:  # the duck type llguidance's TokenizerWrapper describes
            is_tokenizer_wrapper = True

            def __call__(self, text: Union[str, bytes]) -> list[int]:
                """text's tokens; of a long text (the bytes a grammar forces), those of its first spell_limit
                bytes but the last, which might have merged with the bytes cut off."""
                data = text.encode() if isinstance(text, str) else text
                cut = len(data) > spell_limit
                if cut:
                    end = int(spell_limit)
                    while end > 0 and data[end] & 0xC0 == 0x80:  # not inside a UTF-8 character
                        end -= 1
                    data = data[:end]
                ids = [t for t in encode(data.decode("utf-8", "replace")) if t < len(has_text) and has_text[t]]
                return ids[:-1] if cut else ids

        wrapper = Wrapper()
        wrapper.tokens, wrapper.special_token_ids = tokens, specials
        wrapper.eos_token_id = eos_ids[0] if eos_ids else None
        wrapper.bos_token_id = None
        self.tokenizer = LLTokenizer(wrapper, n_vocab=width, eos_token=list(eos_ids) or None)

    def compile(self, constraint: Constraint, base: int = 0) -> "GrammarState":
        """A run's grammar state for the constraint; `base`: the prompt's length (see GrammarState)."""
        return GrammarState(self, constraint, base)


class GrammarState:
    """One run's grammar: the generated tokens are committed to it (`commit`), and masks, forced tokens and
    walks along proposals start from there. `base` is where the output starts in the decode loop's sequence
    (the prompt's length), so that a drafter handed a longer sequence is walked to its end first."""

    def __init__(self, tokenizer: GrammarTokenizer, constraint: Constraint, base: int = 0):
        from llguidance import LLMatcher

        self.width, self.base, self.committed = tokenizer.width, base, 0
        self.constraint = constraint  # a heterogeneous drafter compiles it again for its own vocabulary
        grammar = constraint.llguidance_grammar()
        problem = grammar_problem(grammar, constraint.kind)
        if problem:
            raise EdgeSpecdecError(problem)
        self.matcher = LLMatcher(tokenizer.tokenizer, grammar, log_level=0, limits=grammar_limits())
        if self.matcher.is_error():
            raise EdgeSpecdecError(cannot_be_used(constraint.kind, self.matcher.get_error()))
        # the tokens the grammar forces from committed position `forced_at` on (see forced)
        self.forced_run: list[int] = []
        self.forced_at: Optional[int] = None

    def allowed(self) -> np.ndarray:
        """The ids the grammar allows next, as a bool array over the logits' width. A grammar that fails here (it
        dead-ends after the text so far, or its lexer outgrows GRAMMAR_FUEL) cannot go on: its matcher keeps the
        error, so the run ends with it."""
        bits = np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8)
        if self.matcher.is_error():
            raise EdgeSpecdecError(cannot_be_used(self.constraint.kind, self.matcher.get_error(),
                                                  f"the {self.committed} tokens written"))
        return np.unpackbits(bits, bitorder="little")[:self.width].astype(bool)

    def mask(self, rows: np.ndarray, tokens: list[int]) -> np.ndarray:
        """rows (logits; row i follows tokens[:i]) with every id the grammar forbids at its position set to -inf.
        Rows after the first token the grammar refuses stay as they are: verification rejects that token at the
        latest, so they decide nothing."""
        rows = np.array(rows, dtype=np.float32)
        with self.walk() as walk:
            for i in range(len(rows)):
                rows[i, ~self.allowed()] = -np.inf
                if i == len(tokens) or not walk.step(tokens[i]):
                    break
        return rows

    def valid_prefix(self, sequence: list[int], tokens: list[int]) -> int:
        """How many of tokens, from the first, the grammar allows after `sequence` (the decode loop's)."""
        with self.walk(sequence) as walk:
            return 0 if walk is None or not tokens else self.matcher.validate_tokens(tokens)

    def forced(self, limit: int) -> list[int]:
        """Up to `limit` tokens the grammar forces next (its fast-forward tokens: the bytes it allows are one
        string, spelled as the tokenizer spells it). The run is computed once per position and what the target
        keeps of it is carried over (see commit): a long forced literal is not recomputed every round."""
        if limit <= 0 or self.done:
            return []
        if self.forced_at != self.committed:
            self.forced_run, self.forced_at = list(self.matcher.compute_ff_tokens()), self.committed
        return self.forced_run[:limit]

    def until_done(self, tokens: list[int]) -> int:
        """How many of tokens the run keeps: all, or up to the one after which the grammar allows nothing more."""
        with self.walk() as walk:
            for i, token in enumerate(tokens):
                if not walk.step(token) or self.done:
                    return i + 1
        return len(tokens)

    @contextmanager
    def walk(self, sequence: Optional[list[int]] = None) -> Iterator[Optional["Walk"]]:
        """A walk from the committed state that is rolled back on exit. With a sequence (the decode loop's,
        perhaps with proposed tokens after the output so far), first along its tokens past the committed ones;
        None when the grammar refuses one of them."""
        walk = Walk(self.matcher)
        try:
            extra = [] if sequence is None else sequence[self.base + self.committed:]
            yield walk if all(walk.step(t) for t in extra) else None
        finally:
            walk.undo()

    def commit(self, tokens: list[int]) -> None:
        """The tokens the run wrote this round (each one the masked target's, so the grammar allows them)."""
        if tokens and not self.matcher.consume_tokens(tokens):
            error = self.matcher.get_error()
            if outgrown(error):  # the constraint's fault, not the decode loop's
                raise EdgeSpecdecError(cannot_be_used(self.constraint.kind, error, f"the {self.committed} tokens "
                                                                                   f"written"))
            raise RuntimeError(f"the grammar refused a token the masked target wrote: {first_line(error)}")
        run = self.forced_run
        if self.forced_at == self.committed and len(run) > len(tokens) and run[:len(tokens)] == tokens:
            self.forced_run, self.forced_at = run[len(tokens):], self.committed + len(tokens)
        self.committed += len(tokens)

    @property
    def done(self) -> bool:
        """The grammar allows nothing more (its text is complete): the run ends."""
        return self.matcher.is_stopped()

    @property
    def complete(self) -> bool:
        """The output so far is a whole match of the constraint."""
        return self.matcher.is_accepting()


class Walk:
    """Tokens consumed on trial; `undo` rolls them back."""

    def __init__(self, matcher):
        self.matcher, self.steps = matcher, 0

    def step(self, token: int) -> bool:
        """Consume token if the grammar allows it here; False (and nothing consumed) if not."""
        if self.matcher.is_stopped() or not self.matcher.validate_tokens([token]):
            return False
        self.matcher.consume_token(token)
        self.steps += 1
        return True

    def undo(self) -> None:
        if self.steps:
            self.matcher.rollback(self.steps)
        self.steps = 0


class DraftGrammar:
    """The run's constraint in a draft model's own vocabulary, for the drafters that draft in it (SLEM, TLI, SLRS):
    their draft logits are masked with it, so they propose only text the grammar allows.

    llguidance reads bytes, so the constraint compiled against the draft's token table allows the same texts as the
    target's grammar; what it needs is the output so far in draft tokens. The drafter's text context spells the
    output in draft tokens that end exactly where the output ends, and may respell its last few each round (a
    draft token that straddled the end of the text the target kept is replaced by ones that stop there). `follow`
    keeps the matcher on that spelling: it rolls back to the tokens both spellings share and consumes the rest.
    Drafting then walks the drafted tokens on trial (`allowed(after)`) and rolls them back, so the matcher holds
    only the output. When the spelling is one the grammar refuses (it should not be: the same bytes passed the
    target's grammar) the matcher keeps the part it took and is out of step: `allowed` says None, the round
    drafts freely and the decode loop cuts the proposal, as without this; the next `follow` tries again from the
    shared tokens. It never touches the output: the target's mask and the verification decide that."""

    def __init__(self, tokenizer: GrammarTokenizer, constraint: Constraint):
        self.state = tokenizer.compile(constraint)
        self.consumed: list[int] = []  # the draft tokens of the output the matcher holds
        self.in_step = True
        # proposals (one follow each) drafted under the mask, and drafted freely (the matcher out of step)
        self.rounds_masked = self.rounds_free = 0

    def follow(self, tokens: list[int]) -> bool:
        """Bring the matcher to the output spelled as these draft tokens; whether it is in step with them."""
        matcher = self.state.matcher
        keep = common_prefix(self.consumed, tokens)
        if keep < len(self.consumed):
            matcher.rollback(len(self.consumed) - keep)
            del self.consumed[keep:]
        rest = tokens[keep:]
        taken = matcher.try_consume_tokens(rest) if rest else 0  # never leaves the matcher in an error state
        self.consumed += rest[:taken]
        self.in_step = taken == len(rest)
        self.rounds_masked += self.in_step
        self.rounds_free += not self.in_step
        return self.in_step

    def out_of_step(self) -> None:
        """The drafter has no spelling of the output this round (its context could not spell some bytes)."""
        self.in_step = False
        self.rounds_free += 1

    def allowed(self, after: Sequence[int] = ()) -> Optional[np.ndarray]:
        """The draft ids the grammar allows after the output and then the drafted tokens `after`, as a bool array
        over the draft's logits; None when there is nothing to mask with: the matcher is out of step, or the
        grammar refuses one of `after` (a token drafted before the mask applied). Once the grammar's text is
        complete it allows nothing: the run ends there (llguidance would allow EOS, which the target never
        writes after it)."""
        if not self.in_step:
            return None
        with self.state.walk() as walk:
            if not all(walk.step(t) for t in after):
                return None
            return np.zeros(self.state.width, dtype=bool) if self.state.done else self.state.allowed()

    def stats(self) -> dict:
        return {"draft_grammar_rounds": {"masked": self.rounds_masked, "free": self.rounds_free}}


def grammar_limits():
    """llguidance's limits for every constraint compiled here (GRAMMAR_FUEL)."""
    from llguidance import LLParserLimits

    return LLParserLimits(initial_lexer_fuel=GRAMMAR_FUEL)


@lru_cache(maxsize=1)
def byte_tokenizer() -> GrammarTokenizer:
    """A vocabulary of the 256 bytes and an end of text: it spells any text, so a constraint can be tried on it
    without a model's tokenizer. Its spelling costs nothing, so forced text is spelled whole."""
    pieces = TokenBytes.pack([bytes([b]) for b in range(256)])
    return GrammarTokenizer(pieces, 257, [256], lambda text: list(text.encode()), spell_bytes=None)


def constraint_problem(constraint: Constraint) -> Optional[str]:
    """What is wrong with the constraint, on one line (a schema feature llguidance does not implement, a regex or
    grammar that does not parse, one that compiles past GRAMMAR_FUEL, one that admits no text), or None. Needs no
    tokenizer: a server checks a request with it before anything is written."""
    constraint.check()
    return grammar_problem(constraint.llguidance_grammar(), constraint.kind)


@lru_cache(maxsize=256)
def grammar_problem(grammar: str, kind: str) -> Optional[str]:
    """What is wrong with a constraint's llguidance grammar (see constraint_problem), or None. Besides
    llguidance's own checks, the grammar is walked on the byte vocabulary along the text it forces from the start:
    a grammar that allows nothing there (a regex that matches nothing, a rule defined only by itself) would fail
    the run at its first token."""
    from llguidance import LLMatcher

    is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar, limits=grammar_limits())
    if is_error:
        return cannot_be_used(kind, messages[0])
    matcher = LLMatcher(byte_tokenizer().tokenizer, grammar, log_level=0, limits=grammar_limits())
    forced = [] if matcher.is_error() else list(matcher.compute_ff_tokens())
    if not matcher.is_error() and matcher.consume_tokens(forced) and not matcher.is_stopped():
        matcher.compute_bitmask()
    if not matcher.is_error():
        return None
    text = bytes(forced).decode("utf-8", "replace")
    shown = repr(text) if len(text) <= 40 else f"{text[:40]!r}... ({len(text)} characters)"
    return cannot_be_used(kind, matcher.get_error(), shown if text else "")


def cannot_be_used(kind: str, message: str, after: str = "") -> str:
    """llguidance's complaint about a constraint, said to a user; `after`: what it was given before (the text it
    forces, the tokens written), if anything."""
    name, line = kind.replace("_", " "), first_line(message)
    if line.startswith("NoExtensionBias"):  # llguidance's word for "nothing may come next"
        where = f"nothing may follow {after}" if after else "nothing matches it"
        return f"the {name} constraint admits no text ({where}): fix the {name} so that some text matches it."
    if outgrown(line):
        line += (f": the constraint compiles to more than the grammar engine's limit ({GRAMMAR_FUEL} units); make "
                 f"it smaller (fewer alternatives, shorter repeated or literal parts)")
    return f"the {name} constraint cannot be used{f' after {after}' if after else ''}: {line}"


def outgrown(message: str) -> bool:
    """Does llguidance's error say the constraint outgrew GRAMMAR_FUEL?"""
    return "too big" in message or "too many expressions" in message


def first_line(message: str) -> str:
    """llguidance's error message on one line: its first line, and the line that says what the error is when
    the message draws a picture of where it is in between."""
    lines = [line.strip() for line in (message or "unknown error").strip().splitlines() if line.strip()]
    detail = next((line for line in lines[1:] if line.startswith("error:")), None)
    return lines[0] if detail is None else f"{lines[0]} {detail[len('error:'):].strip()}"


def as_constraint(value: Any) -> Optional[Constraint]:
    """None, a Constraint, or the short forms users write: {"json_schema": {...}}, {"regex": "..."},
    {"grammar": "..."}, {"json_object": True}."""
    if value is None or isinstance(value, Constraint):
        return value
    if isinstance(value, dict) and len(value) == 1:
        (kind, spec), = value.items()
        return Constraint("json_object") if kind == "json_object" and spec else Constraint(kind, spec)
    raise EdgeSpecdecError(f"a constraint is a Constraint or one of {{'json_schema': ...}}, {{'regex': ...}}, "
                           f"{{'grammar': ...}}, {{'json_object': True}}; got {value!r}.")
