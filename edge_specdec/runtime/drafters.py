"""Drafters propose the next tokens (in the target's vocabulary); the verifier decides what to keep.

A drafter has two steps: propose(sequence, k) -> Proposal, and accept(n_accepted, next_token), the outcome of a
verification, which the decode loop calls right after each one. The sequence a proposal is made for already
holds the outcome of the previous round, so a drafter with a cache re-syncs to it there. A proposal carries, for
each drafted token, the draft distribution q it was drawn from (None when the drafter is deterministic: then q is
the one-hot of the token). The decode loop verifies at most k of a proposal's tokens.
"""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

from .draft_window import DraftWindow
from .sampling import GenerationConfig, distribution, penalize, sample
from .session import ModelSession


@dataclass
class Proposal:
    """A round's proposed tokens, front to back: those a grammar forced, those copied from text the target has
    seen (free drafts, suffix.py), then those a draft model drafted."""
    tokens: list[int] = field(default_factory=list)
    # the distribution each token was drawn from (over the target's vocabulary); None, or a None entry, where
    # there is none (a deterministic draft): verification then treats it as one-hot
    q: Optional[list[Optional[np.ndarray]]] = None
    forced: int = 0  # how many tokens at its front a grammar forced (proposed without the drafter)
    copied: int = 0  # how many tokens after those were copied (free drafts, no draft model)
    source: str = ""  # where the copied tokens came from: "suffix" (the request) or "pool" (earlier requests)
    # where the copy sits: (its source's token list, the position there before its first copied token, the length
    # of the sequence it was proposed for)
    origin: Optional[tuple[list[int], int, int]] = None

    def after_first(self) -> "Proposal":
        """The proposal without its first token (what is left once that token is known to be right)."""
        forced, copied = (self.forced - 1, self.copied) if self.forced else (0, max(0, self.copied - 1))
        origin = self.origin
        if origin is not None and not self.forced and self.copied:
            origin = (origin[0], origin[1] + 1, origin[2] + 1)
        return Proposal(self.tokens[1:], None if self.q is None else self.q[1:], forced, copied, self.source,
                        origin)

    def head(self, k: int) -> "Proposal":
        forced = min(self.forced, k)
        return Proposal(self.tokens[:k], None if self.q is None else self.q[:k], forced,
                        min(self.copied, k - forced), self.source, self.origin)

    @classmethod
    def grammar_forced(cls, tokens: list[int], then: Optional["Proposal"] = None) -> "Proposal":
        """A grammar's forced tokens (deterministic: q one-hot), then a drafter's proposal after them."""
        then = then or Proposal()
        q = None if then.q is None else [None] * len(tokens) + list(then.q)
        return cls(list(tokens) + then.tokens, q, len(tokens), then.copied, then.source, then.origin)


class Drafter:
    """What every drafter has: propose, accept, verified, stats; the defaults of the last three do nothing.

    Calls come in this order: propose for a round's sequence, then accept with that round's outcome once the target
    has verified it; accept comes after every verification, also of a round that drafted nothing (0 accepted). In
    concurrent mode the loop also asks for the next round's proposal (on a guessed sequence) while the target
    verifies, so accept for a round comes after a later propose: a drafter must not take accept as the outcome of
    its most recent proposal."""

    # the most tokens a proposal may copy without a draft model (free drafts), whatever the round's k; 0: none
    free_tokens = 0
    # steer(sequence, drafted, q) -> token: the token a sampling draft model draws from q after sequence + drafted
    # (its own tokens so far this round), instead of a draw with the run's random numbers. Only `edge-specdec
    # pair`'s simulation sets it, to draft along a stored answer of the target (pairing/sampled.py); None in runs
    steer: Optional[Callable[[list[int], list[int], np.ndarray], int]] = None

    def propose(self, sequence: list[int], k: int) -> Proposal:
        """Up to k tokens to follow the sequence (k may be 0 in a round where the draft model must not run: a
        drafter with free_tokens may still copy up to that many)."""
        raise NotImplementedError

    def verified(self, proposal: Proposal, accepted: int, seconds: Optional[float]) -> None:
        """A round's proposal (the one verified, which in concurrent mode need not be the latest proposed), how
        many of the drafter's own tokens (after the grammar's forced ones) the target kept, and the round's
        seconds, draft and target (None for a run's first round, whose clock is mostly the prompt's)."""

    def accept(self, n_accepted: int, next_token: int) -> None:
        """A round was verified: the target kept the first n_accepted tokens of its proposal, then wrote
        next_token (a correction, or a bonus token when it kept them all)."""

    def stats(self) -> dict:
        """What this drafter counted in its run, for Result.extra (empty when nothing of its own)."""
        return {}

    def constrain(self, grammar) -> None:
        """The run's output follows this grammar (a grammar.GrammarState): a drafter that can, proposes only what it
        allows. The default proposes freely: the decode loop cuts every proposal to the part the grammar allows."""


