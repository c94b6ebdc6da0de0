"""The decode loop: draft, verify in one target pass, keep the agreed prefix plus one target token."""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, NamedTuple, Optional

import numpy as np

from .drafters import Drafter, DraftLength, Proposal
from .grammar import GrammarState
from .sampling import GenerationConfig, TokenLogprob, token_logprobs
from .session import ContextOverflowError, ModelSession
from .text import Span, TextPiece, TextStream, unfinished_end
from .verify import Verdict, verify

# what every front end says of a run the drafting guard kept from drafting in every round (DraftingGuard)
TARGET_ALONE_THROUGHOUT = "the target alone throughout: drafting loses on this machine"


class TargetCall(NamedTuple):
    """One target pass of a run (Stats.target_calls): the tokens it computed for the sequence (1 for a round of the
    target alone, k + 1 to verify k proposed tokens; the first pass also the prompt's tokens the cache lacked), the
    tokens of its call on the device (more where the session widens a short block by feeding cached tokens again,
    see session.py; for a prompt fed in pieces, its last piece's), the tokens the cache held before it (the past),
    and its seconds as Stats.target_seconds counts them (the pass, the verification of its rows, the rollback)."""
    tokens: int
    block: int
    past: int
    seconds: float


@dataclass
class Stats:
    new_tokens: int = 0
    rounds: int = 0
    target_passes: int = 0
    draft_tokens_proposed: int = 0
    draft_tokens_accepted: int = 0
    seconds: float = 0.0
    draft_seconds: float = 0.0
    target_seconds: float = 0.0
    drafted_ahead_used: int = 0  # concurrent mode: rounds whose proposal was drafted during the previous pass
    first_token_seconds: float = 0.0  # time to the first generated token (prefill and the first round)
    prompt_tokens_reused: int = 0  # prompt tokens whose KV the target's cache kept from the previous run
    # prompt tokens this run fed the target: the others (fewer when it stopped during the prefill)
    prompt_tokens_prefilled: int = 0
    rounds_drafting_paused: int = 0  # rounds the target ran alone because drafting lost to it (DraftingGuard)
    grammar_tokens_proposed: int = 0  # tokens a grammar forced, proposed without the drafter (structured output)
    grammar_tokens_accepted: int = 0  # of those, the ones the target kept (not counted as draft tokens)
    # free drafts (suffix.py), not counted as draft tokens either: copied from the request's own text...
    suffix_tokens_proposed: int = 0
    suffix_tokens_accepted: int = 0
    pool_tokens_proposed: int = 0  # ... and from earlier requests' (the engine's draft pool)
    pool_tokens_accepted: int = 0
    # the seconds (draft and target) of the rounds after the first that verified a free copy: what copying cost,
    # the prompt's round left out
    copy_round_seconds: float = 0.0
    # one TargetCall per target pass, kept only when the run is asked to (generate's record_target_calls): a
    # measurement of the target's time by the size of its calls and the past they attend over; None otherwise
    target_calls: Optional[list[TargetCall]] = None

    def count_round(self, proposed: int, accepted: int, draft_seconds: float, target_seconds: float,
                    drafted_ahead: bool = False, start: Optional[float] = None) -> None:
        """One round: its proposal and what was kept, its clocks, whether the next round's proposal was drafted
        during it (concurrent mode), and the run's start (the first round stops the first-token clock)."""
        self.drafted_ahead_used += drafted_ahead
        if start is not None and not self.first_token_seconds:
            self.first_token_seconds = time.perf_counter() - start
        self.rounds += 1
        self.target_passes += 1
        self.draft_tokens_proposed += proposed
        self.draft_tokens_accepted += accepted
        self.draft_seconds += draft_seconds
        self.target_seconds += target_seconds

    def count_call(self, tokens: int, block: int, past: int, seconds: float) -> None:
        """A target pass's size, block, past and seconds (a run that records them: target_calls is a list)."""
        self.target_calls.append(TargetCall(tokens, block, past, seconds))

    def count_copy(self, source: str, proposed: int, accepted: int) -> None:
        """A round's free copy: from the request ("suffix") or from the draft pool ("pool")."""
        if source == "pool":
            self.pool_tokens_proposed += proposed
            self.pool_tokens_accepted += accepted
        else:
            self.suffix_tokens_proposed += proposed
            self.suffix_tokens_accepted += accepted

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds else 0.0

    @property
    def free_tokens_proposed(self) -> int:
        """Tokens copied without a draft model (free drafts, from the request and from the draft pool)."""
        return self.suffix_tokens_proposed + self.pool_tokens_proposed

    @property
    def acceptance(self) -> float:
        return self.draft_tokens_accepted / self.draft_tokens_proposed if self.draft_tokens_proposed else 0.0

    @property
    def tokens_per_target_pass(self) -> float:
        return self.new_tokens / self.target_passes if self.target_passes else 0.0

    @property
    def drafting_note(self) -> str:
        """Why the run drafted less than it could, in the words the CLI, the server and its page share: the
        target alone throughout where the drafting guard paused every drafting round, the rounds it paused where
        it paused some, else empty."""
        if not self.rounds_drafting_paused:
            return ""
        if not self.draft_tokens_proposed and not self.free_tokens_proposed:
            return TARGET_ALONE_THROUGHOUT
        rounds = f"{self.rounds_drafting_paused} round{'' if self.rounds_drafting_paused == 1 else 's'}"
        return f"drafting paused for {rounds} (slower than the target alone on this machine, measured as it ran)"

    @property
    def time_per_output_token(self) -> float:
        """Seconds per token once the first is out (TPOT): what decoding costs, the prompt's prefill left out."""
        return (self.seconds - self.first_token_seconds) / max(1, self.new_tokens - 1)

    def as_dict(self) -> dict:
        loop = self.seconds - self.draft_seconds - self.target_seconds
        fields = asdict(self)
        if self.target_calls is None:  # not recorded: not part of the run's figures
            del fields["target_calls"]
        return {**fields, "tokens_per_s": round(self.tokens_per_s, 3), "acceptance": round(self.acceptance, 4),
                "mean_tokens_per_target_pass": round(self.tokens_per_target_pass, 3), "loop_seconds": loop,
                "time_per_output_token_ms": round(1000 * self.time_per_output_token, 3)}


