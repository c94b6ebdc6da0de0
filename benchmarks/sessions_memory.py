"""Peak RSS of a process whose engine decodes with N live sessions at once, against N = 1.

    python benchmarks/sessions_memory.py BUNDLE [--sessions 1 2 4]

Each N runs in a fresh process: one Engine, N sessions generating 32 greedy tokens each in N threads, then a
check that every output equals the target alone's. The weights are held once, so the peak should grow only by
the sessions' KV caches and buffers.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = """
import json, resource, sys, threading
from edge_specdec.runtime import Engine, GenerationConfig
engine, n = Engine(sys.argv[1]), int(sys.argv[2])
prompts = ["def quicksort(xs):", "class LRUCache:", "import json\\n\\ndef load(path):", "def parse_args("] * 4
config = GenerationConfig(max_new_tokens=32, ignore_eos=True)
sessions, out = [engine.session() for _ in range(n)], {}
threads = [threading.Thread(target=lambda i, s: out.__setitem__(i, s.generate(prompts[i], config).token_ids),
                            args=(i, s)) for i, s in enumerate(sessions)]
[t.start() for t in threads]
[t.join() for t in threads]
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
alone = engine.session()
same = all(alone.generate(prompts[i], config, algorithm="none").token_ids == out[i] for i in range(n))
print(json.dumps({"sessions": n, "peak_rss_gb": peak, "identical_to_target_alone": same}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--sessions", type=int, nargs="+", default=[1, 2, 4])
    a = ap.parse_args()
    base = None
    for n in a.sessions:
        out = subprocess.run([sys.executable, "-c", CHILD, a.bundle, str(n)], capture_output=True, text=True,
                             timeout=900)
        if out.returncode:
            raise SystemExit(out.stderr[-2000:])
        result = json.loads(out.stdout.strip().splitlines()[-1])
        base = base or result["peak_rss_gb"]
        print(f"{n} session(s): peak RSS {result['peak_rss_gb']:.3f} GB ({result['peak_rss_gb'] / base:.3f}x "
              f"one session), outputs identical to the target alone: {result['identical_to_target_alone']}")


if __name__ == "__main__":
    main()
