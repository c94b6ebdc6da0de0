"""Benchmark a bundle: our decoders against the peers, side by side and interleaved in one run.

    python benchmarks/bench.py --pair same   [--bundle DIR] [--max-new-tokens 64] [--repeats 2] [--no-genai] [--genai-ours]
    python benchmarks/bench.py --pair hetero [--bundle DIR] [--max-new-tokens 64] [--repeats 2] [--hf]

Setups (all greedy, same prompts, same max_new_tokens):
  ours none         Pipeline.generate(..., algorithm="none")             the target alone
  ours ALG K        algorithm=ALG, num_assistant_tokens=K                K in --ks (default 3 and 5)
                    ALG: standard and prompt-lookup (--pair same); slem and tli (--pair hetero)
  genai none        openvino_genai.LLMPipeline(bundle/target)                          (--pair same)
  genai sd K        LLMPipeline(bundle/target, draft_model=draft_model(bundle/draft))  (--pair same)
  genai-ours ...    the same two GenAI pipelines with our CPU properties (--genai-ours)
  ours concurrent   the draft drafts the next round while the target verifies, one thread each (--concurrent)
  hf none / hf uag  transformers fp32 on the bundle's source folders: the target alone, and Universal
                    Assisted Generation with the draft (assistant_tokenizer)            (--pair hetero --hf)

Prompts: chat-formatted code tasks (--pair same); code, chat and summarization (--pair hetero).
One Pipeline serves all our rows. Every setup gets one uncounted warm-up run, then for each (prompt, repeat)
all setups run back to back (the order rotates with the repeat) so that drift in machine speed hits them
alike. Reported per setup: median tokens/s, median acceptance, mean tokens per target pass, the summed
draft / target / loop seconds, the ratio to its engine's target-only row, and whether the output equals that
row's output for the same prompt (token ids for our rows, text for the peers; greedy must not change it).
"""
from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from edge_specdec.runtime import GenerationConfig, Pipeline

BUNDLES = Path.home() / ".cache/edge-specdec/bundles"
DEFAULT_BUNDLE = {"same": BUNDLES / "qwen1.5b-int4+qwen0.5b-int8", "hetero": BUNDLES / "qwen1.5b-int4+smollm2-135m-int8"}
ALGORITHMS = {"same": ("standard",), "hetero": ("slem", "tli")}
SYSTEM = "You are a helpful coding assistant."
TASKS = (
    "Write a Python function that checks whether a string is a palindrome.",
    "Write a Python function that does binary search on a sorted list and returns the index or -1.",
    "Write a Python function that merges two sorted lists into one sorted list.",
)
ARTICLE = ("The city council met on Tuesday to discuss the new public library. After two hours of debate, the "
           "members agreed to fund a larger building near the river, with a reading room for children, a small "
           "theatre and longer opening hours on weekends. Construction starts next spring and should take about "
           "eighteen months. Some residents worried about parking, so the plan adds bicycle racks and a bus stop.")