@dataclass
class Result:
    """What generate() returns.

    exact: the tokens (and logprobs) are bit-identical to what the target alone computes on this pipeline. False
    only when the target's session cannot promise it (a masked KV rollback, or a device that failed the
    block-invariance check): then a near-tie can flip a token. logprobs: one TokenLogprob per token when the
    config asked for them (GenerationConfig.logprobs / top_logprobs), else None.
    """
    text: str
    token_ids: list[int]
    stats: Stats
    stop_reason: str = "length"
    extra: dict = field(default_factory=dict)
    exact: bool = True
    logprobs: Optional[list[TokenLogprob]] = None

    def to_dict(self, token_text: Optional[Callable[[int], str]] = None) -> dict:
        """The result as JSON-ready data (what `edge-specdec run --json` prints); token_text(id) adds each
        logprob's token text."""
        def entry(token: int, logprob: float) -> dict:
            return {"token_id": token, **({"text": token_text(token)} if token_text else {}), "logprob": logprob}

        out = {"text": self.text, "token_ids": self.token_ids, "stop_reason": self.stop_reason, "exact": self.exact,
               **self.extra, "stats": self.stats.as_dict()}
        if self.logprobs is not None:
            out["logprobs"] = [{**entry(lp.token, lp.logprob), "top_logprobs": [entry(t, v) for t, v in lp.top]}
                               for lp in self.logprobs]
        return out


