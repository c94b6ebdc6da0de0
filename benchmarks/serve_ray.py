"""Throughput and latency of the server as a Ray Serve deployment: 1 replica against 2 (and 1 replica with 2
slots), on one fixed set of greedy completions.

    python benchmarks/serve_ray.py [--bundle BUNDLE] [--requests 32] [--threads 8] [--tokens 64]
                                   [--configs 1x1 2x1 1x2]

Needs ray[serve] and openai beside edge-specdec[serve]. Starts a local Ray instance on 127.0.0.1 (CPUs: the
machine's), and for each REPLICASxSLOTS deploys the app, warms every slot up, then sends the requests from the
client threads (each request generates exactly --tokens tokens: ignore_eos) and reports wall time, requests and
tokens per second, p50/p99 latency (nearest rank: with 32 requests p99 is the slowest), requests per replica and
each replica's resident memory. Every output is checked against the target alone's. The replicas of one machine
share its cores: on 2 cores, 2 replicas do not add compute, they only run two engines side by side.
"""
from __future__ import annotations

import argparse
import math
import os
import socket
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

# before Ray is imported: keep the node on 127.0.0.1 (see tests/test_serve_ray.py)
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import openai  # noqa: E402
import ray  # noqa: E402
from ray import serve  # noqa: E402

from edge_specdec.demo import DEMO_BUNDLE  # noqa: E402
from edge_specdec.runtime import GenerationConfig, Pipeline  # noqa: E402
from edge_specdec.serve import ServerSettings  # noqa: E402
from edge_specdec.serve.ray_app import REPLICA_HEADER, deployment  # noqa: E402

PROMPTS = ["def parse_args(", "import numpy as np\n", "class Stack:\n    def __init__(self):", "# read a file\n",
           "def quicksort(xs):", "class LRUCache:", "import json\n\ndef load(path):", "for i in range(10):"]


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def rss_mb(replica: str) -> float:
    """Resident memory of a replica on this host, from its header host:pid."""
    host, pid = replica.rsplit(":", 1)
    if host != socket.gethostname():
        return float("nan")
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")) / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", default=None, help="default: the packaged demo pair")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--configs", nargs="+", default=["1x1", "2x1", "1x2"], help="REPLICASxSLOTS")
    a = ap.parse_args()
    bundle = a.bundle or str(DEMO_BUNDLE)
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(a.requests)]
    config = GenerationConfig(max_new_tokens=a.tokens, temperature=0, ignore_eos=True)  # + the bundle's defaults
    pipeline = Pipeline(bundle)
    reference = {p: pipeline.generate(p, config, algorithm="none").text for p in set(prompts)}
    del pipeline

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    cpus = os.cpu_count() or 2
    ray.init(address="local", num_cpus=cpus, include_dashboard=False, _node_ip_address="127.0.0.1",
             log_to_driver=False)
    rows = []
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port}, proxy_location="HeadOnly")
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", timeout=300, max_retries=0)
        for spec in a.configs:
            replicas, slots = (int(x) for x in spec.split("x"))
            loaded = time.monotonic()
            # num_cpus: the replicas must fit the instance's CPUs whatever their number (they share them anyway)
            serve.run(deployment(ServerSettings(bundle=a.bundle, slots=slots), replicas=replicas,
                                 num_cpus=min(1.0, cpus / replicas), name="bench"), name="bench")
            loaded = time.monotonic() - loaded

            def complete(prompt: str) -> tuple[float, str, str]:
                started = time.perf_counter()
                response = client.completions.with_raw_response.create(
                    model="x", prompt=prompt, max_tokens=a.tokens, temperature=0, extra_body={"ignore_eos": True})
                text = response.parse().choices[0].text
                return time.perf_counter() - started, response.headers.get(REPLICA_HEADER, ""), text

            with ThreadPoolExecutor(replicas * slots * 2) as pool:  # warm every slot of every replica up
                list(pool.map(complete, prompts[:replicas * slots * 2]))
            started = time.perf_counter()
            with ThreadPoolExecutor(a.threads) as pool:
                results = list(pool.map(complete, prompts))
            wall = time.perf_counter() - started
            latencies = [r[0] for r in results]
            served: dict[str, int] = {}
            for _, replica, _ in results:
                served[replica] = served.get(replica, 0) + 1
            exact = all(text == reference[p] for p, (_, _, text) in zip(prompts, results))
            rows.append({"config": f"{replicas} replica(s) x {slots} slot(s)", "deploy_s": loaded, "wall_s": wall,
                         "rps": a.requests / wall, "tok_s": a.requests * a.tokens / wall,
                         "p50_s": statistics.median(latencies), "p99_s": percentile(latencies, 99),
                         "served": sorted(served.values(), reverse=True),
                         "rss_mb": [round(rss_mb(r)) for r in sorted(served)], "exact": exact})
            serve.delete("bench")
    finally:
        serve.shutdown()
        ray.shutdown()

    print(f"\n{a.requests} greedy completions of {a.tokens} tokens (ignore_eos) from {a.threads} client threads; "
          f"{cpus} CPUs; bundle {bundle}")
    print("| deployment | wall s | req/s | tokens/s | p50 s | p99 s | requests per replica | RSS per replica MB "
          "| = target alone | deploy s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['config']} | {r['wall_s']:.2f} | {r['rps']:.2f} | {r['tok_s']:.0f} | {r['p50_s']:.3f} | "
              f"{r['p99_s']:.3f} | {r['served']} | {r['rss_mb']} | {r['exact']} | {r['deploy_s']:.1f} |")


if __name__ == "__main__":
    main()