class DraftModelDrafter(Drafter):
    """A same-vocabulary draft model: k tokens one at a time, from the same distribution transform as the target.

    confidence: stop drafting early when the draft's top probability falls below it (0 = never; see `unsure`).
    prompt_length: the prompt's tokens at the start of every sequence (the penalties count the output after them).
    window: the draft reads only this window of a long sequence (draft_window.py; None: the whole sequence). The
    penalties and the grammar still see the whole sequence: they shape the draft's logits, and q is what it drew
    from.
    """

    def __init__(self, session: ModelSession, config: GenerationConfig, rng: np.random.Generator,
                 confidence: float = 0.0, width: Optional[int] = None, prompt_length: int = 0,
                 window: Optional[DraftWindow] = None):
        self.session, self.config, self.rng, self.confidence = session, config, rng, confidence
        self.prompt_length, self.window = prompt_length, window
        self.width = width  # the target's number of logits, which may differ from the draft's (padding)
        self.grammar = None

    def constrain(self, grammar) -> None:
        self.grammar = grammar

    def propose(self, sequence: list[int], k: int) -> Proposal:
        with self.grammar.walk(sequence) if self.grammar else nullcontext() as walk:
            if self.grammar and walk is None:  # the sequence already left the grammar: nothing can be accepted
                return Proposal()

            def shape(row: np.ndarray, drafted: list[int]) -> Optional[np.ndarray]:  # width, penalties, grammar
                row = to_width(row, self.width)
                if self.config.adjusts_logits:
                    row = penalize(row[None], self.config, sequence + drafted, [], self.prompt_length)[0]
                if walk is not None:
                    if drafted:
                        walk.step(drafted[-1])
                    masked = np.where(self.grammar.allowed(), row, -np.inf)
                    # the draft knows none of the allowed ids (its output layer was cut, see draft_vocab): it stops,
                    # since a token drawn from q that the loop then cuts would bias rejection sampling
                    row = masked if np.isfinite(masked).any() else None
                return row

            if self.window is None:
                row = self.session.sync(sequence)[-1]
            else:
                row = self.session.sync(self.window.view(sequence))[-1]
                k = self.window.most(k, self.session.length)
            steps = draft_steps(self.session, row, k, self.config, self.rng, self.confidence, shape,
                                pick=steered(self.steer, sequence))
        return Proposal([t for t, _ in steps], None if self.config.greedy else [q for _, q in steps])

    def stats(self) -> dict:
        return self.window.stats() if self.window is not None else {}


def steered(steer: Optional[Callable[[list[int], list[int], np.ndarray], int]],
            sequence: list[int]) -> Optional[Callable[[np.ndarray, list[int]], int]]:
    """A drafter's `steer` (see Drafter.steer) as draft_steps' pick for a proposal after sequence; None without."""
    return None if steer is None else (lambda q, drafted: steer(sequence, drafted, q))


