"""Block invariance of a target after pasts of several lengths, each a real prefill of random tokens (not
`probes.fill_past`'s copied blocks), per KV cache type: the runtime's probe (`probes.is_block_invariant`: a block
of 12 tokens against the same tokens in pieces, lone tokens among them) run after each past.

    python benchmarks/probe_pasts.py ~/.cache/edge-specdec/bundles/qwen1.5b-int4+smollm2-135m-int8 \
        --kv f16 f32 --pasts 0 29 64 100 101 150 300 1000
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from edge_specdec.runtime.session import open_model


def invariant_after(session, past: int) -> bool:
    sizes = [1, 4, 1, 1, 1, 1, 3]
    rng = np.random.default_rng(past)
    tokens = rng.integers(0, session.vocab_size, sum(sizes)).tolist()
    session.reset()
    if past:
        session.feed(rng.integers(0, session.vocab_size, past).tolist(), rows=1)
    whole = session.feed(tokens)
    session.rollback(len(tokens))
    ends = np.cumsum(sizes)
    pieces = np.concatenate([session.feed(tokens[end - n:end]) for n, end in zip(sizes, ends)])
    session.reset()
    return bool(np.array_equal(whole, pieces))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("bundle", type=Path)
    p.add_argument("--kv", nargs="+", default=["f16", "f32"])
    p.add_argument("--pasts", type=int, nargs="+", default=[0, 29, 64, 100, 101, 150, 300, 1000])
    p.add_argument("--precision", default="dq")
    args = p.parse_args()
    for kv in args.kv:
        model = open_model(args.bundle / "target" / "openvino_model.xml", "CPU", precision=args.precision,
                           kv_cache=kv, known_invariant={args.precision: True})
        session = model.session()
        for past in args.pasts:
            start = time.perf_counter()
            print(f"{kv} past {past}: block-invariant {invariant_after(session, past)} "
                  f"({time.perf_counter() - start:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
