"""Benchmark a same-vocabulary bundle: our decoders against OpenVINO GenAI, side by side and interleaved.

    python benchmarks/bench_same_vocab.py [--bundle DIR] [--max-new-tokens 64] [--repeats 2] [--no-genai]

Setups (all greedy, same chat-formatted code prompts, same max_new_tokens):
  ours none         Pipeline.generate(..., algorithm="none")             the target alone
  ours standard K   algorithm="standard", num_assistant_tokens=K         K in --ks (default 3 and 5), adaptive=False
  ours pld 5        algorithm="prompt-lookup", num_assistant_tokens=5
  genai none        openvino_genai.LLMPipeline(bundle/target)
  genai sd K        LLMPipeline(bundle/target, draft_model=draft_model(bundle/draft)), num_assistant_tokens=K

One Pipeline serves all our rows. Every setup gets one uncounted warm-up run, then for each (prompt, repeat)
all setups run back to back (the order rotates with the repeat) so that drift in machine speed hits them
alike. Reported per setup: median tokens/s, median acceptance, mean tokens per target pass, the summed
draft / target / loop seconds, the ratio to target-only, and whether the output equals our target-only
output for the same prompt (token ids for our rows, text for GenAI rows; greedy decoding must not change it).
"""
from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from edge_specdec.runtime import GenerationConfig, Pipeline

DEFAULT_BUNDLE = Path.home() / ".cache/edge-specdec/bundles/qwen1.5b-int4+qwen0.5b-int8"
SYSTEM = "You are a helpful coding assistant."
TASKS = (
    "Write a Python function that checks whether a string is a palindrome.",
    "Write a Python function that does binary search on a sorted list and returns the index or -1.",
    "Write a Python function that merges two sorted lists into one sorted list.",
)