def generate(target: ModelSession, prompt_ids: list[int], config: GenerationConfig, stream: TextStream,
             drafter: Optional[Drafter] = None, draft_length: Optional[DraftLength] = None,
             rng: Optional[np.random.Generator] = None, on_text: Optional[Callable[[str], None]] = None,
             concurrent: bool = False, cancel: Optional[threading.Event] = None, reuse_prefix: bool = True,
             alone_block: Optional[int] = None, grammar: Optional[GrammarState] = None,
             record_target_calls: bool = False,
             on_prefill: Optional[Callable[["PrefillProgress"], Any]] = None) -> Result:
    """Generate from prompt_ids. Without a drafter this is plain target-only decoding, one token per pass.

    Each round has four phases (see `decode`): draft (the drafter proposes up to k tokens), verify (one target
    pass over them), roll back (the target's cache forgets what it rejected), emit (the round's tokens go out).
    Glossary: *accepted*, the drafted tokens the target keeps, from the first (it would have written them itself);
    *next*, the token the target writes after them, so every round writes accepted + 1 tokens: a correction at the
    first rejected position, or the *bonus* token when it accepted every drafted token.

    concurrent: while the target verifies a proposal, the drafter already drafts the next round as if every
    token were accepted and its own guess of the target's next token were right; that proposal is used only if
    both hold, and dropped otherwise (any proposal is lossless, so this changes speed, never the output).
    on_text receives each piece of text as soon as it is final and cannot be part of a stop string (a TextPiece:
    a str that also says where its characters came from); if it returns True, generation stops (stop_reason
    "stopped"), and so it does when `cancel` is set (checked every round, and between the calls of a long prompt's
    prefill). Ctrl-C stops cleanly too: the result holds what was generated, with stop_reason "interrupted".
    on_prefill: called with a PrefillProgress (a progress bar's figures) as the prompt's prefill starts (the tokens
    kept from before in the cache), between its calls where it takes several (a long prompt), and once it is done.
    A drafter whose model runs out of context stops drafting: the target alone finishes the run. alone_block:
    the target's min_block in a round that drafts nothing, which then steps as the target alone steps.
    reuse_prefix: keep the part of the target's cache that the prompt starts with (a block-invariant target
    only, where that is exact); Stats.prompt_tokens_reused counts it. False: prefill the whole prompt.
    grammar: the output follows it (structured output, see grammar.py): every verified row is masked to what it
    allows, proposals are cut to the part it allows, a drafting round first proposes the tokens it forces, and
    the run ends ("grammar") once it allows nothing more. record_target_calls: keep each target pass's size, past
    and seconds in Stats.target_calls (a measurement; off, nothing is kept).
    """
    config.validate()
    if target.max_context is not None and len(prompt_ids) + config.max_new_tokens > target.max_context:
        raise ContextOverflowError(
            f"the prompt ({len(prompt_ids)} tokens) plus max_new_tokens ({config.max_new_tokens}) exceed the "
            f"target's context of {target.max_context} tokens: shorten the prompt or lower max_new_tokens.")
    rng = rng or np.random.default_rng(config.seed)
    stats, output = Stats(target_calls=[] if record_target_calls else None), Output(config, stream, on_text)
    exact = target.block_invariant or drafter is None
    ahead = DraftAhead() if concurrent and drafter else None
    if grammar is not None and drafter is not None:
        drafter.constrain(grammar)
    start = time.perf_counter()
    # the cache keeps what it shares with the prompt: exact where a block's rows are the bits of single steps
    if reuse_prefix and target.block_invariant:
        stats.prompt_tokens_reused = target.keep_prefix(prompt_ids)
    else:
        target.reset()
    # the layout of the prompt's positions still to be fed and of those after it (session.py, "One-token sequences"
    # and "A chat's turns"): the prompt decides it, whatever drafts, so the target alone and every algorithm feed
    # each position alike
    target.end_prompt(prompt_ids)
    target.reserve(max(len(prompt_ids) + config.max_new_tokens, target.prefill_reach))
    floors = (target.min_block, alone_block if alone_block is not None else target.min_block)
    watch = PrefillWatch(len(prompt_ids), stats.prompt_tokens_reused, start, on_prefill, cancel)
    target.between_calls = watch
    try:
        reason = decode(Run(target, config, rng, drafter, draft_length, ahead, stats, output, cancel, start,
                            floors, grammar, len(prompt_ids), watch), list(prompt_ids))
    finally:
        target.min_block = floors[0]  # as the caller set it
        target.between_calls = None
        if ahead:
            ahead.close()
    stats.prompt_tokens_prefilled = min(target.length, len(prompt_ids)) - stats.prompt_tokens_reused
    stats.new_tokens, stats.seconds = len(output.tokens), time.perf_counter() - start
    if draft_length is not None and draft_length.guard is not None:
        stats.rounds_drafting_paused = draft_length.guard.alone_rounds
    extra = {"constraint_complete": grammar.complete} if grammar is not None else {}
    return Result(output.finish(reason), output.tokens, stats, reason, extra, exact=exact,
                  logprobs=output.logprobs if config.wants_logprobs else None)


