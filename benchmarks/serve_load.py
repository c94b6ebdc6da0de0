"""A bounded load test of `edge-specdec serve`: a fixed number of greedy requests from concurrent clients on
loopback, every output checked against the target alone, latency percentiles printed.

    python benchmarks/serve_load.py                      # the demo: 200 requests, 8 clients, 2 slots
    python benchmarks/serve_load.py --requests 400 --clients 16 --slots 4 --max-tokens 64
    python benchmarks/serve_load.py --bundle BUNDLE --paired 2 --prompts 6 --max-tokens 128   # speedup via HTTP

It starts `edge-specdec serve` as a process on a free loopback port, computes each prompt's reference with the
target alone (`algorithm="none"`, in this process), sends the requests (half streamed, half not, through OpenAI's
client) and stops the server. It fails (exit 1) if any request is lost, errs or differs from its reference.
tests/test_serve_load.py runs `run_load` on the same prompts.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

# Python openings for the demo's code model: each a different continuation
PROMPTS = ["def parse_args(", "import os\n", "class Config:", "def main():\n", "for i in range(", "with open(",
           "try:\n    ", "def __init__(self, ", "return ", "if __name__ == ", "raise ValueError(", "import sys\n",
           "def read_file(path):", "class Node:\n    def ", "while True:\n", "x = [", "print(", "@property\ndef ",
           "self.", "from collections import "]


@dataclass
class LoadReport:
    requests: int
    clients: int
    wrong: list[str] = field(default_factory=list)  # what differed, failed or went missing
    latencies: list[float] = field(default_factory=list)  # seconds per request, in completion order
    tokens: int = 0
    seconds: float = 0.0

    def percentile(self, q: float) -> float:
        xs = sorted(self.latencies)
        return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else float("nan")

    def summary(self) -> dict:
        return {"requests": self.requests, "clients": self.clients, "completed": len(self.latencies),
                "wrong": len(self.wrong), "p50_s": round(self.percentile(0.5), 3),
                "p99_s": round(self.percentile(0.99), 3), "mean_s": round(statistics.fmean(self.latencies), 3)
                if self.latencies else None, "requests_per_s": round(len(self.latencies) / self.seconds, 2),
                "tokens_per_s": round(self.tokens / self.seconds, 1), "seconds": round(self.seconds, 2)}


def run_load(api: str, references: dict[str, str], requests: int, clients: int, max_tokens: int) -> LoadReport:
    """Send `requests` greedy completions (prompts in turn, every other one streamed) from `clients` threads;
    each answer must equal references[prompt]."""
    import openai

    client = openai.OpenAI(base_url=api, api_key="none", max_retries=0, timeout=300)
    prompts = list(references)
    report, lock = LoadReport(requests, clients), threading.Lock()

    def one(i: int) -> None:
        prompt, stream = prompts[i % len(prompts)], i % 2 == 1
        options = dict(model="demo", prompt=prompt, max_tokens=max_tokens, temperature=0, seed=i)
        start = time.perf_counter()
        try:
            if stream:
                chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True},
                                                        **options))
                text = "".join(c.choices[0].text for c in chunks if c.choices)
                tokens = chunks[-1].usage.completion_tokens
            else:
                answer = client.completions.create(**options)
                text, tokens = answer.choices[0].text, answer.usage.completion_tokens
        except Exception as exc:  # counted as wrong, the load goes on
            with lock:
                report.wrong.append(f"request {i}: {type(exc).__name__}: {exc}")
            return
        elapsed = time.perf_counter() - start
        with lock:
            report.latencies.append(elapsed)
            report.tokens += tokens
            if text != references[prompt]:
                report.wrong.append(f"request {i} ({prompt!r}, {'streamed' if stream else 'whole'}): {text!r} "
                                    f"!= {references[prompt]!r}")

    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(one, range(requests)))
    report.seconds = time.perf_counter() - start
    missing = requests - len(report.latencies) - len(report.wrong)
    if missing:
        report.wrong.append(f"{missing} requests neither answered nor failed")
    return report


def paired_speedup(api: str, prompts: list[str], max_tokens: int, repeats: int) -> dict:
    """One client, each prompt sent twice back to back, once with the target alone (edge_specdec.algorithm none)
    and once with the server's default, in alternating order: the ratio of their latencies per pair, and
    whether the two texts are identical."""
    import openai

    client = openai.OpenAI(base_url=api, api_key="none", max_retries=0, timeout=600)
    ratios, identical, runs = [], 0, {"none": [], "auto": []}
    for r in range(repeats):
        for i, prompt in enumerate(prompts):
            texts, seconds = {}, {}
            for algorithm in (("none", "auto") if (r + i) % 2 == 0 else ("auto", "none")):
                start = time.perf_counter()
                answer = client.completions.create(model="m", prompt=prompt, max_tokens=max_tokens, temperature=0,
                                                   extra_body={"edge_specdec": {"algorithm": algorithm}})
                seconds[algorithm] = time.perf_counter() - start
                texts[algorithm] = answer.choices[0].text
                runs[algorithm].append(answer.model_extra["edge_specdec"])
            ratios.append(seconds["none"] / seconds["auto"])
            identical += texts["none"] == texts["auto"]
    auto = runs["auto"]
    return {"pairs": len(ratios), "identical": identical, "median_speedup": round(statistics.median(ratios), 3),
            "speedup_range": [round(min(ratios), 3), round(max(ratios), 3)],
            "algorithm": auto[0]["algorithm"],
            "median_tokens_per_target_pass": statistics.median(a["mean_tokens_per_target_pass"] for a in auto),
            "median_tokens_per_s": {k: round(statistics.median(a["tokens_per_s"] for a in v), 2)
                                    for k, v in runs.items()}}


def main() -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from serve_helpers import serve_command

    from edge_specdec.demo import DEMO_BUNDLE
    from edge_specdec.runtime import GenerationConfig, Pipeline

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bundle", default=str(DEMO_BUNDLE))
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--slots", type=int, default=2)
    p.add_argument("--queue", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--no-batching", action="store_true", help="serve with --no-batching (each slot verifies alone)")
    p.add_argument("--draft-max-sessions", type=int, metavar="N", help="serve with --draft-max-sessions N")
    p.add_argument("--json", metavar="FILE", help="also write the summary here")
    p.add_argument("--paired", type=int, metavar="REPEATS",
                   help="instead of the load: one client sends each of --prompts twice (the target alone, then the "
                        "default algorithm, in alternating order), REPEATS times: the speedup through the server")
    p.add_argument("--prompts", type=int, default=len(PROMPTS), metavar="N", help="use the first N prompts")
    args = p.parse_args()
    prompts = PROMPTS[:args.prompts]
    if args.paired:
        with serve_command(args.bundle, "--slots", "1") as running:
            summary = paired_speedup(running.api, prompts, args.max_tokens, args.paired)
        print(json.dumps({**summary, "max_tokens": args.max_tokens, "bundle": args.bundle}, indent=1))
        return 0 if summary["identical"] == summary["pairs"] else 1

    pipe = Pipeline(args.bundle)
    # the fields left unset take the bundle's defaults (the demo's repetition penalty), as the server applies them
    config = GenerationConfig(max_new_tokens=args.max_tokens, temperature=0)
    refs = {prompt: pipe.generate(prompt, config, algorithm="none").text for prompt in prompts}
    pipe = None  # its models' memory goes before the server loads its own
    batching = (["--no-batching"] if args.no_batching else []) + (
        ["--draft-max-sessions", str(args.draft_max_sessions)] if args.draft_max_sessions is not None else [])
    with serve_command(args.bundle, "--slots", str(args.slots), "--queue", str(args.queue), *batching) as running:
        report = run_load(running.api, refs, args.requests, args.clients, args.max_tokens)
    summary = {**report.summary(), "slots": args.slots, "batching": not args.no_batching and args.slots > 1,
               "draft_max_sessions": args.draft_max_sessions,
               "max_tokens": args.max_tokens, "bundle": args.bundle}
    print(json.dumps(summary, indent=1))
    for line in report.wrong[:10]:
        print("WRONG:", line, file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
    return 1 if report.wrong else 0


if __name__ == "__main__":
    sys.exit(main())
