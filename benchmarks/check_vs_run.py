"""`edge-specdec check`'s prediction against what `edge-specdec run --compare` measures, on the same machine.

    python benchmarks/check_vs_run.py BUNDLE [--runs 3] [--max-new-tokens 128]

Runs `check BUNDLE --json` once, then `run BUNDLE --prompt P --max-new-tokens N --compare --json` `--runs` times
for each of check's prompts (fresh processes, the default algorithm with its guard, against the target alone
in the same process), and prints check's predicted speedup, the median measured one (time per output token and
tokens/s), and their ratio.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

from edge_specdec.check import PROMPTS


def cli(*args: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "edge_specdec.cli", *args], capture_output=True, text=True,
                         timeout=1800)
    if out.returncode:
        raise SystemExit(f"edge-specdec {' '.join(args)} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    a = ap.parse_args()
    report = cli("check", a.bundle, "--json")
    prediction = report["prediction"]
    print(f"check: {prediction['algorithm']}, predicted {prediction['predicted_speedup']:.2f}x "
          f"(the step-cost ideal {prediction['ideal_speedup']:.2f}x), acceptance {prediction['acceptance']:.2f}")
    tpot, speed, paused = [], [], []
    for _ in range(a.runs):
        for prompt in PROMPTS:
            run = cli("run", a.bundle, "--prompt", prompt, "--max-new-tokens", str(a.max_new_tokens),
                      "--ignore-eos", "--compare", "--json")
            compare = run["compare"]
            tpot.append(compare["target_alone_time_per_output_token_ms"] / run["stats"]["time_per_output_token_ms"])
            speed.append(compare["speedup"])
            paused.append(run["stats"]["rounds_drafting_paused"])
            print(f"  run --compare {prompt!r}: {speed[-1]:.2f}x tokens/s, {tpot[-1]:.2f}x per output token, "
                  f"drafting paused {paused[-1]} rounds, identical: {compare['identical']}", flush=True)
    measured = statistics.median(tpot)
    print(f"\nmeasured (median of {len(tpot)}): {measured:.2f}x per output token, {statistics.median(speed):.2f}x "
          f"tokens/s; check predicted {prediction['predicted_speedup']:.2f}x: prediction / measurement "
          f"{prediction['predicted_speedup'] / measured:.2f}")


if __name__ == "__main__":
    main()
