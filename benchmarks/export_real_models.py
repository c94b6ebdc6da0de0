"""Export the real model pairs from ../shared/real-models and report time, peak memory, size and overlap.

    python benchmarks/export_real_models.py [--models DIR] [--out DIR] [--only NAME]

DIR defaults: $EDGE_SPECDEC_REAL_MODELS/hf (else ~/.cache/edge-specdec/real-models/hf) and
~/.cache/edge-specdec/bundles. Each export runs in its own process so that its peak memory is its own.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

PAIRS = {
    # name: (target, draft, extra export arguments)
    "qwen1.5b-int4+smollm2-135m-int8": ("qwen2.5-coder-1.5b-instruct", "smollm2-135m-instruct", {}),
    "qwen1.5b-int4+qwen0.5b-int8": ("qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct", {}),
}

_CHILD = """
import json, resource, sys, time
from edge_specdec.export import export_bundle
from edge_specdec.bundle import load_bundle
t = time.monotonic()
export_bundle(sys.argv[1], sys.argv[2], sys.argv[3], force=True, progress=lambda m: print(m, file=sys.stderr))
seconds = time.monotonic() - t
b = load_bundle(sys.argv[3])
size = sum(r["size"] for r in b.manifest["files"].values())
print(json.dumps({"seconds": round(seconds, 1), "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
                  "bundle_mb": round(size / 1e6, 1), "vocabulary": b.vocabulary,
                  "target_mb": round(b.target.info["size_bytes"] / 1e6, 1), "draft_mb": round(b.draft.info["size_bytes"] / 1e6, 1)}))
"""


def main() -> int:
    default_models = Path(os.environ.get("EDGE_SPECDEC_REAL_MODELS", Path.home() / ".cache/edge-specdec/real-models"))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", type=Path, default=default_models / "hf")
    parser.add_argument("--out", type=Path, default=Path.home() / ".cache/edge-specdec/bundles")
    parser.add_argument("--only", choices=sorted(PAIRS))
    args = parser.parse_args()
    rows = []
    for name, (target, draft, _extra) in PAIRS.items():
        if args.only and name != args.only:
            continue
        for model in (target, draft):
            if not (args.models / model / "config.json").is_file():
                sys.exit(f"{args.models / model} is missing: run ../shared/real-models/get-real-models.sh first")
        print(f"== exporting {name}", file=sys.stderr, flush=True)
        proc = subprocess.run([sys.executable, "-c", _CHILD, str(args.models / target), str(args.models / draft),
                               str(args.out / name)], stdout=subprocess.PIPE, text=True)
        if proc.returncode != 0:
            sys.exit(f"export of {name} failed (exit {proc.returncode})")
        rows.append((name, json.loads(proc.stdout.strip().splitlines()[-1])))
    print("| pair | export s | peak RSS GiB | bundle MB (target / draft) | relation | shared tokens | "
          "share of target / draft vocab |")
    print("|---|---|---|---|---|---|---|")
    for name, r in rows:
        v = r["vocabulary"]
        print(f"| {name} | {r['seconds']} | {r['peak_rss_gib']} | {r['bundle_mb']} ({r['target_mb']} / {r['draft_mb']}) "
              f"| {v['relation']} | {v['intersection']} | {100 * v['target_share']:.1f}% / {100 * v['draft_share']:.1f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