def draft_steps(session: ModelSession, row: np.ndarray, k: int, config: GenerationConfig, rng: np.random.Generator,
                confidence: float, shape=None, ends=None, pick: Optional[Callable[[np.ndarray, list[int]], int]] = None
                ) -> list[tuple[int, Optional[np.ndarray]]]:
    """The drafting step every draft model shares: up to k tokens from `row` (the draft's logits at its cache's
    end), one at a time, each fed back to the session. A token is the top one (greedy) or a draw from q, the
    config's distribution; drafting stops after k tokens, after a token `ends(token)` says ends the draft, or when
    the draft is unsure of it (see `unsure`). shape(row, drafted) restricts or adjusts the logits before each
    pick (the drafted tokens so far given); it returns None where nothing may be drafted (a grammar allows none of
    the draft's tokens), which ends the draft. pick(q, drafted) draws a sampled token instead of `sample(q, rng)`
    (Drafter.steer). Returns (token, q) pairs, q None when greedy."""
    steps: list[tuple[int, Optional[np.ndarray]]] = []
    for i in range(k):
        if shape is not None:
            row = shape(row, [t for t, _ in steps])
            if row is None:
                break
        q = None if config.greedy else distribution(row, config)
        token = int(np.argmax(row)) if q is None else sample(q, rng) if pick is None else pick(q, [t for t, _ in steps])
        steps.append((token, q))
        if i + 1 == k or (ends is not None and ends(token)) or unsure(row, q, confidence):
            break
        row = session.feed([token])[-1]
    return steps


def to_width(row: np.ndarray, width: Optional[int]) -> np.ndarray:
    """A same-vocabulary draft's logits over the target's `width` logits: the ids only the draft has are dropped
    (so never drafted), the ids only the target has get -inf (no draft probability). Vocabularies padded to
    different sizes (Qwen2.5-7B: 152064 logits, Qwen2.5-0.5B: 151936) share every real token."""
    if width is None or len(row) == width:
        return row
    if len(row) > width:
        return row[:width]
    return np.concatenate([row, np.full(width - len(row), -np.inf, dtype=row.dtype)])


def unsure(row: np.ndarray, q: Optional[np.ndarray], confidence: float) -> bool:
    """Should a drafter stop after this token? Yes when the draft's top probability is under `confidence`: q's
    when the token was sampled from q, else the softmax of the logits row's (greedy). 0 never stops."""
    if not confidence:
        return False
    if q is None:
        x = row.astype(np.float64) - row.max()
        return float(1.0 / np.exp(x).sum()) < confidence
    return float(q.max()) < confidence


class PromptLookupDrafter(Drafter):
    """No draft model: continue the longest recent n-gram match found earlier in the prompt or the output."""

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def propose(self, sequence: list[int], k: int) -> Proposal:
        return self.find(sequence, k)[1]

    def find(self, sequence: list[int], k: int) -> tuple[int, Proposal]:
        """The length of the n-gram matched (0: none) and the up to k tokens that followed it."""
        arr = np.asarray(sequence)
        for n in range(min(self.max_ngram, len(sequence) - 1), self.min_ngram - 1, -1):
            tail = arr[-n:]
            windows = np.lib.stride_tricks.sliding_window_view(arr[:-1], n)
            hits = np.flatnonzero((windows == tail).all(axis=1))
            for start in hits[::-1]:  # most recent match first
                follow = arr[start + n:start + n + k]
                if len(follow):
                    return n, Proposal([int(t) for t in follow], None)
        return 0, Proposal([], None)


DRAFT_POLICIES = ("fixed", "schedule", "cost")


# the most runs in a row that found drafting losing a guard's verdict counts: a run after them waits warmup << 5
# rounds (128 with the defaults, the longest countdown a verdict carries over after a short prompt) before it
# measures drafting again
MOST_LOST = 6


