"""Simulated sampled rounds: the target's sampled answers, and the draft's acceptances drawn given them.

A sampled run's output is a sample of the target's own distribution, whichever draft runs (that is what makes
speculative sampling lossless). So the simulation samples the target alone's answer to each prompt once (seeded),
records the target's probability p(y) of each token y it wrote (the rows along the answer, after the penalties and
the config's transform, as verification computes them), and replays every candidate on that answer (replay.py).
What it must still draw is which positions of a round the draft's token was accepted at, and it draws them from
their exact law given that the output is the stored answer:

- a drafted token with a distribution q (`standard`, `tli`): the real rule draws x ~ q and keeps it with
  probability min(1, p(x) / q(x)), else draws from max(0, p - q). Given that the output at this position is y,
  the draft's token was accepted with probability min(p(y), q(y)) / p(y) = min(1, q(y) / p(y)), and then it was
  y. `AlongAnswer` (the drafter's `steer`) computes q along the answer in the real drafter, draws that
  acceptance, and drafts y when it is accepted, or a token other than y (drawn from q without y) when it is not;
  the draft then drafts on from there as it would. Verification is the runtime's own (verify.py) against the
  replaying target (ReplayTarget: all of each row's mass on the answer's token): it keeps y and rejects the other
  token, writing y in its place, so the run stays on the answer;
- a token without q (a free copy, `slem`'s re-tokenized text, prompt lookup): the real rule keeps x with
  probability p(x), so given the output y it was accepted exactly when x = y. The drafter draws freely (the
  runtime's own draws) and the replaying target keeps the tokens that match: no steering is needed.

So the rounds' acceptance pattern has the law of a real sampled run's (the output being the target's sample).
One detail is not the real law: after a rejection, the rest of the round's proposal follows a rejected token
drawn from q without y, where the real rejected token follows max(0, q - p) (the full rows are not stored). It
changes only how many tokens the draft goes on drafting after it (the confidence stop, an end token), not what is
accepted.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Optional, Union

import numpy as np

from ..errors import EdgeSpecdecError
from ..runtime import Engine
from ..runtime.sampling import MAX_TEMPERATURE, MIN_TEMPERATURE, distribution, penalize, sample
from .replay import Answer

STEER_STREAM = 1  # the acceptances' random numbers: a stream of their own beside the run's (seeded by the answer)


@dataclass(frozen=True)
class Sampling:
    """The sampled decoding to predict: its temperature and top-p (the bundle's other defaults apply, as in `run`),
    and the seed of the first prompt's answer (the next prompts take the next seeds)."""
    temperature: float = 0.8
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self):
        t = self.temperature
        if not isinstance(t, (int, float)) or not MIN_TEMPERATURE <= t <= MAX_TEMPERATURE:
            raise EdgeSpecdecError(f"the sampling temperature must be between {MIN_TEMPERATURE:g} and "
                                   f"{MAX_TEMPERATURE:g} (greedy is the default without --sampling), not "
                                   f"{self.temperature!r}.")
        if not isinstance(self.top_p, (int, float)) or not 0.0 < self.top_p <= 1.0:
            raise EdgeSpecdecError(f"top_p must be above 0 and at most 1 (1: off), not {self.top_p!r}.")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise EdgeSpecdecError(f"the seed must be a whole number of at least 0, not {self.seed!r}.")

    def describe(self) -> str:
        return f"sampled (temperature {self.temperature:g}, top-p {self.top_p:g}, seeds from {self.seed})"


def sampled_answers(engine: Engine, prompts: list[Union[str, list[int]]], max_new_tokens: int,
                    sampling: Sampling, say: Callable[[str], None] = lambda _: None) -> list[Answer]:
    """The target alone's sampled answer to each prompt (seed + the prompt's index; the bundle's other defaults,
    as `run` decodes), with the target's probability of each token it wrote."""
    temperature, top_p, seed = sampling.temperature, sampling.top_p, sampling.seed
    base = dataclasses.replace(engine.default_config, max_new_tokens=max_new_tokens, temperature=temperature,
                               top_p=top_p)
    if base.eos_token_ids is None:
        base = dataclasses.replace(base, eos_token_ids=engine.bundle.target.eos_token_ids)
    session = engine.session()
    rows: list[np.ndarray] = []
    real_sync = session.target.sync

    def recording_sync(sequence, extra=()):  # the target alone's rows, one per call, along its answer
        out = real_sync(sequence, extra)
        rows.append(np.array(out[-1], dtype=np.float32))
        return out
    session.target.sync = recording_sync
    answers = []
    try:
        for i, prompt in enumerate(prompts):
            config = dataclasses.replace(base, seed=seed + i)
            rows.clear()
            result = session.generate(prompt, config, algorithm="none", pool_scope=None)
            prompt_ids = engine.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
            tokens = list(result.token_ids)
            probs = target_probabilities(rows[:len(tokens)], prompt_ids, tokens, config)
            answers.append(Answer(prompt, prompt_ids, tokens, config, tuple(probs)))
            say(f"  prompt {i + 1}/{len(prompts)}: {len(tokens)} tokens sampled")
    finally:
        del session.target.sync
    return answers


def target_probabilities(rows: list[np.ndarray], prompt_ids: list[int], tokens: list[int], config) -> list[float]:
    """p(y) of each answer token y under the row that decided it, after the penalties and the config's transform
    (verify.py's distribution)."""
    probs = []
    for t, (row, y) in enumerate(zip(rows, tokens)):
        penalized = penalize(row[None], config, prompt_ids + tokens[:t], [], len(prompt_ids))
        probs.append(float(distribution(penalized, config)[0, y]))
    return probs


class AlongAnswer:
    """A sampling draft model's steer (Drafter.steer) for one stored answer (see the module's docstring).

    to_target: the target token each draft token is (TLI's draft vocabulary; None: the draft's ids are the
    target's)."""

    def __init__(self, answer: Answer, to_target: Optional[np.ndarray] = None):
        if answer.target_probs is None:
            raise ValueError("a sampled answer carries the target's probabilities of its tokens")
        self.expected = list(answer.prompt_ids) + list(answer.tokens)
        self.start, self.probs, self.to_target = len(answer.prompt_ids), answer.target_probs, to_target
        self.rng = np.random.default_rng([answer.config.seed or 0, STEER_STREAM])
        self.accepted = self.rejected = 0  # the drawn acceptances (for the tests)

    def __call__(self, sequence: list[int], drafted: list[int], q: np.ndarray) -> int:
        mapped = drafted if self.to_target is None else [int(self.to_target[d]) for d in drafted]
        position = len(sequence) + len(drafted)
        if position >= len(self.expected) or self.expected[:position] != list(sequence) + mapped:
            return sample(q, self.rng)  # past a rejection (or the answer's end): the draft's own draw
        y = self.expected[position]
        spells = self._spells(y, len(q))
        q_y = float(q[spells].sum())
        if self.rng.random() * self.probs[position - self.start] < q_y:  # probability min(1, q(y) / p(y))
            self.accepted += 1
            return sample(np.where(spells, q, 0.0), self.rng)
        self.rejected += 1
        return sample(np.where(spells, 0.0, q), self.rng)

    def _spells(self, y: int, width: int) -> np.ndarray:
        """Which of the draft's ids are the target's token y."""
        out = np.zeros(width, dtype=bool)
        if self.to_target is None:
            if y < width:
                out[y] = True
        else:
            ids = self.to_target[:width]
            out[:len(ids)] = ids == y
        return out
