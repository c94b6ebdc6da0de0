"""A client that leaves while its long prompt is prefilled: how soon the server's slot is free again, and what the
next request on the same prompt reuses of what was computed.

    python benchmarks/leave_during_prefill.py BUNDLE --length 8192

Starts `edge-specdec serve BUNDLE --slots 1` on a free loopback port and sends the long-prompt suite's summary prompt
of --length tokens as a completion (its token ids), three times, 8 new tokens each, greedy:
1. streamed with return_progress, read up to the progress chunk that says the prefill's first call is done, then
   the connection is closed: the seconds until /health shows the slot free again, against the whole prefill's (3.);
2. the same prompt whole: its time to the first token and the prompt tokens it reused (cached_tokens);
3. the prompt with another first token (nothing to reuse): its time to the first token, the whole prefill.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.request
from pathlib import Path


def post_stream(url: str, body: dict):
    request = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    return urllib.request.urlopen(request, timeout=600)


def busy(url: str) -> int:
    with urllib.request.urlopen(url + "/health", timeout=30) as response:
        return json.loads(response.read())["busy"]


def first_token(url: str, ids: list[int], new: int) -> dict:
    """A streamed request: seconds to its first text chunk, and the usage chunk's cached tokens."""
    body = {"prompt": ids, "max_tokens": new, "temperature": 0, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True}, "edge_specdec": {"algorithm": "none"}}
    start, first, usage = time.perf_counter(), None, None
    with post_stream(url, body) as response:
        for line in response:
            if not line.startswith(b"data: {"):
                continue
            chunk = json.loads(line[6:])
            if first is None and chunk["choices"] and chunk["choices"][0]["text"]:
                first = time.perf_counter() - start
            usage = chunk.get("usage") or usage
    return {"ttft_s": round(first, 2), "prompt_tokens": usage["prompt_tokens"],
            "cached_tokens": usage["prompt_tokens_details"]["cached_tokens"]}


def main() -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from serve_helpers import serve_command

    from edge_specdec.benchmark.suites.long_prompts import suite_prompts
    from edge_specdec.runtime import Engine

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bundle")
    p.add_argument("--length", type=int, default=8192, help="the prompt's tokens (default 8192)")
    args = p.parse_args()
    engine = Engine(args.bundle, static_shapes=False, fixed_blocks=False, draft_pool_tokens=0)
    ids = suite_prompts(engine, [args.length], ["summarize"])[f"{args.length}/summarize"]
    other = [next(t for t in range(1000) if t != ids[0])] + ids[1:]  # nothing in common with the cache
    engine = None  # its models' memory goes before the server loads its own
    with serve_command(args.bundle, "--slots", "1") as running:
        url = running.url
        body = {"prompt": ids, "max_tokens": 8, "temperature": 0, "stream": True, "return_progress": True,
                "edge_specdec": {"algorithm": "none"}}
        start = time.perf_counter()
        response = post_stream(url, body)
        for line in response:
            if b"prompt_progress" in line:
                progress = json.loads(line[6:])["prompt_progress"]
                if progress["cache"] < progress["processed"] < progress["total"]:  # between two calls
                    break
        else:
            raise SystemExit("no progress between two calls came: is the prompt prefilled in one call?")
        first_call = time.perf_counter() - start
        response.close()  # the client leaves
        left = time.perf_counter()
        while busy(url):
            time.sleep(0.05)
        freed = time.perf_counter() - left
        again = first_token(url, ids, 8)
        whole = first_token(url, other, 8)
    print(json.dumps({"bundle": args.bundle, "prompt_tokens": len(ids),
                      "left_after": {"seconds": round(first_call, 2), "processed": progress["processed"]},
                      "slot_free_after_leaving_s": round(freed, 2), "same_prompt_again": again,
                      "whole_prefill": whole}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
