"""Simulated rounds: the target's greedy answers, computed once, replayed to each candidate's real decode loop.

`ReplayTarget` stands in for the target's ModelSession. Its row after each position puts all the mass on the
token the target wrote there, so verification keeps exactly the drafted tokens that match the answer, and the
next token is the answer's: a greedy run on it makes the same rounds, proposals and acceptances as on the real
target. Everything else is the runtime's own (DecodingSession.generate: `auto`'s algorithm, the draft model on
its device, the confidence stop, the draft length, free drafts first, the re-tokenizer); only the clock is left
out of the drafting decisions (SpeculativeConfig.clock=False), since a target that costs nothing would bias
them. The stand-in records each call: the sequence it verified after, the tokens proposed, and the seconds the
loop spent between calls (the draft, the free-draft lookups, re-tokenization, verification and emission), which
`seconds_per_token` prices with the target's measured cost of a call of that size.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Union

import numpy as np

from ..errors import EdgeSpecdecError
from ..runtime import Engine, GenerationConfig, Result, SpeculativeConfig
from ..runtime.session import common_prefix


@dataclass(frozen=True)
class Answer:
    """A prompt (text, or token ids of a rendered conversation) and the target's tokens after it: its greedy answer,
    or a sampled one (sampled.py) with the target's probability of each of its tokens (target_probs)."""
    prompt: Union[str, list[int]]
    prompt_ids: list[int]
    tokens: list[int]
    config: GenerationConfig
    target_probs: Optional[tuple[float, ...]] = None


@dataclass(frozen=True)
class Call:
    """One target call of a run: the length of the sequence it verifies after, the tokens proposed with it, and
    the loop's seconds since the previous call returned (None for the run's first call, which carries the prompt)."""
    sequence_length: int
    proposed: int
    gap: Optional[float]


@dataclass
class Replayed:
    """One run on the stand-in: the runtime's Result and the target calls it made."""
    result: Result
    calls: list[Call] = field(default_factory=list)
    prompt_length: int = 0

    def target_sizes(self) -> set[int]:
        """The sizes of the target calls after the first (proposed tokens + 1), to be priced."""
        return {c.proposed + 1 for c in self.calls[1:]}

    def seconds_per_token(self, target_seconds: Callable[[int], float]) -> Optional[float]:
        """The run's seconds per output token once its first round is out, each call priced as the loop's
        seconds before it plus target_seconds(tokens it feeds); None when the first round wrote everything."""
        if len(self.calls) < 2:
            return None
        seconds = sum(c.gap + target_seconds(c.proposed + 1) for c in self.calls[1:])
        tokens = self.prompt_length + self.result.stats.new_tokens - self.calls[1].sequence_length
        return seconds / tokens if tokens > 0 else None


