"""The workloads suite's requests, each run right after a request on which drafting lost by its rate.

    python benchmarks/guard_after_loss.py BUNDLE [--repeats 2] [--max-new-tokens 128]

A request whose prose the draft guesses badly leaves the drafting guard's verdict for its kind of request (the
algorithm, the penalty, greedy or sampled, a grammar) at "the target alone". This script sets that verdict (as one
such request leaves it, with a countdown of 50 rounds to its next check of drafting) before every default run of
the workloads suite's requests (`edge-specdec bench workloads`: code edits, quotes, revised answers, tool loops,
plain chat; the draft pool emptied, earlier turns cached), and prints each run's tokens/s against the target alone
run just before it on the same engine, then the median per kind. The outputs are checked equal. Compare two
versions of the runtime by running it at each.
"""
from __future__ import annotations

import argparse
import statistics

from edge_specdec.benchmark.suites.workloads import load_cells, runner
from edge_specdec.runtime import Engine, GenerationConfig

LOST = {"mode": False, "interval": 64, "left": 50, "drafting": [8.0, 0.5], "alone": [5.0, 0.27]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n    python")[0])
    p.add_argument("bundle", help="a bundle folder with a draft model")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=128)
    args = p.parse_args()
    engine = Engine(args.bundle)
    engine.compile_static_copies()
    config = GenerationConfig(max_new_tokens=args.max_new_tokens, temperature=0.0).with_defaults(engine.default_config)
    key = engine.guard_name(engine.default_guard_key(config))  # the runs' kind of request
    alone, default = runner(engine, args.max_new_tokens, "none"), runner(engine, args.max_new_tokens, "auto")
    ratios: dict[str, list[float]] = {}
    for repeat in range(args.repeats):
        for cell in load_cells(engine, None):
            base = alone(cell, repeat)
            engine.measurements.put(key, LOST, write=False)
            run = default(cell, repeat)
            if run.output != base.output:
                raise SystemExit(f"{cell.key}: the default wrote other tokens than the target alone")
            ratio = run.figures["tokens_per_s"] / base.figures["tokens_per_s"]
            ratios.setdefault(cell.key.split("/")[0], []).append(ratio)
            print(f"{cell.key} repeat {repeat + 1}: {ratio:.2f}x", flush=True)
    for kind, values in ratios.items():
        print(f"{kind}: {statistics.median(values):.2f}x")
    print(f"all: {statistics.median([r for values in ratios.values() for r in values]):.2f}x")


if __name__ == "__main__":
    main()
