"""What feeding a prompt in pieces of at most session.LONGEST_BLOCK tokens costs: the target's prefill of N random
tokens in one call against the same tokens in even pieces (what an exact session does, session.py "Long blocks"),
on one compiled model, interleaved run by run. Prints each length's medians and their ratio.

    python benchmarks/prefill_pieces.py BUNDLE [--lengths 256 1024 2048] [--runs 3]
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from edge_specdec.runtime import Engine
from edge_specdec.runtime.session import LONGEST_BLOCK


def prefill_seconds(session, tokens: list[int]) -> float:
    session.reset()
    start = time.perf_counter()
    session.feed(tokens, rows=1)
    seconds = time.perf_counter() - start
    session.reset()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bundle")
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 1024, 2048])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    engine = Engine(args.bundle, static_shapes=False)
    model = engine.target_model
    pieces, whole = model.session(), model.session()
    pieces.block_invariant, whole.block_invariant = True, False  # least and longest block: see session.py
    print(f"target: {model.precision}, KV cache {model.kv_cache}; pieces of at most {LONGEST_BLOCK} tokens", flush=True)
    rng = np.random.default_rng(0)
    for n in args.lengths:
        tokens = rng.integers(0, model.vocab_size, n).tolist()
        prefill_seconds(pieces, tokens[:64])  # warm-up of the shapes
        prefill_seconds(whole, tokens)
        times: dict[str, list[float]] = {"one call": [], "pieces": []}
        for _ in range(args.runs):
            times["one call"].append(prefill_seconds(whole, tokens))
            times["pieces"].append(prefill_seconds(pieces, tokens))
        med = {name: statistics.median(t) for name, t in times.items()}
        print(f"{n} tokens: one call {med['one call']:.2f} s, pieces {med['pieces']:.2f} s, "
              f"pieces / one call {med['pieces'] / med['one call']:.3f}x "
              f"(runs: {', '.join(f'{a:.2f}/{b:.2f}' for a, b in zip(times['one call'], times['pieces']))})",
              flush=True)


if __name__ == "__main__":
    main()