class PrefillProgress(NamedTuple):
    """Where a prompt's prefill stands, at its start, between its calls and at its end (on_prefill's argument;
    llama-server's prompt_progress): `done` of the prompt's `total` tokens are in the cache, `cached` of them kept
    from before the run (a reused prefix), `seconds` since the run started."""
    done: int
    total: int
    cached: int
    seconds: float


class PrefillStopped(Exception):
    """A run was cancelled before or between the calls of its prompt's prefill."""


class PrefillWatch:
    """A run's watch over its prompt's prefill: reports its progress (on_prefill) when it starts, between its calls
    (the target calls it there: ModelSession.between_calls) and once it is done, and stops a cancelled run between
    its calls (PrefillStopped: the cache keeps the prompt's tokens fed so far, reused by a later request that starts
    with them)."""

    def __init__(self, prompt_length: int, cached: int, start: float,
                 on_prefill: Optional[Callable[[PrefillProgress], Any]], cancel: Optional[threading.Event]):
        self.total, self.cached, self.start = prompt_length, cached, start
        self.on_prefill, self.cancel = on_prefill, cancel

    def report(self, length: int) -> None:
        if self.on_prefill is not None:
            self.on_prefill(PrefillProgress(min(length, self.total), self.total, self.cached,
                                            time.perf_counter() - self.start))

    def __call__(self, length: int) -> None:
        """Before the prefill's first call and between two calls of a feed, the cache holding `length` tokens."""
        if length >= self.total:  # a later round's calls
            return
        self.report(length)
        if self.cancel is not None and self.cancel.is_set():  # (set before the run, meanwhile, or by on_prefill)
            raise PrefillStopped


@dataclass
class Run:
    """One generate() call: what each of its rounds works with."""
    target: ModelSession
    config: GenerationConfig
    rng: np.random.Generator
    drafter: Optional[Drafter]           # None: the target alone (or the draft's context ran out)
    draft_length: Optional[DraftLength]
    ahead: Optional["DraftAhead"]        # concurrent mode: drafts the next round during the target pass
    stats: Stats
    output: "Output"
    cancel: Optional[threading.Event]    # stops the run when set (checked every round)
    start: float                         # the run's start on time.perf_counter()'s clock
    floors: tuple[int, int] = (1, 1)     # the target's min_block in a round that drafts, and in one that does not
    grammar: Optional[GrammarState] = None  # structured output: what the output must match
    prompt_length: int = 0               # the sequence's first tokens that are the prompt, not the output
    prefill: Optional[PrefillWatch] = None  # reports the prompt's prefill and stops it when cancelled


