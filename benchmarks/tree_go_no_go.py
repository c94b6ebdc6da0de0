"""Go/no-go for verifying two candidate continuations in one target call (a static tree of two branches).

Measures the upper bound of what a second branch could earn, before building copy-on-write KV blocks for it:

1. the target's call cost t(n) for n = 1..48 tokens after a real past, interleaved, medians;
2. the default's real runs (greedy) on the workloads suite's requests and the package's prompt set, where every free
   copy round also records the second branch the suffix drafter could have proposed (the longest continuation of an
   occurrence of the sequence's end that starts with another token than the copy's). With the greedy answer known,
   each branch's accepted length follows; a round gains where the copy missed its first token and the second
   branch would have kept some.

The bound counts each gained token at the run's mean seconds per token, and each tree round's cost as
t(1 + both branches) - t(1 + the copy); it ignores the tree's own overheads (copying the shared last block per
branch, rolling the losing branch back), so a no-go here is a no-go for the tree.

    python benchmarks/tree_go_no_go.py BUNDLE [--past 300] [--max-new-tokens 128]
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from edge_specdec.benchmark.prompt_set import load_prompt_set
from edge_specdec.benchmark.suites.workloads import load_cells
from edge_specdec.runtime import Engine, GenerationConfig, sources
from edge_specdec.runtime.suffix import FREE_TOKENS, SuffixDrafter

SIZES = [1, 2, 4, 8, 12, 17, 24, 33, 48]


def cost_curve(engine: Engine, past: int, reps: int = 5) -> dict[int, float]:
    """Median seconds of one target call of n tokens after `past` tokens, sizes interleaved."""
    session = engine.target_model.session()
    session.min_block = 1
    ids = np.random.default_rng(0).integers(100, 20000, past + max(SIZES)).tolist()
    session.feed(ids[:past], rows=1)
    times: dict[int, list[float]] = {n: [] for n in SIZES}
    for _ in range(reps + 1):
        for n in SIZES:
            start = time.perf_counter()
            session.feed(ids[past:past + n], rows=1)
            times[n].append(time.perf_counter() - start)
            session.rollback(n)
    return {n: statistics.median(t[1:]) for n, t in times.items()}


def second_branch(drafter: SuffixDrafter, sequence: list[int], first: int) -> list[int]:
    """The longest continuation, in the request or the pool, of an occurrence of the sequence's end whose next
    token is not `first`."""
    indexes = [(drafter.own, True)]
    if drafter.pool is not None and drafter.pool.index(drafter.scope) is not None:
        indexes.append((drafter.pool.index(drafter.scope), False))
    best: tuple[int, list[int]] = (0, [])
    for index, own in indexes:
        for n, p in index.occurrences(sequence, own):
            if p + 1 < len(index.tokens) and index.tokens[p + 1] != first and n > best[0]:
                run = [t for t in index.tokens[p + 1:p + 1 + FREE_TOKENS]]
                run = run[:next((i for i, t in enumerate(run) if t < 0), len(run))]
                best = (n, run)
    return best[1]


def kept(branch: list[int], answer: list[int]) -> int:
    return next((i for i, (a, b) in enumerate(zip(branch, answer)) if a != b), min(len(branch), len(answer)))


def record_rounds():
    """Patch the free source to record, per copy round, (sequence length, copy, second branch)."""
    rounds: list[tuple[int, list[int], list[int]]] = []
    copy = SuffixDrafter.copy

    def recording(self, sequence, limit=FREE_TOKENS):
        found = copy(self, sequence, limit)
        if found is not None:
            found.second = second_branch(self, sequence, found.tokens[0])
        return found

    propose = sources.FreeFirst.propose

    def proposing(self, sequence, k):
        proposal = propose(self, sequence, k)
        if proposal.copied:
            found = self.free.copy(sequence)
            rounds.append((len(sequence), proposal.tokens[:proposal.copied],
                           getattr(found, "second", []) if found else []))
        return proposal

    SuffixDrafter.copy, sources.FreeFirst.propose = recording, proposing
    return rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bundle")
    parser.add_argument("--past", type=int, default=300)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    args = parser.parse_args()
    engine = Engine(args.bundle)
    curve = cost_curve(engine, args.past)
    print("target call cost after a past of", args.past, "tokens (median ms):")
    print("  " + "  ".join(f"t({n})={1000 * s:.0f}" for n, s in curve.items()))

    def t(n: int) -> float:  # linear between the measured sizes
        return float(np.interp(n, list(curve), list(curve.values())))

    prompts = [(c.key, c.value[2]) for c in load_cells(engine, None)]
    prompt_set = load_prompt_set()
    for category, items in prompt_set.items():
        for i, item in enumerate(items[:4]):
            messages = [{"role": "user", "content": item["text"]}]
            prompts.append((f"prompts/{category}/{i + 1}", engine.chat_prompt(messages)))
    config = GenerationConfig(max_new_tokens=args.max_new_tokens, temperature=0.0).with_defaults(
        engine.default_config)
    rounds = record_rounds()
    totals = {"tokens": 0, "seconds": 0.0, "copy_rounds": 0, "with_branch": 0, "gained_rounds": 0, "gained": 0,
              "saved": 0.0, "cost": 0.0}
    for name, ids in prompts:
        engine.forget()
        rounds.clear()
        result = engine.session().generate(ids, config, algorithm="auto", pool_scope="")
        out, start = list(result.token_ids), len(ids)
        per_token = result.stats.seconds / max(1, len(out))
        gained = saved = cost = 0.0
        for length, copy, second in rounds:
            answer = out[length - start:]
            totals["copy_rounds"] += 1
            if not second:
                continue
            totals["with_branch"] += 1
            cost += t(1 + len(copy) + len(second)) - t(1 + len(copy))
            extra = kept(second, answer) - kept(copy, answer)
            if extra > 0:
                totals["gained_rounds"] += 1
                gained += extra
                saved += extra * per_token
        totals["tokens"] += len(out)
        totals["seconds"] += result.stats.seconds
        totals["gained"] += gained
        totals["saved"] += saved
        totals["cost"] += cost
        print(f"{name}: {len(out)} tokens, {len(rounds)} copy rounds, second branch would add {gained:.0f} tokens "
              f"(~{saved:.2f} s saved) for {cost:.2f} s of wider calls", flush=True)
    print()
    print(f"all: {totals['tokens']} tokens in {totals['seconds']:.1f} s; {totals['copy_rounds']} copy rounds, "
          f"{totals['with_branch']} with a second branch, {totals['gained_rounds']} where it would keep more: "
          f"+{totals['gained']:.0f} tokens ({100 * totals['gained'] / max(1, totals['tokens']):.1f} % of the output)")
    print(f"upper bound of the time saved {totals['saved']:.2f} s against {totals['cost']:.2f} s of wider calls: "
          f"net {100 * (totals['saved'] - totals['cost']) / totals['seconds']:+.1f} % of the run time")


if __name__ == "__main__":
    main()
