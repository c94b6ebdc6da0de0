"""What verifying a bundle's checksums at every load adds to start-up: fresh processes, caches warm.

    python benchmarks/verify_load.py BUNDLE [--runs 3]

Rows, interleaved run by run after one uncounted warm-up round of each: our Pipeline on the bundle as
`edge-specdec run` opens it with the checksums verified (the default: hashed in a thread while the models compile,
bundle.start_verification) and with verify_checksums=False (sizes only, `--no-verify`). Each run is a new process
that loads the bundle; it reports Engine.load_seconds. Also prints, once, how long hashing every file takes alone
(one thread, nothing else running in the process). Prints each run as it finishes, then the medians and their
ratio.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

LOAD = """
import json, sys
from edge_specdec.runtime import Pipeline
pipe = Pipeline(sys.argv[1], verify_checksums=sys.argv[2] == "1", static_shapes=False)
print(json.dumps({"load_s": pipe.load_seconds}))
"""


def load_seconds(bundle: str, verify: bool) -> float:
    out = subprocess.run([sys.executable, "-c", LOAD, bundle, "1" if verify else "0"], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["load_s"]


def hash_seconds(bundle: str) -> float:
    from edge_specdec.bundle import _hash_files, load_bundle

    b = load_bundle(bundle, verify=False)
    start = time.perf_counter()
    _hash_files(Path(bundle), b.manifest["files"])
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    rows = {"verified": True, "--no-verify": False}
    for name, verify in rows.items():  # warm-up: page cache and compiled-model cache
        print(f"warm-up {name}: {load_seconds(args.bundle, verify):.2f} s", flush=True)
    print(f"hashing every file alone: {hash_seconds(args.bundle):.2f} s", flush=True)
    times: dict[str, list[float]] = {name: [] for name in rows}
    for run in range(args.runs):
        for name, verify in rows.items():
            times[name].append(load_seconds(args.bundle, verify))
            print(f"run {run + 1} {name}: {times[name][-1]:.2f} s", flush=True)
    med = {name: statistics.median(t) for name, t in times.items()}
    for name, m in med.items():
        print(f"{name}: median load {m:.2f} s ({', '.join(f'{t:.2f}' for t in times[name])})")
    print(f"verified / --no-verify: {med['verified'] / med['--no-verify']:.3f}x "
          f"(+{med['verified'] - med['--no-verify']:.2f} s)")


if __name__ == "__main__":
    main()
