"""Verification of a proposal against the target's logits: the step that makes speculation lossless.

Greedy: accept while the drafted token is the target's argmax; the next token is the target's argmax.
Sampling (Leviathan et al. / Chen et al.): accept token x with probability min(1, p(x) / q(x)); on the first
rejection draw from norm(max(0, p - q)); when all are accepted draw a bonus token from the last p.
A token without a distribution (q None: a deterministic drafter, or a token re-tokenized from draft text) is
treated as q = one-hot: accept with probability p(x), else draw from p with x removed. That is lossless for
any proposal, however it was made: the output token has distribution p either way.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np

from .drafters import Proposal
from .grammar import GrammarState
from .sampling import GenerationConfig, distribution, penalize, sample


class Verdict(NamedTuple):
    """What a verification decided: the round writes proposal.tokens[:accepted] + [next_token]."""
    accepted: int       # how many of the proposal's tokens the target keeps, from the first
    next_token: int     # the target's own token after them: a correction, or a bonus token when all were kept
    rows: np.ndarray    # the target's logits after the penalties (penalize): row i decided output token i


def verify(rows: np.ndarray, proposal: Proposal, config: GenerationConfig, rng: np.random.Generator,
           context: list[int], grammar: Optional[GrammarState] = None, prompt_length: int = 0) -> Verdict:
    """rows: target logits, len(proposal.tokens) + 1 of them, following context, whose first prompt_length tokens
    are the prompt (the rest the output so far, which the presence and frequency penalties count). With a grammar,
    each row is masked to what the grammar allows at its position (after the penalties): the target's distribution
    becomes the constrained one, for the drafted tokens and the next one alike."""
    tokens = proposal.tokens
    rows = penalize(rows, config, context, tokens, prompt_length)
    if grammar is not None:
        rows = grammar.mask(rows, tokens)
    if config.greedy:
        choice = rows.argmax(axis=-1)
        n = 0
        while n < len(tokens) and tokens[n] == choice[n]:
            n += 1
        return Verdict(n, int(choice[n]), rows)
    p = distribution(rows, config)
    for i, x in enumerate(tokens):
        q = None if proposal.q is None else proposal.q[i]
        if q is not None and len(q) != p.shape[-1]:
            raise ValueError(f"a draft distribution over {len(q)} tokens for a target of {p.shape[-1]}: the "
                             f"drafter must give q over the target's logits")
        q_x = 1.0 if q is None else q[x]
        if rng.random() * q_x < p[i, x]:  # accept with probability min(1, p/q)
            continue
        if q is None:
            residual = p[i].copy()
            residual[x] = 0.0
        else:
            residual = np.maximum(p[i] - q, 0.0)
        if residual.sum() <= 0.0:  # p == q up to rounding: any draw from p is exact
            residual = p[i]
        return Verdict(i, sample(residual, rng), rows)
    return Verdict(len(tokens), sample(p[len(tokens)], rng), rows)
