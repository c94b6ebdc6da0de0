"""Benchmark a bundle: a thin wrapper over `edge-specdec bench` (edge_specdec/benchmark/), kept for old command lines.

    python benchmarks/bench.py BUNDLE [edge-specdec bench options]      # = edge-specdec bench BUNDLE ...
    python benchmarks/bench.py --pair same   [options]   # the real same-vocabulary bundle in ~/.cache
    python benchmarks/bench.py --pair hetero [options]   # the real different-vocabulary bundle in ~/.cache

Old options still understood: --bundle DIR (= BUNDLE), --genai-exact (= --genai-ours). Everything else is
`edge-specdec bench --help`; the method and the row names are in edge_specdec/benchmark/__init__.py and
setups.py.
"""
from __future__ import annotations

import sys
from pathlib import Path

BUNDLES = Path.home() / ".cache/edge-specdec/bundles"
DEFAULT_BUNDLE = {"same": BUNDLES / "qwen1.5b-int4+qwen0.5b-int8",
                  "hetero": BUNDLES / "qwen1.5b-int4+smollm2-135m-int8"}


def translate(argv: list[str]) -> list[str]:
    """Old bench.py arguments -> `edge-specdec bench` arguments."""
    args, bundle = [], None
    it = iter(argv)
    for arg in it:
        if arg == "--pair":
            pair = next(it, "")
            if pair not in DEFAULT_BUNDLE:
                sys.exit(f"bench.py: --pair takes same or hetero, not {pair!r}")
            bundle = bundle or str(DEFAULT_BUNDLE[pair])
        elif arg == "--bundle":
            bundle = next(it, "")
        elif arg == "--genai-exact":
            args.append("--genai-ours")
        else:
            args.append(arg)
    return ([bundle] if bundle else []) + args


if __name__ == "__main__":
    from edge_specdec.cli import main

    argv = translate(sys.argv[1:])
    sys.argv = ["edge-specdec", "bench", *argv]  # the report records the command as edge-specdec bench ...
    raise SystemExit(main(["bench", *argv]))