def decode(r: Run, seq: list[int]) -> str:
    """Rounds until the output stops, from the sequence `seq` (the prompt; the round's tokens are appended);
    returns why it stopped."""
    reason = "length"
    try:
        if r.prefill is not None:  # the prefill starts: its first report, and a run cancelled already stops here
            r.prefill(r.stats.prompt_tokens_reused)
        while r.output.room and reason == "length":
            t0 = time.perf_counter()
            # draft: up to k tokens in the target's vocabulary (k 0: the target alone this round)
            k = min(r.draft_length.round_k(), r.output.room - 1) if r.drafter and r.draft_length else 0
            # copies: no model runs, so they go on while the drafting guard pauses the model (not where the batching
            # cap leaves a round no token at all)
            free = (min(r.drafter.free_tokens, r.output.room - 1)
                    if r.drafter and (r.draft_length is None or r.draft_length.copies_allowed()) else 0)
            if r.floors[0] > r.floors[1]:  # drafting rounds widen to a fixed block (it pays here): a copy fits in one
                free = min(free, r.floors[0] - 1)
            if r.stats.rounds == 0 and getattr(r.target, "sequences_from", None) is not None:
                # after a long prompt the first round is the prompt's prefill alone: its first token waits neither
                # for the draft model's prefill nor for the one-token sequences of a proposal, and no target call is
                # saved by verifying one with it (session.py, "One-token sequences": the prompt and the tokens
                # after it go in calls of their own anyway)
                k = free = 0
            proposal = draft(r, seq, k, free)
            if proposal is None:  # the draft's context is full: the target alone finishes the run
                r.drafter, proposal = None, Proposal()
            # a round of the target alone steps as the target alone does; one that verifies a proposal (a copy too)
            # takes the drafting rounds' block
            r.target.min_block = r.floors[k == 0 and not proposal.copied]
            recording = r.stats.target_calls is not None
            past = r.target.length if recording else 0  # a prefix of seq: what the cache holds before the pass
            t1 = time.perf_counter()
            # verify: one target pass over the proposal, then the accepted tokens and the next one. The drafter
            # hears the outcome at once; in concurrent mode, after it drafted the next round on its guess
            rows = (r.ahead.target_pass(r.target, seq, proposal, r.drafter, k) if r.ahead
                    else r.target.sync(seq, proposal.tokens))
            if r.stats.rounds == 0 and r.prefill is not None:  # the prompt is in the cache: its prefill is done
                r.prefill.report(r.prompt_length)
            # (_make: a stand-in rule, such as the tests' deliberately broken ones, may return a plain tuple)
            verdict = Verdict._make(verify(rows, proposal, r.config, r.rng, seq, r.grammar,
                                           prompt_length=r.prompt_length))
            if r.drafter:  # the outcome of the drafter's own tokens, after the grammar's forced ones
                r.drafter.accept(max(0, verdict.accepted - proposal.forced), verdict.next_token)
            # roll back: the target's cache forgets the drafted tokens it rejected
            r.target.rollback(len(proposal.tokens) - verdict.accepted)
            t2 = time.perf_counter()
            if r.ahead:
                r.ahead.settle(proposal, verdict)
            count_round(r, proposal, verdict, k, t1 - t0, t2 - t1)
            if recording:
                r.stats.count_call(len(seq) + len(proposal.tokens) - past, r.target.last_block, past, t2 - t1)
            # emit: the accepted tokens and the next one, up to the first stop; the sequence gets what was taken
            n = verdict.accepted
            taken = proposal.tokens[:n] + [verdict.next_token]
            if r.grammar is not None:  # nothing after the token that completes the grammar's text
                taken = taken[:r.grammar.until_done(taken)]
            logprobs = token_logprobs(verdict.rows, taken, r.config) if r.config.wants_logprobs else None
            before = len(r.output.tokens)
            reason = r.output.add(taken, logprobs, drafted=n, forced=min(n, proposal.forced))
            seq += r.output.tokens[before:]
            if r.grammar is not None:
                r.grammar.commit(r.output.tokens[before:])
                if reason == "length" and r.grammar.done:  # the constraint's text is complete
                    reason = "grammar"
            if r.cancel is not None and r.cancel.is_set() and reason == "length":
                reason = "stopped"
    except KeyboardInterrupt:
        reason = "interrupted"
    except PrefillStopped:
        reason = "stopped"
    return reason