def chat(user: str) -> str:
    """The Qwen chat template, by hand, so that every engine sees exactly the same prompt text."""
    return (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n"
            f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n")


def prompts_for(pair: str) -> list[str]:
    if pair == "same":
        return [chat(t) for t in TASKS]
    return [chat(TASKS[0]), chat(TASKS[1]), "def quicksort(arr):\n",                       # code
            chat("Explain in three sentences why the sky is blue."),                      # chat
            chat(f"Summarize this article in two sentences.\n\n{ARTICLE}")]             # summarization


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
    engine: str  # "ours", "genai", "genai-ours" or "hf": ratios are against the engine's first setup
    run: Callable[[str], Run]
    runs: dict = field(default_factory=dict)  # prompt index -> list[Run]
    failures: list = field(default_factory=list)  # runs that raised, with the error


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


def hf(model, tokenizer, n: int, assistant=None, assistant_tokenizer=None) -> Callable[[str], Run]:
    """transformers generate(): the target alone, or Universal Assisted Generation with a draft of another vocabulary."""
    import torch

    def run(prompt: str) -> Run:
        inputs = tokenizer(prompt, return_tensors="pt")
        kwargs = dict(max_new_tokens=n, do_sample=False)
        if assistant is not None:
            kwargs.update(assistant_model=assistant, tokenizer=tokenizer, assistant_tokenizer=assistant_tokenizer)
        t = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(**inputs, **kwargs)
        wall = time.perf_counter() - t
        new = out[0, inputs["input_ids"].shape[1]:]
        return Run(tokenizer.decode(new, skip_special_tokens=True), len(new), wall, None, {})
    return run


def build_setups(args) -> tuple[Pipeline, list[Setup]]:
    print(f"loading our Pipeline from {args.bundle} ...", flush=True)
    t = time.perf_counter()
    pipe = Pipeline(args.bundle, precision=args.precision, kv_rollback=args.kv_rollback)
    print(f"  target: {pipe.target.rollback_method} KV, {pipe.target.precision} precision, block-invariant "
          f"{pipe.target.block_invariant}", flush=True)
    print(f"  loaded in {time.perf_counter() - t:.1f} s", flush=True)
    n = args.max_new_tokens
    setups = [Setup("ours none", "ours", ours(pipe, n, "none"))]
    for algorithm in ALGORITHMS[args.pair]:
        setups += [Setup(f"ours {algorithm} K={k}", "ours", ours(pipe, n, algorithm, k)) for k in args.ks]
    if args.concurrent:  # one thread each for draft and target, drafting during verification
        both = Pipeline(args.bundle, precision=args.precision, kv_rollback=args.kv_rollback, concurrent=True)
        setups += [Setup(f"ours concurrent {algorithm} K={k}", "ours", ours(both, n, algorithm, k))
                   for algorithm in ALGORITHMS[args.pair] for k in args.ks]
    if args.pair == "same":
        setups.append(Setup("ours prompt-lookup K=5", "ours", ours(pipe, n, "prompt-lookup", 5)))
        if not args.no_genai:
            setups += genai_setups(args)
    elif args.hf:
        setups += hf_setups(pipe, n)
    return pipe, setups


def hf_setups(pipe: Pipeline, n: int) -> list[Setup]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folders = [pipe.bundle.manifest[side]["source"]["given"] for side in ("target", "draft")]
    print(f"loading transformers fp32 models from {folders} ...", flush=True)
    (target, target_tok), (draft, draft_tok) = [
        (AutoModelForCausalLM.from_pretrained(f, dtype=torch.float32).eval(), AutoTokenizer.from_pretrained(f))
        for f in folders]
    return [Setup("hf none", "hf", hf(target, target_tok, n)),
            Setup("hf uag", "hf", hf(target, target_tok, n, draft, draft_tok))]


def genai_setups(args) -> list[Setup]:
    """GenAI alone and with the draft, with its default CPU properties and, with --genai-ours, also with the CPU
    properties our rows run with (--precision): the fair loop-against-loop comparison."""
    try:
        import openvino_genai
    except ImportError as e:
        print(f"openvino_genai not importable ({e}); skipping the GenAI rows", flush=True)
        return []
    from edge_specdec.runtime.session import CPU_PRECISIONS

    n = args.max_new_tokens
    target, draft = str(args.bundle / "target"), str(args.bundle / "draft")
    variants = [("genai", {})] + ([("genai-ours", dict(CPU_PRECISIONS[args.precision]))] if args.genai_ours else [])
    setups = []
    for label, props in variants:
        try:
            t = time.perf_counter()
            alone = openvino_genai.LLMPipeline(target, "CPU", **props)
            # the speculative pipeline runs on GenAI's continuous-batching backend, whose prefix cache would let
            # a run reuse the previous run's prompt KV; switch it off so that every run pays its own prefill
            scheduler = openvino_genai.SchedulerConfig()
            scheduler.enable_prefix_caching = False
            spec = openvino_genai.LLMPipeline(target, "CPU", draft_model=openvino_genai.draft_model(draft, "CPU", **props),
                                              scheduler_config=scheduler, **props)
            print(f"  GenAI {openvino_genai.__version__} pipelines ({label}) loaded in {time.perf_counter() - t:.1f} s",
                  flush=True)
        except Exception as e:  # report exactly what GenAI says about the folders, then go on without it
            print(f"GenAI ({label}) could not load the bundle folders: {type(e).__name__}: {e}; skipping its rows",
                  flush=True)
            continue
        setups.append(Setup(f"{label} none", label, genai(alone, n, None)))
        setups += [Setup(f"{label} sd K={k}", label, genai(spec, n, k)) for k in args.ks]
    return setups


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
    """One row per setup; ratios and output equality against the first setup of the same engine (its target alone)."""
    baselines = {}
    for s in setups:
        baselines.setdefault(s.engine, s)
    rows = []
    for s in setups:
        runs = [r for rs in s.runs.values() for r in rs]
        row = {"setup": s.name, "engine": s.engine, "baseline": baselines[s.engine].name, "runs": len(runs),
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
        elif s.engine.startswith("genai"):
            accepted = [r.stats.get("draft_tokens_accepted") for r in runs]
            row["genai_accepted_per_run"] = median(accepted) if any(a is not None for a in accepted) else None
            row["ttft_ms"] = median(r.stats["ttft_ms"] for r in runs)
            row["tpot_ms"] = median(r.stats["tpot_ms"] for r in runs)
        mismatches = []
        for i in range(len(prompts)):
            if i not in baselines[s.engine].runs:
                continue
            ref = baselines[s.engine].runs[i][0]
            for j, r in enumerate(s.runs.get(i, [])):
                same = r.token_ids == ref.token_ids if s.engine == "ours" else r.text == ref.text
                if not same:
                    mismatches.append((i, j, r))
        row["mismatches"] = mismatches
        rows.append(row)
    tps = {row["setup"]: row["tps"] for row in rows}
    for row in rows:
        row["vs_baseline"] = row["tps"] / tps[row["baseline"]]
        row["vs_ours_none"] = row["tps"] / tps["ours none"]
    return rows


def first_difference(a: list, b: list) -> int:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def report(rows: list[dict], setups: list[Setup], prompts: list[str], prefill_s: float) -> None:
    by_name = {s.name: s for s in setups}
    print("\n=== per setup ===")
    for row in rows:
        print(f"\n[{row['setup']}] runs={row['runs']} median tok/s={row['tps']:.2f} (wall {row['wall_tps']:.2f}) "
              f"ratio vs {row['baseline']}={row['vs_baseline']:.2f}x, vs ours none={row['vs_ours_none']:.2f}x")
        if row["engine"] == "ours":
            acc = "n/a" if row["acceptance"] is None else f"{row['acceptance']:.3f}"
            print(f"  median acceptance={acc} mean tokens/target pass={row['tokens_per_pass']:.2f} "
                  f"time split: draft {row['draft_s']:.2f} s, target {row['target_s']:.2f} s, "
                  f"loop {row['loop_s']:.2f} s")
        elif row["engine"].startswith("genai"):
            print(f"  median TTFT={row['ttft_ms']:.0f} ms TPOT={row['tpot_ms']:.1f} ms"
                  + (f" median accepted draft tokens/run={row['genai_accepted_per_run']}"
                     if row.get("genai_accepted_per_run") is not None else ""))
        for failure in by_name[row["setup"]].failures:
            print(f"  FAILED run: {failure}")
        what = "token_ids" if row["engine"] == "ours" else "text"
        if not row["mismatches"]:
            print(f"  {what} identical to {row['baseline']} on every prompt and repeat: yes")
        for i, j, r in row["mismatches"]:
            ref = by_name[row["baseline"]].runs[i][0]
            a, b = (r.token_ids, ref.token_ids) if row["engine"] == "ours" else (r.text, ref.text)
            d = first_difference(a, b)
            print(f"  MISMATCH prompt {i} repeat {j}: first difference at {d}: {a[d:d + 8]!r} vs {b[d:d + 8]!r} "
                  f"(lengths {len(a)} vs {len(b)})")

    print("\n=== unit costs (ours, summed over timed runs) ===")
    for row in rows:
        if row["engine"] != "ours":
            continue
        runs = row["runs"]
        decode_pass = (row["target_s"] - runs * prefill_s) / max(1, row["target_passes"] - runs)
        line = (f"[{row['setup']}] target pass: {row['target_s'] / row['target_passes'] * 1000:.1f} ms incl. "
                f"prefill, ~{decode_pass * 1000:.1f} ms excl. prefill")
        if row["draft_proposed"]:
            line += f"; draft time per proposed token: {row['draft_s'] / row['draft_proposed'] * 1000:.1f} ms"
        print(line)
    print(f"(prefill = one target pass over the prompt, median {prefill_s * 1000:.0f} ms, measured separately)")

    print("\n=== per prompt: median tok/s (ratio to its target alone on the same prompt) ===\n")
    print("| setup | " + " | ".join(f"prompt {i}" for i in range(len(prompts))) + " |")
    print("|---|" + "---|" * len(prompts))
    for row in rows:
        setup, base = by_name[row["setup"]], by_name[row["baseline"]]
        cells = []
        for i in range(len(prompts)):
            if i not in setup.runs or i not in base.runs:
                cells.append("failed")
                continue
            tps = median(r.tokens_per_s for r in setup.runs[i])
            cells.append(f"{tps:.1f} ({tps / median(r.tokens_per_s for r in base.runs[i]):.2f}x)")
        print(f"| {row['setup']} | " + " | ".join(cells) + " |")

    print("\n=== table ===\n")
    print("| setup | tok/s (median) | vs its target alone | vs ours none | acceptance | tokens/target pass "
          "| draft s | target s | loop s | same output as its target alone |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        ours_row = row["engine"] == "ours"
        acc = row.get("acceptance")
        cells = [row["setup"], f"{row['tps']:.2f}", f"{row['vs_baseline']:.2f}x", f"{row['vs_ours_none']:.2f}x",
                 f"{acc:.3f}" if acc is not None else "-",
                 f"{row['tokens_per_pass']:.2f}" if ours_row else "-",
                 f"{row['draft_s']:.1f}" if ours_row else "-",
                 f"{row['target_s']:.1f}" if ours_row else "-",
                 f"{row['loop_s']:.2f}" if ours_row else "-",
                 ("yes" if not row["mismatches"] else f"NO ({len(row['mismatches'])} runs)")
                 + (f"; {len(by_name[row['setup']].failures)} runs failed" if by_name[row["setup"]].failures else "")]
        print("| " + " | ".join(cells) + " |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", choices=("same", "hetero"), default="same",
                        help="same: a same-vocabulary bundle against OpenVINO GenAI; hetero: a different-vocabulary "
                             "bundle (SLEM, TLI) against transformers' Universal Assisted Generation")
    parser.add_argument("--bundle", type=Path, help="default: the real-model bundle of --pair in ~/.cache")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2, help="timed repeats per prompt (after one warm-up)")
    parser.add_argument("--ks", type=int, nargs="+", default=[3, 5], help="num_assistant_tokens for standard SD")
    parser.add_argument("--no-genai", action="store_true", help="skip the OpenVINO GenAI rows (--pair same)")
    parser.add_argument("--genai-ours", action="store_true",
                        help="add GenAI rows with our CPU properties (see --precision) besides its defaults")
    parser.add_argument("--precision", choices=("dq", "f32"), default="dq", help="our CPU precision (default dq)")
    parser.add_argument("--concurrent", action="store_true",
                        help="add rows that draft concurrently with verification (one CPU thread per model)")
    parser.add_argument("--kv-rollback", choices=("paged", "masked"), help="our KV rollback (default: per device)")
    parser.add_argument("--hf", action="store_true", help="add transformers fp32 rows (--pair hetero; slow)")
    args = parser.parse_args()
    args.bundle = args.bundle or DEFAULT_BUNDLE[args.pair]

    prompts = prompts_for(args.pair)
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
                try:
                    r = s.run(prompt)
                except Exception as e:  # a peer that crashes on one prompt must not take the whole run down
                    s.failures.append(f"prompt {i}: {type(e).__name__}: {str(e)[:160]}")
                    print(f"  rep {rep} prompt {i} {s.name:24s} FAILED: {s.failures[-1]}", flush=True)
                    continue
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