class ReplayTarget:
    """The target's session, replaying one greedy answer (see the module's docstring): the interface generate()
    and DecodingSession use (sync, rollback, keep_prefix, reset, reserve, min_block, vocab_size, ...)."""

    rollback_method = "replay"
    device = precision = "replay"
    output_ids = None
    prefill_reach = 0  # no long-prompt prefill copy pads its calls

    def __init__(self, vocab_size: int, max_context: Optional[int] = None):
        self.vocab_size, self.max_context = vocab_size, max_context
        self.block_invariant = True  # its rows are the same however they are fed
        self.min_block = 1
        self.tokens: list[int] = []
        self.expected: list[int] = []
        self.calls: list[Call] = []
        self._returned: Optional[float] = None

    def load(self, answer: Answer) -> None:
        """Replay this answer from the next run on (the calls recorded so far are dropped)."""
        self.expected = list(answer.prompt_ids) + list(answer.tokens)
        self.calls, self._returned = [], None
        self.reset()

    @property
    def length(self) -> int:
        return len(self.tokens)

    def reset(self) -> None:
        self.tokens = []

    def reserve(self, n_tokens: int) -> None:
        pass

    def keep_prefix(self, tokens: list[int]) -> int:
        keep = min(common_prefix(self.tokens, tokens), len(tokens) - 1)
        del self.tokens[keep:]
        return keep

    def end_prompt(self, tokens: list[int]) -> None:
        pass  # its rows do not depend on how they are fed

    def rollback(self, n: int) -> None:
        if n > 0:
            del self.tokens[-n:]

    def truncate(self, length: int) -> None:
        del self.tokens[length:]

    def sync(self, sequence: list[int], extra=()) -> np.ndarray:
        """The rows from sequence[-1] on: row i puts all its mass on the answer's token after sequence + extra[:i]
        (past the answer's end, which only a proposal that runs over its EOS reaches, on a token other than the
        proposal's: the output stops at the EOS either way)."""
        called = time.perf_counter()
        if sequence != self.expected[:len(sequence)]:
            raise EdgeSpecdecError("the replayed run left the target's answer: the simulation's verification is "
                                   "broken (please report this with the prompt).")
        self.keep_prefix(sequence)
        self.tokens += sequence[len(self.tokens):] + list(extra)
        rows = np.full((len(extra) + 1, self.vocab_size), -np.inf, dtype=np.float32)
        for i in range(len(extra) + 1):
            position = len(sequence) + i
            if position < len(self.expected):
                rows[i, self.expected[position]] = 0.0
            else:  # past the answer's end (its EOS): the output has ended; no proposed token is kept there
                rows[i, (extra[i] + 1) % self.vocab_size if i < len(extra) else 0] = 0.0
        self.calls.append(Call(len(sequence), len(extra),
                               None if self._returned is None else called - self._returned))
        self._returned = time.perf_counter()
        return rows


def greedy_answers(engine: Engine, prompts: list[Union[str, list[int]]], max_new_tokens: int,
                   say: Callable[[str], None] = lambda _: None) -> list[Answer]:
    """The target alone's greedy answer to each prompt, with the bundle's default settings (as `run` decodes)."""
    config = dataclasses.replace(engine.default_config, max_new_tokens=max_new_tokens, temperature=0)
    if config.eos_token_ids is None:
        config = dataclasses.replace(config, eos_token_ids=engine.bundle.target.eos_token_ids)
    session = engine.session()
    answers = []
    for i, prompt in enumerate(prompts):
        result = session.generate(prompt, config, algorithm="none", pool_scope=None)
        prompt_ids = engine.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        answers.append(Answer(prompt, prompt_ids, list(result.token_ids), config))
        say(f"  prompt {i + 1}/{len(prompts)}: {len(result.token_ids)} tokens")
    return answers


def replay(engine: Engine, answers: list[Answer], speculative: SpeculativeConfig) -> list[Replayed]:
    """Each answer replayed through the engine's decode loop with these speculative settings (clock-free; no draft
    pool: each prompt runs as a first request would). A sampled answer's run drafts along it (sampled.py)."""
    from .sampled import AlongAnswer

    speculative = dataclasses.replace(speculative, clock=False, guard=False, pool_scope=None)
    session = engine.session()
    stand_in = ReplayTarget(session.target.vocab_size, session.target.max_context)
    session.target = stand_in
    out = []
    for answer in answers:
        stand_in.load(answer)
        session.draft_steer = None
        if not answer.config.greedy:
            algorithm = engine.resolve_algorithm(speculative.algorithm, answer.config)
            session.draft_steer = AlongAnswer(answer, engine.vocab_map.draft_to_target if algorithm == "tli"
                                              else None)
        result = session.generate(answer.prompt, answer.config, **dataclasses.asdict(speculative))
        if result.token_ids != answer.tokens:
            raise EdgeSpecdecError("the replayed run did not write the target's answer: the simulation is broken "
                                   "(please report this with the prompt).")
        out.append(Replayed(result, list(stand_in.calls), len(answer.prompt_ids)))
    return out