def chat(user: str) -> str:
    """The Qwen chat template, by hand, so that every engine sees exactly the same prompt text."""
    return (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n"
            f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n")


@dataclass
class Run:
    """One timed generation, engine-neutral."""
    text: str
    new_tokens: int
    wall_seconds: float
    token_ids: Optional[list[int]] = None  # ours only
    stats: dict = field(default_factory=dict)  # ours: Stats.as_dict(); GenAI: what its metrics give

    @property
    def tokens_per_s(self) -> float:
        """Ours: the pipeline's own figure (decode loop incl. prefill). GenAI: tokens / wall seconds."""
        if "tokens_per_s" in self.stats:
            return self.stats["tokens_per_s"]
        return self.wall_tokens_per_s

    @property
    def wall_tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_seconds if self.wall_seconds else 0.0


@dataclass
class Setup:
    name: str
    engine: str  # "ours" or "genai"
    run: Callable[[str], Run]
    runs: dict = field(default_factory=dict)  # prompt index -> list[Run]


def ours(pipe: Pipeline, n: int, algorithm: str, k: int = 5) -> Callable[[str], Run]:
    def run(prompt: str) -> Run:
        t = time.perf_counter()
        r = pipe.generate(prompt, GenerationConfig(max_new_tokens=n), algorithm=algorithm,
                          num_assistant_tokens=k, adaptive=False)
        wall = time.perf_counter() - t
        return Run(r.text, len(r.token_ids), wall, list(r.token_ids), r.stats.as_dict())
    return run


def genai(pipe, n: int, k: Optional[int]) -> Callable[[str], Run]:
    import openvino_genai

    config = openvino_genai.GenerationConfig()
    config.max_new_tokens = n
    config.do_sample = False
    config.apply_chat_template = False  # the prompt is already chat-formatted
    if k is not None:
        config.num_assistant_tokens = k

    def run(prompt: str) -> Run:
        t = time.perf_counter()
        r = pipe.generate([prompt], config)
        wall = time.perf_counter() - t
        pm = r.perf_metrics
        stats = {"new_tokens": pm.get_num_generated_tokens(),
                 "ttft_ms": pm.get_ttft().mean, "tpot_ms": pm.get_tpot().mean}
        ext = getattr(r, "extended_perf_metrics", None)
        if ext is not None and hasattr(ext, "get_num_accepted_tokens"):
            stats["draft_tokens_accepted"] = ext.get_num_accepted_tokens()
        return Run(r.texts[0], pm.get_num_generated_tokens(), wall, None, stats)
    return run


def build_setups(args) -> tuple[Pipeline, list[Setup]]:
    print(f"loading our Pipeline from {args.bundle} ...", flush=True)
    t = time.perf_counter()
    pipe = Pipeline(args.bundle)
    print(f"  loaded in {time.perf_counter() - t:.1f} s", flush=True)
    n = args.max_new_tokens
    setups = [Setup("ours none", "ours", ours(pipe, n, "none"))]
    setups += [Setup(f"ours standard K={k}", "ours", ours(pipe, n, "standard", k)) for k in args.ks]
    setups.append(Setup("ours prompt-lookup K=5", "ours", ours(pipe, n, "prompt-lookup", 5)))
    if args.no_genai:
        return pipe, setups
    try:
        import openvino_genai
    except ImportError as e:
        print(f"openvino_genai not importable ({e}); skipping the GenAI rows", flush=True)
        return pipe, setups
    target, draft = str(args.bundle / "target"), str(args.bundle / "draft")
    try:
        t = time.perf_counter()
        alone = openvino_genai.LLMPipeline(target, "CPU")
        # the speculative pipeline runs on GenAI's continuous-batching backend, whose prefix cache would let a
        # run reuse the previous run's prompt KV; switch it off so that every run pays its own prefill
        scheduler = openvino_genai.SchedulerConfig()
        scheduler.enable_prefix_caching = False
        spec = openvino_genai.LLMPipeline(target, "CPU", draft_model=openvino_genai.draft_model(draft, "CPU"),
                                          scheduler_config=scheduler)
        print(f"  GenAI {openvino_genai.__version__} pipelines loaded in {time.perf_counter() - t:.1f} s", flush=True)
    except Exception as e:  # report exactly what GenAI says about the folders, then go on without it
        print(f"GenAI could not load the bundle folders: {type(e).__name__}: {e}; skipping the GenAI rows", flush=True)
        return pipe, setups
    setups.append(Setup("genai none", "genai", genai(alone, n, None)))
    setups += [Setup(f"genai sd K={k}", "genai", genai(spec, n, k)) for k in args.ks]
    return pipe, setups


def measure_prefill(pipe: Pipeline, prompts: list[str], repeats: int) -> float:
    """Median seconds of a max_new_tokens=1 run of the target alone: one target pass over the prompt (prefill)."""
    times = []
    for _ in range(repeats):
        for p in prompts:
            r = pipe.generate(p, GenerationConfig(max_new_tokens=1), algorithm="none")
            times.append(r.stats.target_seconds)
    return statistics.median(times)


def median(xs) -> float:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else float("nan")


def summarize(setups: list[Setup], prompts: list[str]) -> list[dict]:
    base_ours = setups[0]
    rows = []
    for s in setups:
        runs = [r for rs in s.runs.values() for r in rs]
        row = {"setup": s.name, "engine": s.engine, "runs": len(runs),
               "tps": median(r.tokens_per_s for r in runs),
               "wall_tps": median(r.wall_tokens_per_s for r in runs),
               "new_tokens": sum(r.new_tokens for r in runs)}
        if s.engine == "ours":
            st = [r.stats for r in runs]
            passes = sum(x["target_passes"] for x in st)
            proposed = sum(x["draft_tokens_proposed"] for x in st)
            row.update(acceptance=median(x["acceptance"] for x in st) if proposed else None,
                       tokens_per_pass=sum(x["new_tokens"] for x in st) / passes,
                       draft_s=sum(x["draft_seconds"] for x in st), target_s=sum(x["target_seconds"] for x in st),
                       loop_s=sum(x["loop_seconds"] for x in st), target_passes=passes, draft_proposed=proposed)
        else:
            accepted = [r.stats.get("draft_tokens_accepted") for r in runs]
            row["genai_accepted_per_run"] = median(accepted) if any(a is not None for a in accepted) else None
            row["ttft_ms"] = median(r.stats["ttft_ms"] for r in runs)
            row["tpot_ms"] = median(r.stats["tpot_ms"] for r in runs)
        # equality against our target-only output, prompt by prompt and repeat by repeat
        mismatches = []
        for i in range(len(prompts)):
            ref = base_ours.runs[i][0]
            for j, r in enumerate(s.runs.get(i, [])):
                same = r.token_ids == ref.token_ids if s.engine == "ours" else r.text == ref.text
                if not same:
                    mismatches.append((i, j, r))
        row["mismatches"] = mismatches
        rows.append(row)
    ours_none = rows[0]["tps"]
    genai_none = next((r["tps"] for r in rows if r["setup"] == "genai none"), None)
    for row in rows:
        row["vs_ours_none"] = row["tps"] / ours_none
        if row["engine"] == "genai" and genai_none:
            row["vs_genai_none"] = row["tps"] / genai_none
    return rows


def first_difference(a: list, b: list) -> int:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def report(rows: list[dict], setups: list[Setup], prompts: list[str], prefill_s: float) -> None:
    base = setups[0]
    print("\n=== per setup ===")
    for row in rows:
        print(f"\n[{row['setup']}] runs={row['runs']} median tok/s={row['tps']:.2f} "
              f"(wall {row['wall_tps']:.2f}) ratio vs ours none={row['vs_ours_none']:.2f}x")
        if row["engine"] == "ours":
            acc = "n/a" if row["acceptance"] is None else f"{row['acceptance']:.3f}"
            print(f"  median acceptance={acc} mean tokens/target pass={row['tokens_per_pass']:.2f} "
                  f"time split: draft {row['draft_s']:.2f} s, target {row['target_s']:.2f} s, "
                  f"loop {row['loop_s']:.2f} s")
        else:
            print(f"  ratio vs genai none={row.get('vs_genai_none', float('nan')):.2f}x "
                  f"median TTFT={row['ttft_ms']:.0f} ms TPOT={row['tpot_ms']:.1f} ms"
                  + (f" median accepted draft tokens/run={row['genai_accepted_per_run']}"
                     if row.get("genai_accepted_per_run") is not None else ""))
        what = "token_ids" if row["engine"] == "ours" else "text"
        if not row["mismatches"]:
            print(f"  {what} identical to ours none on every prompt and repeat: yes")
        for i, j, r in row["mismatches"]:
            ref = base.runs[i][0]
            if row["engine"] == "ours":
                d = first_difference(r.token_ids, ref.token_ids)
                print(f"  MISMATCH prompt {i} repeat {j}: first differing token at {d}: "
                      f"{r.token_ids[d:d + 5]} vs {ref.token_ids[d:d + 5]} (lengths {len(r.token_ids)} vs "
                      f"{len(ref.token_ids)})")
            else:
                d = first_difference(r.text, ref.text)
                print(f"  MISMATCH prompt {i} repeat {j}: first differing char at {d}: "
                      f"{r.text[d:d + 40]!r} vs ours {ref.text[d:d + 40]!r} (lengths {len(r.text)} vs {len(ref.text)})")

    print("\n=== unit costs (ours, summed over timed runs) ===")
    for row in rows:
        if row["engine"] != "ours" or not (row["setup"] == "ours none" or "standard" in row["setup"]):
            continue
        per_pass = row["target_s"] / row["target_passes"]
        runs = row["runs"]
        decode_pass = (row["target_s"] - runs * prefill_s) / (row["target_passes"] - runs)
        line = (f"[{row['setup']}] target pass: {per_pass * 1000:.1f} ms incl. prefill, "
                f"~{decode_pass * 1000:.1f} ms excl. prefill")
        if row["draft_proposed"]:
            line += f"; draft token: {row['draft_s'] / row['draft_proposed'] * 1000:.1f} ms"
        print(line)
    print(f"(prefill = one target pass over the prompt, median {prefill_s * 1000:.0f} ms, measured separately)")

    print("\n=== table ===\n")
    print("| setup | tok/s (median) | wall tok/s | vs ours none | vs genai none | acceptance | tokens/target pass "
          "| draft s | target s | loop s | same output as ours none |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        ours_row = row["engine"] == "ours"
        acc = row.get("acceptance")
        cells = [row["setup"], f"{row['tps']:.2f}", f"{row['wall_tps']:.2f}", f"{row['vs_ours_none']:.2f}x",
                 f"{row['vs_genai_none']:.2f}x" if "vs_genai_none" in row else "-",
                 f"{acc:.3f}" if acc is not None else "-",
                 f"{row['tokens_per_pass']:.2f}" if ours_row else "-",
                 f"{row['draft_s']:.1f}" if ours_row else "-",
                 f"{row['target_s']:.1f}" if ours_row else "-",
                 f"{row['loop_s']:.2f}" if ours_row else "-",
                 "yes" if not row["mismatches"] else f"NO ({len(row['mismatches'])} runs)"]
        print("| " + " | ".join(cells) + " |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundle", type=Path, default=DEFAULT_BUNDLE)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2, help="timed repeats per prompt (after one warm-up)")
    parser.add_argument("--ks", type=int, nargs="+", default=[3, 5], help="num_assistant_tokens for standard SD")
    parser.add_argument("--no-genai", action="store_true", help="skip the OpenVINO GenAI rows")
    args = parser.parse_args()

    prompts = [chat(t) for t in TASKS]
    pipe, setups = build_setups(args)
    start = time.perf_counter()

    print("\nwarm-up (one uncounted run per setup) ...", flush=True)
    for s in setups:
        r = s.run(prompts[0])
        print(f"  {s.name:24s} {r.new_tokens} tokens, {r.wall_seconds:.1f} s", flush=True)

    for rep in range(args.repeats):
        for i, prompt in enumerate(prompts):
            order = setups[rep % len(setups):] + setups[:rep % len(setups)]
            for s in order:
                r = s.run(prompt)
                s.runs.setdefault(i, []).append(r)
                extra = f" acc={r.stats['acceptance']:.2f}" if "acceptance" in r.stats else ""
                print(f"  rep {rep} prompt {i} {s.name:24s} {r.new_tokens:3d} tok {r.wall_seconds:6.2f} s "
                      f"{r.tokens_per_s:6.2f} tok/s{extra}", flush=True)
    print(f"\ntimed loop took {time.perf_counter() - start:.0f} s", flush=True)

    prefill_s = measure_prefill(pipe, prompts, 1)
    rows = summarize(setups, prompts)
    report(rows, setups, prompts, prefill_s)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
