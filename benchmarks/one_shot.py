"""One-shot runs as a user types them: a fresh `edge-specdec run` process per run, the default algorithm against
the target alone, interleaved prompt by prompt.

    python benchmarks/one_shot.py BUNDLE [--prompts 6] [--repeats 1] [--max-new-tokens 128] [--warm]

Each run is `edge-specdec run BUNDLE --chat --prompt P --max-new-tokens N --ignore-eos --json` (the chat template,
greedy) with `--algorithm auto` or `--algorithm none`, on the code-generation prompts of the benchmark's prompt
set. Per run: tokens/s of the generation (the run's own statistics), the process's wall time, its load time and
its first token counted from the process's start and from the request's. Prints each pair, then the medians of
the paired ratios, and checks that both write the same tokens.

--warm then runs the same pairs in one process that stays open (the engine `run` opens, one uncounted pair
first), so the first request of a fresh process can be set against what a warm process gets on the same prompts.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

from edge_specdec.benchmark.prompt_set import load_prompt_set


def run_once(bundle: str, prompt: str, algorithm: str, max_new_tokens: int) -> dict:
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "edge_specdec.cli", "run", bundle, "--chat", "--prompt", prompt,
                          "--max-new-tokens", str(max_new_tokens), "--ignore-eos", "--algorithm", algorithm,
                          "--json"], capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - start
    if out.returncode:
        raise SystemExit(f"a run failed:\n{out.stderr[-2000:]}")
    report = json.loads(out.stdout)
    stats = report["stats"]
    return {"wall_s": wall, "tokens_per_s": stats["tokens_per_s"], "load_s": report["load_seconds"],
            "first_token_s": wall - stats["seconds"] + stats["first_token_seconds"],
            "request_first_token_s": stats["first_token_seconds"], "ids": report["token_ids"],
            "paused": stats.get("rounds_drafting_paused", 0)}


def warm_ratios(bundle: str, prompts: list[str], repeats: int, max_new_tokens: int) -> list[float]:
    """auto / none in tokens/s per pair, in one process, the engine and settings of `edge-specdec run --chat`."""
    from edge_specdec.runtime import GenerationConfig, Pipeline
    from edge_specdec.runtime.settings import SpeculativeConfig

    pipe = Pipeline(bundle, static_shapes=False)
    config = GenerationConfig(max_new_tokens=max_new_tokens, ignore_eos=True,  # with the demo's penalty, as `run`
                              repetition_penalty=pipe.default_config.repetition_penalty)
    texts = [pipe.chat_prompt([{"role": "user", "content": p}]) for p in prompts]
    for alg in ("auto", "none"):  # uncounted: each kind of call's first time
        pipe.generate(texts[0], config, SpeculativeConfig(algorithm=alg))
    ratios = []
    for repeat in range(repeats):
        for i, text in enumerate(texts):
            order = ("auto", "none") if (i + repeat) % 2 == 0 else ("none", "auto")
            got = {alg: pipe.generate(text, config, SpeculativeConfig(algorithm=alg)) for alg in order}
            ratios.append(got["auto"].stats.tokens_per_s / got["none"].stats.tokens_per_s)
            same = got["auto"].token_ids == got["none"].token_ids
            print(f"warm, prompt {i + 1}: {ratios[-1]:.2f}x tok/s, identical: {same}", flush=True)
    return ratios


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--warm", action="store_true", help="then the same pairs in one warm process")
    a = ap.parse_args()
    prompts = [p["text"] for p in load_prompt_set()["code_generation"]][:a.prompts]
    run_once(a.bundle, prompts[0], "none", 8)  # an uncounted run: the OS's file cache and the plan warm
    speed, wall, same = [], [], 0
    rows = []
    for repeat in range(a.repeats):
        for i, prompt in enumerate(prompts):
            order = ("auto", "none") if (i + repeat) % 2 == 0 else ("none", "auto")
            got = {alg: run_once(a.bundle, prompt, alg, a.max_new_tokens) for alg in order}
            drafted, alone = got["auto"], got["none"]
            speed.append(drafted["tokens_per_s"] / alone["tokens_per_s"])
            wall.append(alone["wall_s"] / drafted["wall_s"])
            same += drafted["ids"] == alone["ids"]
            rows.append((drafted, alone))
            print(f"prompt {i + 1}: auto {drafted['tokens_per_s']:.1f} tok/s, wall {drafted['wall_s']:.1f} s, load "
                  f"{drafted['load_s']:.1f} s, first token {drafted['first_token_s']:.2f} s (paused "
                  f"{drafted['paused']} rounds) | none {alone['tokens_per_s']:.1f} tok/s, wall "
                  f"{alone['wall_s']:.1f} s, first token {alone['first_token_s']:.2f} s | {speed[-1]:.2f}x tok/s, "
                  f"{wall[-1]:.2f}x wall",
                  flush=True)
    print(f"\nmedian of {len(speed)} paired runs: auto {statistics.median(speed):.2f}x the target alone in tokens/s, "
          f"{statistics.median(wall):.2f}x in wall time; load {statistics.median(r[0]['load_s'] for r in rows):.1f} s; "
          f"first token {statistics.median(r[0]['first_token_s'] for r in rows):.2f} s from the process's start, "
          f"{statistics.median(r[0]['request_first_token_s'] for r in rows):.2f} s from the request's; "
          f"identical {same}/{len(speed)}")
    if a.warm:
        warm = warm_ratios(a.bundle, prompts, a.repeats, a.max_new_tokens)
        print(f"median of {len(warm)} pairs in one warm process: auto {statistics.median(warm):.2f}x the target "
              f"alone in tokens/s (fresh processes: {statistics.median(speed):.2f}x)")


if __name__ == "__main__":
    main()