def draft(r: Run, seq: list[int], k: int, free: int = 0) -> Optional[Proposal]:
    """The round's proposal, at most k tokens (or `free` tokens copied without a draft model, see suffix.py): the
    grammar's forced tokens, then the drafter's (or the one it drafted during the previous target pass), cut to the
    part the grammar allows; None when the draft's context is full. At most k drafted tokens go to the target,
    even when a heterogeneous drafter spells k draft tokens with more: a target with fixed blocks of k + 1 then
    keeps its shape."""
    if k == 0 and free == 0:
        return Proposal()
    ready = r.ahead.take() if r.ahead else None  # drafted during the previous target pass
    forced = r.grammar.forced(k) if r.grammar is not None else []
    if ready is not None and not forced:
        proposal = ready
    elif len(forced) < k or (k == 0 and free):  # (k 0: a copy only, the draft model does not run)
        proposal = propose(r.drafter, seq + forced, k - len(forced))
        if proposal is None:
            return None
        proposal = Proposal.grammar_forced(forced, proposal) if forced else proposal
    else:
        proposal = Proposal.grammar_forced(forced)
    proposal = proposal.head(max(k, proposal.forced + min(proposal.copied, free)))
    if r.grammar is not None and proposal.tokens:
        proposal = proposal.head(r.grammar.valid_prefix(seq, proposal.tokens))
    return proposal


def count_round(r: Run, proposal: Proposal, verdict: Verdict, k: int, draft_seconds: float,
                target_seconds: float) -> None:
    """A round's outcome to the drafter, the draft length (which adapts to the draft model's rounds) and the
    statistics; a grammar's forced tokens and free copies are counted on their own, not as the draft model's."""
    forced, copied, n = proposal.forced, proposal.copied, verdict.accepted
    kept_forced = min(n, forced)
    kept_copied = min(n - kept_forced, copied)
    r.stats.grammar_tokens_proposed += forced
    r.stats.grammar_tokens_accepted += kept_forced
    if copied:
        r.stats.count_copy(proposal.source, copied, kept_copied)
    if r.drafter:  # (the first round's seconds are mostly the prompt's: not the round's price)
        r.drafter.verified(proposal, n - kept_forced, draft_seconds + target_seconds if r.stats.rounds else None)
    proposed, n = len(proposal.tokens) - forced - copied, n - kept_forced - kept_copied
    if r.draft_length and not copied:  # a copy is no draft model's round: its guard and length ignore it
        r.draft_length.update(n, proposed, draft_seconds, target_seconds, drafted=k > 0, first=r.stats.rounds == 0)
    if copied and r.stats.rounds:
        r.stats.copy_round_seconds += draft_seconds + target_seconds
    r.stats.count_round(proposed, n, draft_seconds, target_seconds, bool(r.ahead and r.ahead.ready), r.start)


class DraftAhead:
    """Concurrent drafting: the target's pass runs in a thread of its own while the drafter drafts the next round on
    a guess, that the target keeps the whole proposal and then writes the drafter's own first token. The guess's
    proposal (without that first token) is the next round's only when both come true."""

    def __init__(self):
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="target")
        self.guess: Optional[Proposal] = None  # drafted during this round's target pass
        self.ready: Optional[Proposal] = None  # the next round's proposal: the guess came true (and drafted more)

    def target_pass(self, target: ModelSession, sequence: list[int], proposal: Proposal,
                    drafter: Optional[Drafter], k: int) -> np.ndarray:
        """The target's rows to verify the proposal with, computed while the drafter drafts on the guess (up to
        k + 1 tokens); without a drafter or a draft length, just the rows."""
        self.guess = None
        if drafter is None or k == 0:
            return target.sync(sequence, proposal.tokens)
        job = self.pool.submit(target.sync, sequence, proposal.tokens)
        self.guess = propose(drafter, sequence + proposal.tokens, k + 1)
        return job.result()

    def settle(self, proposal: Proposal, verdict: Verdict) -> None:
        """The round's verdict: keep the guess's proposal for the next round if the guess came true."""
        guess, self.guess = self.guess, None
        came_true = (guess is not None and verdict.accepted == len(proposal.tokens)
                     and guess.tokens[:1] == [verdict.next_token])
        rest = guess.after_first() if came_true else None
        self.ready = rest if rest is not None and rest.tokens else None

    def take(self) -> Optional[Proposal]:
        """The proposal drafted ahead for the round that starts now, if any; once."""
        ready, self.ready = self.ready, None
        return ready

    def close(self) -> None:
        self.pool.shutdown(wait=True)


