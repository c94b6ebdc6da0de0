"""SLRS, string-level rejection sampling: rejection sampling of the first target token against the exact
probability that the draft's text starts with it.

The proposal for the round's first position is T = the longest target token that is a prefix of the text S
the draft would write. Its distribution r(t) is computed exactly by enumerating the draft's token tree
(every draft token with positive probability, expanded while the text so far is still a proper prefix of
some target token, so that T is not yet decided); then T is drawn from r together with a draft path that
spells it, and the target accepts it with min(1, p/r), else draws from norm(max(p - r, 0)): lossless by
the standard rejection-sampling argument. The rest of the drafted text becomes further target tokens that
are verified like SLEM (kept only if the target picks them itself, also lossless).

Where it is practical: the tree has at most (positive-probability draft tokens)^(depth) leaves, so it
needs a sampling config that bounds the support (top_k, or a small top_p) and short target tokens relative
to the draft's. Each expanded node costs one draft forward pass. Beyond `max_nodes` passes or
`max_branch` tokens at a node, the round falls back to SLEM (decided from the tree alone, before any
random draw, so the fallback cannot bias the result). Greedy decoding is SLEM: the two coincide there.
"""
from __future__ import annotations

from bisect import bisect_right
from functools import cached_property
from typing import Optional

import numpy as np

from .drafters import Proposal
from .heterogeneous import SLEMDrafter
from .sampling import sample

Leaf = tuple[tuple[int, ...], int, float]  # (draft path, target token, probability)


class SLRSDrafter(SLEMDrafter):
    max_nodes = 24    # draft forward passes per round for the tree
    max_branch = 32   # positive-probability draft tokens at one node

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.rounds_exact = 0     # rounds verified against the exact r
        self.rounds_fallback = 0  # rounds that fell back to SLEM
        eos = self.vocab_map.draft_to_target[self.draft_eos] if self.draft_eos is not None else -1
        self.eos_target = int(eos) if eos >= 0 else None

    def stats(self) -> dict:
        return {"slrs_rounds": {"exact": self.rounds_exact, "slem_fallback": self.rounds_fallback}, **super().stats()}

    def propose(self, sequence: list[int], k: int) -> Proposal:
        if self.config.greedy:
            return super().propose(sequence, k)
        row, pending = self.sync(sequence)
        if pending or row is None:
            return Proposal()
        if self.drafting_freely:  # its first token's r would be cut where the grammar refuses it: a SLEM round
            self.rounds_fallback += 1
            return self.slem_round(sequence, row, k)
        base = self.ctx.view()  # what the draft's cache holds (its window of the text)
        leaves = self._leaves(base, row)
        if not leaves:
            self.rounds_fallback += 1
            self.ctx.session.truncate(len(base))
            return self.slem_round(sequence, row, k)
        self.rounds_exact += 1
        probs = np.array([p for _, _, p in leaves])
        probs /= probs.sum()  # outcomes without a target token are conditioned away
        r = np.zeros(len(self.vocab_map.target))  # one entry per target logit
        np.add.at(r, [t for _, t, _ in leaves], probs)
        path, first, _ = leaves[sample(probs, self.rng)]
        drafted = list(path)
        if drafted[-1] != self.draft_eos and len(drafted) < k:
            more_row = self.ctx.session.sync(base + drafted)[-1]
            drafted += self.draft(more_row, k - len(drafted), after=list(drafted))
        self.last_draft = drafted
        first_bytes = self.target_retok.pieces.piece(first) or b""
        rest = self.to_target(sequence + [first], drafted, skip=first_bytes) if first_bytes else []
        return Proposal([first] + rest, [r] + [None] * len(rest))

    # the tree -------------------------------------------------------------------------------------------
    def _leaves(self, base: list[int], root_row: np.ndarray) -> Optional[list[Leaf]]:
        """Every way the draft can decide T, with its probability; None when over budget."""
        leaves: list[Leaf] = []
        stack = [((), b"", 1.0, root_row)]
        nodes = 0
        while stack:
            path, text, prob, row = stack.pop()
            q = self.draft_distribution(row, path)
            if q is None:  # the grammar allows none of the draft's tokens here: no outcome goes on from this node
                continue
            support = np.flatnonzero(q)
            if len(support) > self.max_branch:
                return None
            for d in support.tolist():
                p = prob * float(q[d])
                if d == self.draft_eos:  # the text ends here
                    first = self.eos_target if not text else self.target_retok.longest_prefix(text)
                    if first is not None:
                        leaves.append((path + (d,), first, p))
                    continue
                longer = text + (self.ctx.retok.pieces.piece(d) or b"")
                if self._undecided(longer):
                    nodes += 1
                    if nodes > self.max_nodes:
                        return None
                    child = self.ctx.session.sync(base + list(path) + [d])[-1]
                    stack.append((path + (d,), longer, p, child))
                else:
                    first = self.target_retok.longest_prefix(longer)
                    if first is not None:
                        leaves.append((path + (d,), first, p))
        return leaves

    @cached_property
    def _sorted_pieces(self) -> list[bytes]:
        return sorted(self.target_retok.index)

    def _undecided(self, text: bytes) -> bool:
        """Is text a proper prefix of some target token (so a longer token may still match)?"""
        pieces = self._sorted_pieces
        i = bisect_right(pieces, text)
        return i < len(pieces) and pieces[i].startswith(text)