class DraftingGuard:
    """Keeps a run at least as fast as the target alone: it measures, as the run goes, the tokens per second of
    its drafting rounds and of rounds of the target alone, and runs the target alone while drafting loses.

    After `warmup` drafting rounds (the first round, which carries the prompt, is not counted, nor is a drafting
    round after rounds of the target alone, in which the draft catches up on them) the target alone runs
    `probe` rounds, so both rates are measured; the faster mode then runs, and the other is measured again every
    `recheck` rounds, less often while the same mode keeps winning (`probe` rounds for the target alone, twice as
    many for drafting, whose rounds vary more). Drafting's rate is that of its last stretch, all its rounds together
    (its acceptance swings from round to round); the target alone's decays, so a machine whose load changes is
    followed. The output never depends on it: the target alone is exact, and a greedy run writes the same tokens
    either way; runs that must reproduce a seeded sample do not use it (their rounds would depend on the clock).

    A stretch of drafting rounds is cut short, before its rounds are up, when this run's own rounds show it losing:
    after `early` rounds (the first round not counted) in which the target kept so few drafted tokens that drafting
    cannot beat the target alone (`sure_loss`), or after `warmup` rounds once its rate, all the stretch's rounds
    together, fell under the target alone's. The target alone is then measured again (`probe` rounds) and the faster
    mode runs. A sure loss also sets aside the drafting and alone rates measured before it (an earlier prompt's, a
    prior's): the two modes are compared on this request's rounds. So a short answer whose draft keeps almost
    nothing (a translation the draft does not know) pays a few rounds for drafting, not the whole answer, and the
    next request (another prompt) starts from what the guard knew before it (`learned`). Within that request,
    drafting is then measured again after `2 * recheck` rounds of the target alone, not `recheck`: each check costs
    the draft's catch-up on the tokens written meanwhile and a few losing rounds, on text already shown to be one
    the draft does not know.

    prior: what an earlier run's guard learned (`learned()`) for the same pair and kind of request. The run then
    starts in the mode that won there, with its rates, and skips the warm-up; the other mode is measured again when
    the countdown the earlier run left runs out (at most `4 * recheck` rounds; `8 * recheck` for a verdict for the
    target alone after a long prompt, see below; sooner if it lost only lately, or as soon as drafting loses on this
    request, see above), so a prompt on which it wins is followed, and a verdict is checked again even when every
    request is shorter than its interval. Without a prior, a short run on which drafting loses would spend a tenth
    of its rounds finding that out, every time.

    A verdict for the target alone counts the runs in a row that found drafting losing (`lost`): a run after one
    such run measures drafting again within `warmup` rounds, and each further run that finds it losing doubles that
    (up to the countdown above). Drafting that loses on one prompt (an answer whose prose the draft guesses badly)
    then costs the next prompt, on which it may win, a few rounds of the target alone, not its whole answer; a pair
    or machine on which drafting loses on every prompt reaches the long countdown within a few runs. A sure loss
    counts as well: the first after runs that did not lose is the prompt's (the next run starts from what the guard
    knew before it, as above), and a second in a row leaves a verdict for the target alone.

    quick_recheck False (a run after a long prompt): a verdict for the target alone keeps its whole countdown, as
    many runs lost as there were, as before the count existed, and its countdown may run to the whole interval (up
    to `8 * recheck` rounds, not `4 * recheck`). There the first drafting round prefills the draft's window of the
    prompt, a cost the early checks were not measured against, and a run that checks drafting pays it."""

    def __init__(self, warmup: int = 4, probe: int = 2, recheck: int = 32, decay: float = 0.8,
                 prior: Optional[dict] = None, early: int = 3, quick_recheck: bool = True):
        self.warmup, self.probe, self.recheck, self.decay, self.early = warmup, probe, recheck, decay, early
        # this stretch of drafting rounds (since drafting last started, probes apart): [rounds, drafted tokens the
        # target kept, draft seconds, target seconds], for the sure-loss test
        self.stretch = [0, 0, 0.0, 0.0]
        self.rates = {True: [0.0, 0.0], False: [0.0, 0.0]}  # drafting? -> decayed [tokens, seconds]
        self.mode, self.left = True, warmup + 1  # the mode that runs, and its rounds until the next switch
        self.before, self.interval = True, recheck  # the mode before the running probe; rounds between probes
        self.probing = False
        self.alone_rounds = 0  # rounds this guard ran the target alone
        # a sure loss speaks of this prompt (what the target keeps of its drafts), not of the machine: what the guard
        # had learned before the first one is what the next run starts from (see learned)
        self.sure_lost, self.before_loss = False, None
        self.lost = 0  # runs in a row, before this one, that found drafting losing (see the class docstring)
        self.measured_drafting = False  # this run drafted a round after its first
        self.drafted_last = True  # whether the last round drafted (the run's first round is not counted either way)
        if prior:
            self.rates = {True: list(prior["drafting"]), False: list(prior["alone"])}
            self.mode = self.before = bool(prior["mode"])
            self.interval = int(prior["interval"])
            # the countdown to the next check goes on from where the last run left it (its "left"): runs shorter than
            # the interval would otherwise each start it again, and never check the other mode
            # (for the target alone after a long prompt, up to the whole interval: a check of drafting there pays the
            # draft's prefill of its window)
            longest = (4 if quick_recheck or self.mode else 8) * recheck
            countdown = min(int(prior.get("left", self.interval)), self.interval, longest)
            self.lost = int(prior.get("lost", 0))  # (a verdict for drafting after one prompt's sure loss: 1)
            if not self.mode:  # drafting is measured again the sooner, the fewer runs in a row it lost
                self.lost = max(1, self.lost)
                if quick_recheck:
                    countdown = min(countdown, warmup << (self.lost - 1))
            self.left = 1 + countdown  # (+ the first round)

    def learned(self) -> Optional[dict]:
        """What this guard found, JSON-ready, as the next run's `prior`; None before both modes were measured. After
        a sure loss that follows runs that did not lose, what it had found before it (and that one run lost): the
        next request, another prompt, starts where the runs before this prompt left it. A second run in a row that
        loses, surely or by its rate, leaves its own verdict: drafting then loses on more than one prompt."""
        mode = self.before if self.probing else self.mode
        if self.sure_lost and (mode or (self.lost == 0 and self.before_loss is not None)):
            return self.before_loss if mode else {**self.before_loss, "lost": 1}
        if not self.rates[True][1] or not self.rates[False][1]:
            return None
        # a run that ends on the target alone adds itself to the runs that found drafting losing, if it measured
        # drafting (a run too short to check it carries the count over as it found it)
        lost = 0 if mode else min(MOST_LOST, self.lost + 1) if self.measured_drafting else max(1, self.lost)
        return {"mode": mode, "interval": self.interval,
                "left": 0 if self.probing else max(0, self.left),  # (a probe cut short: the next run checks at once)
                **({"lost": lost} if lost else {}),
                "drafting": [round(v, 6) for v in self.rates[True]], "alone": [round(v, 6) for v in self.rates[False]]}

    def drafting(self) -> bool:
        """Whether the round that starts now drafts."""
        return self.mode

    def update(self, drafted: bool, tokens: int, seconds: float, first: bool = False,
               draft_seconds: Optional[float] = None) -> None:
        """One round: whether it drafted, the tokens it added and its seconds (draft and target), of which
        draft_seconds the draft's (None: not known apart, so no sure-loss test)."""
        # the first drafting round after rounds of the target alone feeds the draft what it missed (the prompt, the
        # tokens written meanwhile): a prefill drafting pays once on coming back, not a round's price, so it is not
        # counted, as the run's first round is not
        first, self.drafted_last = first or (drafted and not self.drafted_last), drafted
        self.alone_rounds += not drafted
        self.measured_drafting = self.measured_drafting or (drafted and not first)
        stretch = drafted and self.mode and not self.probing and not first
        if not first:
            rate = self.rates[drafted]
            rate[0], rate[1] = self.decay * rate[0] + tokens, self.decay * rate[1] + seconds
        if stretch and draft_seconds is not None:
            s = self.stretch
            s[0], s[1], s[2], s[3] = s[0] + 1, s[1] + tokens - 1, s[2] + draft_seconds, s[3] + seconds - draft_seconds
        self.left -= 1
        if stretch and self.left > 0:
            if self.sure_loss():
                if not self.sure_lost:
                    self.before_loss, self.sure_lost = self.learned(), True
                # this request's drafting rounds are the measurement: earlier rates (another prompt's) are set aside
                self.rates = {True: self._stretch_rate(), False: [0.0, 0.0]}
                self.left = 0
            elif self.stretch[0] >= self.warmup and self.rates[False][1] and not self._stretch_faster():
                self.left = 0  # this stretch's rate fell under the target alone's: measure the target alone now
        if self.left > 0:
            return
        if stretch and self.stretch[0] >= self.warmup:  # a stretch ends: its rounds together are drafting's rate
            self.rates[True] = self._stretch_rate()
        self.stretch = [0, 0, 0.0, 0.0]
        if self.probing:  # a probe ends: keep whichever mode is faster
            faster = self._faster()
            # a mode that keeps winning is checked less and less often (up to 8x the interval): its probes of the
            # losing mode are what the guard costs
            if faster == self.before:
                self.interval = min(8 * self.recheck, 2 * self.interval)
            else:  # (after a sure loss this request's text is one the draft does not know: checked half as often)
                self.interval = 2 * self.recheck if self.sure_lost and not faster else self.recheck
            self.probing, self.mode = False, faster
            self.left = self.interval
        else:  # measure the other mode again
            self.before = self.mode
            self.probing, self.mode = True, not self.mode
            # (a probe of drafting follows rounds of the target alone: its first round, the catch-up, is not counted)
            self.left = 2 * self.probe + 1 if self.mode else self.probe

    def sure_loss(self) -> bool:
        """Has this stretch of drafting, `early` rounds or more, lost to the target alone whatever a single step of
        the target costs? A round that kept `kept` drafted tokens wrote kept + 1 tokens in d + t seconds (draft,
        target); the target alone writes one token per step, a step costing at most the round's block t. So
        drafting lost for sure when (rounds + kept) / (d + t) < rounds / t, that is kept * t < rounds * d: the
        tokens kept did not pay for the draft's own seconds."""
        rounds, kept, draft_s, target_s = self.stretch
        return rounds >= self.early and kept * target_s < rounds * draft_s

    def _stretch_faster(self) -> bool:
        """Has this stretch of drafting, all its rounds together, written tokens at least as fast as the target
        alone? The whole stretch, not the decayed rate: a few rounds in a row that keep nothing are common inside an
        answer on which drafting wins, and a rate that forgets within a few rounds would stop drafting there."""
        (tokens, seconds), (at, as_) = self._stretch_rate(), self.rates[False]
        return tokens * as_ >= at * seconds

    def _stretch_rate(self) -> list[float]:
        """This stretch's [tokens, seconds]: a round wrote its kept tokens and the target's own one."""
        rounds, kept, draft_s, target_s = self.stretch
        return [rounds + kept, draft_s + target_s]

    def _faster(self) -> bool:
        (dt, ds), (at, as_) = self.rates[True], self.rates[False]
        if not ds or not as_:
            return True
        return dt / ds >= at / as_