def propose(drafter: Drafter, sequence: list[int], k: int) -> Optional[Proposal]:
    """The drafter's proposal, or None when its model has no room left for the sequence: a draft's context
    (or its tokenizer's spelling of the same text) may be shorter than the target's, and must not fail a run."""
    try:
        return drafter.propose(sequence, k)
    except ContextOverflowError:
        return None


class Output:
    """The generated tokens and their text: stops at EOS, a stop string, the token budget or the callback.

    Text reaches on_text only once it cannot be the start of a stop string, and never past one, so the streamed
    text always equals the result's text."""

    def __init__(self, config: GenerationConfig, stream: TextStream, on_text: Optional[Callable[[str], Any]]):
        self.config, self.stream, self.on_text = config, stream, on_text
        self.eos = set() if config.ignore_eos else set(config.eos_token_ids or [])
        self.tokens: list[int] = []
        self.logprobs: list[TokenLogprob] = []
        self.sent = 0  # characters of the text handed to on_text
        self.handed = 0  # tokens whose text was handed to on_text
        self.unsent: list[tuple[str, int]] = []  # the other tokens in the text: (source, where their text ends)

    @property
    def room(self) -> int:
        return self.config.max_new_tokens - len(self.tokens)

    def add(self, tokens: list[int], logprobs: Optional[list[TokenLogprob]] = None, drafted: int = 0,
            forced: int = 0) -> str:
        """Take tokens up to the first stop; return why it stopped, or "length" to go on. The first `drafted`
        tokens were proposed and accepted by the target: the first `forced` of them forced by a grammar, the
        rest the drafter's."""
        for i, token in enumerate(tokens[:self.room]):
            self.tokens.append(token)
            if logprobs:
                self.logprobs.append(logprobs[i])
            if token in self.eos:
                return "eos"
            self.stream.push([token])
            if self.on_text is not None:  # only pieces handed to on_text need to know their tokens
                source = "grammar" if i < forced else "draft" if i < drafted else "target"
                self.unsent.append((source, len(self.stream.text)))
            cut = self.stop_at()
            if cut is not None:
                self.send(cut)
                return "stop_string"
            if self.send(len(self.stream.text) - self.held_back()):  # the callback asked to stop
                return "stopped"
        return "length"

    def stop_at(self) -> Optional[int]:
        """Where the first stop string in the text starts, if there is one."""
        found = [i for i in (self.stream.text.find(s) for s in self.config.stop_strings if s) if i >= 0]
        return min(found) if found else None

    def held_back(self) -> int:
        """The length of the longest end of the text that a stop string starts with: not final yet."""
        return unfinished_end(self.stream.text, self.config.stop_strings)

    def send(self, end: int) -> bool:
        """Hand the text up to `end` to on_text as a TextPiece: its spans by source, and the tokens whose text it
        completes (a token cut by `end` counts in a later piece). True if the callback asked to stop."""
        if self.on_text is None or end <= self.sent:
            return False
        spans: list[list] = []  # [text, source, tokens completed]
        position, done = self.sent, 0
        for source, token_end in self.unsent:
            text, complete = self.stream.text[position:min(token_end, end)], token_end <= end
            if spans and spans[-1][1] == source:
                spans[-1][0] += text
                spans[-1][2] += complete
            else:
                spans.append([text, source, int(complete)])
            position = min(token_end, end)
            if not complete:
                break
            done += 1
        if position < end:  # text that no token ends in: the decoder's flush of a cut-off character at the end
            spans.append([self.stream.text[position:end], "target", 0])
        del self.unsent[:done]
        token_ids = self.tokens[self.handed:self.handed + done]
        logprobs = self.logprobs[self.handed:self.handed + done]
        self.sent, self.handed = end, self.handed + done
        piece = TextPiece([Span(*span) for span in spans if span[0] or span[2]], token_ids, logprobs)
        return self.on_text(piece) is True

    def finish(self, reason: str) -> str:
        self.stream.finish()
        cut = self.stop_at()
        text = self.stream.text if cut is None else self.stream.text[:cut]
        self.send(len(text))
        return text
