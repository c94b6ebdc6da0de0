"""What sessions of a batching Engine should draft while many generate at once: N client threads on one
Engine(batching=True), each with its own prompt (code generation, then chat, from the shipped prompt set), under
each drafting setting in turn, interleaved over repeats. Prints aggregate tokens/s per setting (medians), and
checks that every setting writes the same tokens.

Settings: crowded0 / crowded1 / crowded2 = draft_max_sessions 2 and crowded_draft_tokens 0 / 1 / 2 (the
default is crowded0); alone-only = draft_max_sessions 1 (a session drafts only while it generates alone);
always = every session drafts its full length however many generate.

    python benchmarks/crowded_drafting.py ~/.cache/edge-specdec/bundles/qwen1.5b-int4+smollm2-135m-int8 \\
        --clients 4 --repeats 3
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import threading
import time

from edge_specdec.benchmark.prompt_set import load_prompt_set
from edge_specdec.runtime import Engine, GenerationConfig

SETTINGS = {"crowded0": (2, 0), "crowded1": (2, 1), "crowded2": (2, 2), "alone-only": (1, 0), "always": (None, 0)}


def run_clients(engine: Engine, prompts: list, config: GenerationConfig, setting: tuple) -> tuple[float, list]:
    """All prompts at once, a session and a thread each: (aggregate tokens/s, results)."""
    max_sessions, crowded = setting  # the engine's config is frozen: a new one with this setting
    engine.config = dataclasses.replace(engine.config, draft_max_sessions=max_sessions, crowded_draft_tokens=crowded)
    sessions = [engine.session() for _ in prompts]
    results: list = [None] * len(prompts)

    def client(i: int) -> None:
        results[i] = sessions[i].generate(prompts[i], config)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(prompts))]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(len(r.token_ids) for r in results) / (time.perf_counter() - start), results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("bundle")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=64)
    args = p.parse_args()
    prompt_set = load_prompt_set()
    texts = [item["text"] for category in ("code_generation", "chat") for item in prompt_set[category]]
    engine = Engine(args.bundle, target_device="CPU", draft_device="CPU", batching=True)
    prompts = [engine.chat_prompt([{"role": "user", "content": t}]) for t in texts[:args.clients]]
    config = GenerationConfig(max_new_tokens=args.max_new_tokens)
    run_clients(engine, prompts, config, SETTINGS["crowded0"])  # warm-up
    speeds: dict[str, list[float]] = {name: [] for name in SETTINGS}
    reference = None
    for repeat in range(args.repeats):
        for name, setting in SETTINGS.items():
            tokens_per_s, results = run_clients(engine, prompts, config, setting)
            ids = [r.token_ids for r in results]
            reference = reference or ids
            speeds[name].append(tokens_per_s)
            proposed = sum(r.stats.draft_tokens_proposed for r in results)
            accepted = sum(r.stats.draft_tokens_accepted for r in results)
            print(f"repeat {repeat + 1} {name:10s} {tokens_per_s:6.1f} tok/s  proposed {proposed:4d} accepted "
                  f"{accepted:4d} rounds {sum(r.stats.rounds for r in results):4d}  "
                  f"{'same tokens' if ids == reference else 'DIFFERENT TOKENS'}", flush=True)
    print("medians: " + ", ".join(f"{name} {statistics.median(v):.1f} tok/s" for name, v in speeds.items()))


if __name__ == "__main__":
    main()
