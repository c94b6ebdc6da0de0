"""Start-up side by side: fresh processes, compiled-model caches warm, time to the first token and peak RSS.

    python benchmarks/startup.py HETEROGENEOUS_BUNDLE [--genai SAME_VOCAB_BUNDLE] [--ours-path OLD_CHECKOUT]
        [--cli] [--no-warm-up] [--runs 3]

Rows, interleaved run by run after one uncounted warm-up round: our Pipeline on the bundle (SLEM, the default
for it), `edge-specdec run` on it as a user types it (--cli: the CLI's own settings, no static copies), the
same Pipeline from another checkout (--ours-path, to compare before and after a change), and OpenVINO
GenAI's LLMPipeline on a same-vocabulary bundle's target alone and with its draft (--genai; GenAI refuses a
draft of another vocabulary). Each run is a new process that loads the bundle and generates 8 tokens of
"def quicksort(xs):"; it reports seconds to load, seconds from its start and from the request's to the first
token, its peak RSS, and the process's whole wall time to its exit (what a one-shot user waits). --no-warm-up
adds a row of ours whose load does not run the models once (EngineConfig.warm_up), which leaves OpenVINO's
preparation on the first inference to the request.
Prints each run as it finishes, then the medians.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

PROMPT = "def quicksort(xs):"

OURS = """
import json, resource, sys, time
T0 = time.perf_counter()
from edge_specdec.runtime import GenerationConfig, Pipeline
pipe = Pipeline(sys.argv[1], **({"warm_up": False} if sys.argv[3:] == ["no-warm-up"] else {}))
load = time.perf_counter() - T0
first = []
pipe.generate(sys.argv[2], GenerationConfig(max_new_tokens=8, ignore_eos=True),
              on_text=lambda t: first or first.append(time.perf_counter() - T0))
print(json.dumps({"load_s": load, "first_token_s": first[0], "request_first_token_s": first[0] - load,
                  "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}))
"""

CLI = """
import contextlib, io, json, resource, sys, time
T0 = time.perf_counter()
from edge_specdec.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    main(["run", sys.argv[1], "--prompt", sys.argv[2], "--max-new-tokens", "8", "--ignore-eos", "--json"])
end = time.perf_counter() - T0
report = json.loads(out.getvalue())
stats = report["stats"]
first = end - stats["seconds"] + stats["first_token_seconds"]
print(json.dumps({"load_s": report["load_seconds"], "first_token_s": first,
                  "request_first_token_s": stats["first_token_seconds"],
                  "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}))
"""

GENAI = """
import json, os, resource, sys, time
T0 = time.perf_counter()
import openvino_genai as og
folder, with_draft = sys.argv[1], sys.argv[3] == "1"
cache = os.path.join(os.path.expanduser("~"), ".cache", "edge-specdec", "genai-cache")
extra = {"draft_model": og.draft_model(folder + "/draft", "CPU", CACHE_DIR=cache)} if with_draft else {}
pipe = og.LLMPipeline(folder + "/target", "CPU", CACHE_DIR=cache, **extra)
load = time.perf_counter() - T0
config = og.GenerationConfig(max_new_tokens=8)
if with_draft:
    config.num_assistant_tokens = 3
first = []
pipe.generate(sys.argv[2], config, lambda t: bool(first or first.append(time.perf_counter() - T0)))
print(json.dumps({"load_s": load, "first_token_s": first[0], "request_first_token_s": first[0] - load,
                  "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}))
"""


def run_once(code: str, args: list[str], pythonpath: str | None = None) -> dict:
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=600,
                         cwd=os.path.expanduser("~"))
    wall = time.perf_counter() - start
    if out.returncode:
        raise SystemExit(f"a start-up run failed:\n{out.stderr[-2000:]}")
    return {**json.loads(out.stdout.strip().splitlines()[-1]), "process_wall_s": wall}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle", help="a bundle for our rows")
    ap.add_argument("--genai", metavar="BUNDLE", help="a same-vocabulary bundle for GenAI's rows")
    ap.add_argument("--ours-path", metavar="DIR", help="another checkout of edge-specdec for a second row of ours")
    ap.add_argument("--no-warm-up", action="store_true",
                    help="add a row of ours with EngineConfig.warm_up off (the first inference in the request)")
    ap.add_argument("--cli", action="store_true", help="add a row of `edge-specdec run` on the bundle")
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    a.bundle = os.path.abspath(a.bundle)  # the runs start in the home folder
    a.genai = a.genai and os.path.abspath(a.genai)
    rows = {"ours": (OURS, [a.bundle, PROMPT], None)}
    if a.cli:
        rows["ours, `edge-specdec run`"] = (CLI, [a.bundle, PROMPT], None)
    if a.no_warm_up:
        rows["ours, warm_up=False"] = (OURS, [a.bundle, PROMPT, "no-warm-up"], None)
    if a.ours_path:
        rows["ours (--ours-path)"] = (OURS, [a.bundle, PROMPT], a.ours_path)
    if a.genai:
        rows["GenAI, target alone"] = (GENAI, [a.genai, PROMPT, "0"], None)
        rows["GenAI, with its draft"] = (GENAI, [a.genai, PROMPT, "1"], None)
    measured: dict[str, list[dict]] = {name: [] for name in rows}
    for run in range(a.runs + 1):  # run 0 warms the caches and is not counted
        for name, (code, args, path) in rows.items():
            result = run_once(code, args, path)
            print(f"run {run}{' (warm-up)' if run == 0 else ''}: {name}: {json.dumps(result)}", flush=True)
            if run:
                measured[name].append(result)
    print(f"\nmedians of {a.runs} runs:\n| row | load s | first token s | first token s from the request | peak RSS "
          "GB | process wall s |\n|---|---|---|---|---|---|")
    for name, results in measured.items():
        med = {k: statistics.median(r[k] for r in results)
               for k in ("load_s", "first_token_s", "request_first_token_s", "peak_rss_gb", "process_wall_s")}
        print(f"| {name} | {med['load_s']:.2f} | {med['first_token_s']:.2f} | {med['request_first_token_s']:.2f} | "
              f"{med['peak_rss_gb']:.2f} | {med['process_wall_s']:.2f} |")


if __name__ == "__main__":
    main()