class DraftLength:
    """How many tokens to draft next round.

    fixed: always k. schedule: +2 after a fully accepted round, -1 otherwise. cost: the k that maximizes
    expected tokens per second from what this run has measured so far: the acceptance rate a (per drafted
    token), the draft's seconds per token d and the target's seconds for a block of n tokens t(n). A round of k
    yields (1 - a^(k+1)) / (1 - a) tokens on average and costs k*d + t(k+1). t(n) is fitted as t1 + slope*(n-1)
    from the blocks seen (one early round of the target alone prices t1; blocks never seen are priced by the
    line). When no k beats the target alone, k is 0, with a probe of k = 1 every 8 rounds.
    """

    def __init__(self, k: int = 5, policy: str = "fixed", k_max: int = 12,
                 prices: Optional[tuple[float, float, float]] = None,
                 cap: Optional[Callable[[], Optional[int]]] = None, guard: Optional[DraftingGuard] = None):
        if policy not in DRAFT_POLICIES:
            raise ValueError(f"unknown draft policy {policy!r}: choose one of {', '.join(DRAFT_POLICIES)}")
        self.k = self.k0 = k
        self.cap = cap  # cap(): the most tokens the round that starts now may draft (None: no cap)
        self.guard = guard  # runs the target alone while drafting loses to it (see DraftingGuard)
        self.policy, self.k_max = policy, k_max
        # prices: (draft seconds per token, target seconds for one token, extra target seconds per token), used
        # instead of the rounds' clocks, so that the lengths follow the acceptance alone (a seeded sampled run
        # then draws the same numbers in the same rounds however fast the machine is)
        self.prices = prices
        self.accepted = self.rejections = 0.0      # decayed counts for the acceptance rate
        self.draft_s = self.drafted = 0.0          # decayed draft seconds and tokens
        self.blocks: dict[int, float] = {}         # block size -> smoothed target seconds
        self.rounds = self.idle = 0

    def round_k(self) -> int:
        """The draft length for the round that starts now: k, or less while cap() says so (0: the target alone)."""
        if self.guard is not None and not self.guard.drafting():
            return 0
        most = self._most()
        return self.k if most is None else min(self.k, most)

    def copies_allowed(self) -> bool:
        """Whether the round that starts now may propose free copies (no draft model runs for them): yes while the
        guard pauses the model, not while cap() leaves the round no token at all."""
        most = self._most()
        return most is None or most > 0

    def _most(self) -> Optional[int]:
        """The most tokens cap() lets the round that starts now propose (None: no cap)."""
        return self.cap() if self.cap is not None else None

    def update(self, accepted: int, proposed: int, draft_seconds: float = 0.0, target_seconds: float = 0.0,
               drafted: bool = True, first: bool = False) -> None:
        """One round's outcome: accepted of proposed tokens, its clocks, whether it drafted (k > 0) and whether
        it was the run's first (whose target pass carries the prompt)."""
        if self.guard is not None:
            self.guard.update(drafted, accepted + 1, draft_seconds + target_seconds, first, draft_seconds)
        if self.prices:
            draft_token, target_one, per_token = self.prices
            draft_seconds, target_seconds = draft_token * proposed, target_one + per_token * proposed
        if self.policy == "schedule" and proposed:
            self.k = min(self.k_max, self.k + 2) if accepted == proposed else max(1, self.k - 1)
        elif self.policy == "cost":
            self._learn(accepted, proposed, draft_seconds, target_seconds)
            self.k = self._best_k()

    def _learn(self, accepted: int, proposed: int, draft_seconds: float, target_seconds: float,
               decay: float = 0.9) -> None:
        if proposed and self.rounds:
            self.accepted = decay * self.accepted + accepted
            self.rejections = decay * self.rejections + (accepted < proposed)
            self.draft_s = decay * self.draft_s + draft_seconds
            self.drafted = decay * self.drafted + proposed
        self.rounds += 1
        if self.rounds == 1:
            return  # the first round's target pass includes the prompt: not a block price
        n = proposed + 1
        old = self.blocks.get(n)
        self.blocks[n] = target_seconds if old is None else 0.7 * old + 0.3 * target_seconds

    def _best_k(self) -> int:
        if 1 not in self.blocks:
            return 0  # one round of the target alone prices a single token
        if not self.drafted or len(self.blocks) < 2:
            return self.k0  # not enough measured yet: the configured k
        a = min(self.accepted / (self.accepted + self.rejections), 0.98)
        d = self.draft_s / self.drafted
        t1 = self.blocks[1]
        others = [(n, t) for n, t in self.blocks.items() if n > 1]
        slope = max(0.0, sum((t - t1) / (n - 1) for n, t in others) / len(others))

        def rate(k: int) -> float:  # expected tokens per second
            return (1 - a ** (k + 1)) / (1 - a) / (k * d + t1 + slope * k)

        best = max(range(1, self.k_max + 1), key=rate)
        if rate(best) * t1 > 1.0:  # drafting beats the target alone
            self.idle = 0
            return best
        self.idle += 1  # it does not: decode alone, and try one drafted token now and then
        return 1 if self.idle % 8 == 0 else 0
