"""Pricing simulated rounds and ranking the candidates.

Each candidate's replayed runs (replay.py) are priced with the target's measured cost of a call of n tokens,
t(n), and the loop's own seconds between calls; the target alone's runs are priced the same way, so a
candidate's predicted speedup on a prompt is the target alone's seconds per output token over the candidate's.
Candidates rank by the mean over prompts; two whose predictions are within PREDICTION_MARGIN of each other, or
within the noise of the target's call costs measured now (timing_noise), are a tie. How much the prompts' figures
differ is no noise: a simulated run is a function of its prompt, so a candidate that gains on every prompt is
ahead whatever the spread between prompts.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from ..runtime.probes import _scratch
from .replay import Replayed

# Predictions closer than this (relative) are a tie: measured against interleaved runs of each candidate on the
# real pair (benchmarks/pair_accuracy.py), the simulation overstated every candidate by 5 % to 10 %, so its errors
# differ by about 5 % from one candidate to another and cannot order two candidates closer than that.
PREDICTION_MARGIN = 0.05


def target_costs(session, sizes: set[int], reps: int = 3) -> dict[int, list[float]]:
    """Seconds of a target call of n tokens (the logits of its last token) after a short context, `reps` samples
    per size: in interleaved rounds, four calls of a size in a row of which the first two (a change of shape) are
    not counted (as check.step_costs measures)."""
    times: dict[int, list[float]] = {n: [] for n in sorted(sizes)}
    with _scratch(session, max(sizes)) as timed:
        for _ in range(reps):
            for n in times:
                times[n] += [timed(n) for _ in range(4)][2:]
    return times


def timing_noise(samples: dict[int, list[float]]) -> float:
    """The relative noise of the target's call costs measured now: half the distance between the quartiles of a
    size's samples over their median, the median over the sizes."""
    spreads = [(np.quantile(s, 0.75) - np.quantile(s, 0.25)) / 2 / np.median(s)
               for s in samples.values() if len(s) > 1]
    return float(np.median(spreads)) if spreads else 0.0


def cost_function(samples: dict[int, list[float]]) -> Callable[[int], float]:
    """t(n): the median of the samples of that size (every size priced is measured)."""
    medians = {n: float(np.median(s)) for n, s in samples.items()}
    return lambda n: medians[n]


@dataclass
class Prediction:
    """A candidate's predicted speedup over the target alone, per prompt and overall, and its rounds."""
    speedups: list[Optional[float]]
    rounds: int
    drafted: int
    accepted: int
    free_proposed: int
    free_accepted: int
    new_tokens: int

    @property
    def speedup(self) -> Optional[float]:
        known = [s for s in self.speedups if s is not None]
        return float(statistics.fmean(known)) if known else None


def predict(alone: list[Replayed], runs: list[Replayed], t: Callable[[int], float]) -> Prediction:
    """The candidate's runs priced against the target alone's on the same prompts."""
    speedups = []
    for a, r in zip(alone, runs):
        a_s, r_s = a.seconds_per_token(t), r.seconds_per_token(t)
        speedups.append(a_s / r_s if a_s and r_s else None)
    stats = [r.result.stats for r in runs]
    return Prediction(speedups, sum(s.rounds for s in stats), sum(s.draft_tokens_proposed for s in stats),
                      sum(s.draft_tokens_accepted for s in stats), sum(s.free_tokens_proposed for s in stats),
                      sum(s.suffix_tokens_accepted + s.pool_tokens_accepted for s in stats),
                      sum(s.new_tokens for s in stats))


def simulate_default(engine, prompts: list, max_new_tokens: int, sampling=None) -> dict:
    """What `pair` predicts for one loaded engine: its default algorithm (`auto`) and the target alone replayed
    on the target's greedy answers to the prompts (sampling, a sampled.Sampling: its sampled answers, sampled.py),
    the rounds priced with the target's call costs measured now. Returns the prediction (mean over prompts), the
    per-prompt figures, the algorithm, the acceptance and the decoding it predicts for."""
    from ..runtime import SpeculativeConfig
    from .replay import greedy_answers, replay
    from .sampled import sampled_answers

    answers = (greedy_answers(engine, prompts, max_new_tokens) if sampling is None
               else sampled_answers(engine, prompts, max_new_tokens, sampling))
    alone = replay(engine, answers, SpeculativeConfig(algorithm="none"))
    runs = replay(engine, answers, SpeculativeConfig(algorithm="auto"))
    sizes = {1} | {n for r in alone + runs for n in r.target_sizes()}
    p = predict(alone, runs, cost_function(target_costs(engine.target_model.session(), sizes)))
    return {"speedup": p.speedup, "per_prompt": p.speedups, "algorithm": runs[0].result.extra.get("algorithm"),
            "acceptance": p.accepted / p.drafted if p.drafted else None,
            "free_tokens_accepted": p.free_accepted, "max_new_tokens": max_new_tokens,
            "decoding": "greedy" if sampling is None else sampling.describe()}


def within_noise(a: list[Optional[float]], b: list[Optional[float]], floor: float = 0.0) -> bool:
    """Whether two candidates' per-prompt speedups are a tie: their means (over the prompts both have) are within
    PREDICTION_MARGIN of each other, or within `floor` (the timings' own noise, timing_noise)."""
    pairs = [(x, y) for x, y in zip(a, b) if x and y]
    if not pairs:
        return True
    ratio = statistics.fmean(x for x, _ in pairs) / statistics.fmean(y for _, y in pairs)
    return abs(ratio - 1.0) <= max(PREDICTION_MARGIN, floor)


def rank(predictions: dict[str, Prediction], floor: float = 0.0) -> list[dict]:
    """The candidates best first, each with its place: a candidate within the noise of the one above it shares
    its place ("tie"; floor: the timings' own noise, see within_noise). Candidates without a prediction come
    last, unranked."""
    known = sorted((name for name, p in predictions.items() if p.speedup is not None),
                   key=lambda name: -predictions[name].speedup)
    out, place = [], 0
    for i, name in enumerate(known):
        tie = i > 0 and within_noise(predictions[known[i - 1]].speedups, predictions[name].speedups, floor)
        place = place if tie else i + 1
        out.append({"name": name, "place": place, "tie": tie})
    for i, entry in enumerate(out[:-1]):  # the one above a tie is part of it too
        entry["tie"] = entry["tie"] or out[i + 1]["tie"]
    out += [{"name": name, "place": None, "tie": False} for name in predictions if name not in known]
    return out
