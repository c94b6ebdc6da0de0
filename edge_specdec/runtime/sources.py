"""Which source proposes a round: a free copy of text the target has seen (suffix.py), or the draft model.

A copy costs the target one block and no draft time; the draft model costs its own steps on the same cores. Each
round of a draft model's algorithm therefore asks the free source first, and `FreeFirst` takes its copy where the
copy is expected to keep at least MIN_EXPECTED of its tokens; the model drafts otherwise, and also after a short,
sure copy, on from its end (chained), within the round's k. In a round where the model does not draft (k 0: the
drafting guard paused it), a copy takes no round from it, so a one-token copy (one that ends the answer) goes when
it is expected to keep half of itself. Until the target has kept a copied token in the request,
only copies on a match of OPENING_MATCH tokens or more go out: where nothing repeats, the copies of short matches
are mostly chance, and each took a round from the draft model. What each source earns is measured as the run goes (a
decayed tokens per second of the rounds it served, against the other rounds'): a free source that keeps losing is
paused (but for copies of long matches), for longer each time it loses again, and tried again after (llama.cpp
switches its n-gram drafts off per sequence after empty drafts; this follows the same idea with rates). A seeded
sampled run must repeat, so it never reads the clock: its free source is paused by its acceptance alone, which
depends only on the request; so is any run's before the model has served a measured round.
"""
from __future__ import annotations

from typing import Optional

from .drafters import Drafter, Proposal
from .suffix import FREE_TOKENS, RESUMED_MATCH, SuffixDrafter, as_proposal

MIN_EXPECTED = 1.0   # a copy goes to the target when it is expected to keep at least this many of its tokens
SURE = 0.9           # a copy whose every step at least this many of its occurrences agree on may be chained
FIRST_PAUSE, LONGEST_PAUSE = 16, 256  # rounds a losing free source sits out (doubling while it keeps losing)
TRIAL_ROUNDS = 4     # free rounds measured before the free source is judged
STRONG_MATCH = 8     # a copy matching at least this many tokens is taken even while the free source is paused
# a request's copies go out only on a match at least this long until the target has kept a copied token: in text
# that does not repeat, a short match is mostly chance and its copy takes the round from the draft model, while text
# that repeats soon shows it in a long match
OPENING_MATCH = 5
DECAY = 0.8


class FreeFirst(Drafter):
    """A draft model's drafter whose rounds first try a free copy (see the module's docstring).

    model: the draft model's drafter; free: the request's SuffixDrafter; clock: weigh the sources by their measured
    tokens per second (False, a seeded sampled run: by the copies' acceptance alone)."""

    free_tokens = FREE_TOKENS

    def __init__(self, model: Drafter, free: SuffixDrafter, clock: bool = True):
        self.model, self.free, self.clock = model, free, clock
        self.rates = {True: [0.0, 0.0], False: [0.0, 0.0]}  # served by a copy? -> decayed [tokens, seconds]
        self.kept = [0.0, 0.0]  # decayed [copied tokens kept, copied tokens proposed]
        self.trial, self.paused, self.pause = 0, 0, FIRST_PAUSE
        self.opened = False  # the target kept a copied token in this request (see OPENING_MATCH)
        self.free_rounds = self.chained_rounds = self.paused_rounds = 0
        self.grammar = None

    def constrain(self, grammar) -> None:
        self.grammar = grammar
        self.model.constrain(grammar)

    def accept(self, n_accepted: int, next_token: int) -> None:
        self.model.accept(n_accepted, next_token)

    def stats(self) -> dict:
        return {"free_rounds": self.free_rounds, "chained_rounds": self.chained_rounds,
                "free_paused_rounds": self.paused_rounds, **self.free.stats(), **self.model.stats()}

    def propose(self, sequence: list[int], k: int) -> Proposal:
        found = self.free.copy(sequence)
        if self.paused:  # a paused free source still serves a copy that matches a long run of the sequence
            self.paused -= 1
            self.paused_rounds += 1
            if found is not None and found.match < STRONG_MATCH:
                found = None
        if found is not None and not self.opened and RESUMED_MATCH < found.match < OPENING_MATCH:
            found = None  # (a resumed copy resumes text first copied on a long match, see suffix.RESUME_FROM_MATCH)
        if found is not None and self.grammar is not None:  # a copy the grammar refuses is cut to what it allows
            found.tokens = found.tokens[:self.grammar.valid_prefix(sequence, found.tokens)]
        needed = MIN_EXPECTED if k > 0 or found is None else min(MIN_EXPECTED, len(found.tokens) / 2)
        if found is None or found.expected < needed:
            return self.model.propose(sequence, k) if k > 0 else Proposal()
        copy = as_proposal(found)
        if (0 < len(copy.tokens) < k and found.expected >= SURE * len(copy.tokens)
                and not self.free.ends_answer(copy.tokens)):  # chained: the model goes on (unless the copy ends it)
            self.chained_rounds += 1
            rest = self.model.propose(sequence + copy.tokens, k - len(copy.tokens))
            q = None if rest.q is None else [None] * len(copy.tokens) + list(rest.q)
            return Proposal(copy.tokens + rest.tokens, q, copied=copy.copied, source=copy.source, origin=copy.origin)
        self.free_rounds += 1
        return copy

    def verified(self, proposal: Proposal, accepted: int, seconds: Optional[float]) -> None:
        self.free.verified(proposal, accepted, seconds)
        self.opened = self.opened or (proposal.copied > 0 and accepted > 0)
        if seconds is None:  # the run's first round: its clock prices the prompt, not the source
            return
        copied = proposal.copied > 0
        rate = self.rates[copied]
        rate[0], rate[1] = DECAY * rate[0] + accepted + 1, DECAY * rate[1] + seconds
        if not copied:
            return
        self.kept = [DECAY * self.kept[0] + min(accepted, proposal.copied), DECAY * self.kept[1] + proposal.copied]
        self.trial += 1
        if self.trial >= TRIAL_ROUNDS:
            self.trial = 0
            if self._losing():
                self.paused, self.pause = self.pause, min(LONGEST_PAUSE, 2 * self.pause)
            else:
                self.pause = FIRST_PAUSE

    def _losing(self) -> bool:
        """Do the copies lose to the other rounds? By tokens per second, or (no clock) by the share kept."""
        (ft, fs), (ot, os_) = self.rates[True], self.rates[False]
        if not self.clock or not os_:  # (no model round measured yet: the copies' own record only)
            return self.kept[0] < 0.25 * self.kept[1]
        return bool(fs and ft / fs < 0.9 * ot / os_)


def free_first(model: Optional[Drafter], free: SuffixDrafter, clock: bool) -> Drafter:
    """The drafter of a round that tries a free copy first: FreeFirst over a draft model, the free source alone
    without one."""
    return free if model is None else FreeFirst(model, free, clock)
