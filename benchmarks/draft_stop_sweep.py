"""How long a draft model should draft: the confidence stop and the most tokens a round, swept side by side.

A draft aligned to its target is surer of itself than the stock one, and a verification block costs more the
longer it is, so the runtime's defaults (up to 8 tokens, stop after a token under 0.7) may not be the best for it.
Every setting runs on every held-out benchmark prompt (the target's chat template, greedy), interleaved prompt by
prompt with the target alone, the starting setting rotating; each output is checked against the target alone's.
Prints per setting the median tokens/s, the paired median speedup over the target alone, tokens per target pass
and proposed tokens per round (lookups included).

    python benchmarks/draft_stop_sweep.py ~/.cache/edge-specdec/bundles/qwen1.5b-int4+smollm2-135m-int8-aligned40 \\
        --settings 0.7:8 0.8:8 0.9:8 0.7:5 --repeats 2
"""
from __future__ import annotations

import argparse
import statistics
import time

from edge_specdec.benchmark.prompt_set import load_prompt_set, render_prompts
from edge_specdec.runtime.pipeline import Pipeline
from edge_specdec.runtime.sampling import GenerationConfig


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("bundle")
    p.add_argument("--settings", nargs="+", default=["0.7:8", "0.8:8", "0.9:8", "0.7:5"], metavar="CONF:K",
                   help="confidence stop and the most drafted tokens a round, one SLEM row each")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=128)
    args = p.parse_args()
    settings = [(float(c), int(k)) for c, k in (s.split(":") for s in args.settings)]
    pipe = Pipeline(args.bundle)
    prompt_set = load_prompt_set()
    prompts = [(p.key, p.ours) for p in render_prompts(pipe, prompt_set, list(prompt_set))[0]]
    config = GenerationConfig(max_new_tokens=args.max_new_tokens)
    rows = ["target alone"] + [f"conf {c:g}, K {k}" for c, k in settings]
    speed = {row: {} for row in rows}
    stats = {row: [0, 0, 0, 0] for row in rows[1:]}  # tokens, target passes, proposed, rounds
    mismatches = []

    def run(row: str, ids: list[int]):
        if row == "target alone":
            return pipe.generate(ids, config, algorithm="none")
        c, k = settings[rows.index(row) - 1]
        return pipe.generate(ids, config, algorithm="slem", confidence=c, num_assistant_tokens=k)

    for _, ids in prompts[:1]:  # warm-up, not counted
        for row in rows:
            run(row, ids)
    for rep in range(args.repeats):
        for n, (name, ids) in enumerate(prompts):
            order = rows[n % len(rows):] + rows[:n % len(rows)]
            results = {}
            for row in order:
                start = time.perf_counter()
                result = run(row, ids)
                results[row] = (result, len(result.token_ids) / (time.perf_counter() - start))
            reference = results["target alone"][0].token_ids
            for row, (result, tps) in results.items():
                speed[row].setdefault(name, []).append(tps)
                if row in stats:
                    s = result.stats
                    st = stats[row]
                    st[0] += s.new_tokens
                    st[1] += s.target_passes
                    st[2] += s.draft_tokens_proposed
                    st[3] += s.rounds
                if result.token_ids != reference:
                    mismatches.append((row, name, rep))
            print(f"[{rep + 1}/{args.repeats}] {name}: " + ", ".join(
                f"{row} {results[row][1]:.1f}" for row in rows), flush=True)
    alone = {name: statistics.median(v) for name, v in speed["target alone"].items()}
    print(f"\n{'row':<16} {'tok/s median':>12} {'paired speedup':>15} {'tokens/pass':>12} {'proposed/round':>15}")
    for row in rows:
        per = {name: statistics.median(v) for name, v in speed[row].items()}
        paired = statistics.median(per[name] / alone[name] for name in per)
        everything = [x for v in speed[row].values() for x in v]
        extra = ("", "") if row not in stats else (f"{stats[row][0] / stats[row][1]:.2f}",
                                                   f"{stats[row][2] / max(1, stats[row][3]):.2f}")
        print(f"{row:<16} {statistics.median(everything):>12.2f} {paired:>14.3f}x {extra[0]:>12} {extra[1]:>15}")
    print(f"\noutputs identical to the target alone: {'all' if not mismatches else mismatches}")


if __name__ == "__main__":
    main()
