"""The default on the workloads suite's requests with and without replaying renames in copies, interleaved.

    python benchmarks/rename_replay.py BUNDLE [--repeats 3] [--max-new-tokens 128] [--categories code_edit ...]

Free drafts remember a rename the target made in copied text (one word for another, then the copied text went on)
and spell the old word with the new one in later copies (runtime/suffix.py). This script runs each of the workloads
suite's requests (`edge-specdec bench workloads`: the draft pool emptied, earlier turns cached) with the default
twice on one engine, back to back, once with renames learnt and once without (the order alternating; a session per
arm, as the suite has one per row), and prints each pair's time ratio, then the median per kind. The outputs are
checked equal.
"""
from __future__ import annotations

import argparse
import statistics
from contextlib import contextmanager

from edge_specdec.benchmark.suites.workloads import load_cells, runner
from edge_specdec.runtime import Engine
from edge_specdec.runtime.suffix import SuffixDrafter


@contextmanager
def renames(on: bool):
    """Renames learnt (as the runtime does) or never learnt (as before it replayed them)."""
    learn = SuffixDrafter.learn_rename
    if not on:
        SuffixDrafter.learn_rename = lambda *args, **kwargs: None
    try:
        yield
    finally:
        SuffixDrafter.learn_rename = learn


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n    python")[0])
    p.add_argument("bundle", help="a bundle folder with a draft model")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--categories", nargs="+", help="the suite's kinds to run (default: all)")
    args = p.parse_args()
    engine = Engine(args.bundle)
    # a session per arm, as the suite has one per row: an arm's run never finds the other's prompt in its KV cache
    runs = {on: runner(engine, args.max_new_tokens, "auto") for on in (True, False)}
    cells = [c for c in load_cells(engine, None) if not args.categories or c.value[0] in args.categories]
    ratios: dict[str, list[float]] = {}
    for repeat in range(-1, args.repeats):  # (-1: an uncounted warm-up of each request)
        for i, cell in enumerate(cells):
            speed, ids = {}, {}
            for on in ((True, False) if (repeat + i) % 2 else (False, True)):
                with renames(on):
                    measured = runs[on](cell, repeat)
                speed[on], ids[on] = measured.figures["tokens_per_s"], measured.output
            if ids[True] != ids[False]:
                raise SystemExit(f"{cell.key}: the outputs differ")
            if repeat >= 0:
                ratio = speed[True] / speed[False]
                ratios.setdefault(cell.value[0], []).append(ratio)
                print(f"repeat {repeat + 1} {cell.key}: {speed[False]:.2f} tok/s without renames, "
                      f"{speed[True]:.2f} with: {ratio:.3f}x", flush=True)
    for kind, values in ratios.items():
        print(f"{kind}: with renames {statistics.median(values):.3f}x the speed without (median of {len(values)}: "
              f"{', '.join(f'{v:.2f}' for v in values)})")


if __name__ == "__main__":
    main()
