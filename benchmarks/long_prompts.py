"""Long prompts (documents, tool schemas): time to the first token, identical outputs and peak memory, ours against
OpenVINO GenAI's LLMPipeline on the same target IR.

A prompt of N tokens (default 4096 and 8192) is cut from a long text (this package's own Python sources, a
stand-in for a document; then "Summarize the code above." rendered with the chat template), and each engine
generates --new greedy tokens from exactly those token ids, in a fresh subprocess of its own (so that its peak
resident memory is its own): ours with the default algorithm at each KV cache type asked for (--kv f16,f32,u8),
ours with the target alone, and GenAI's target alone (its default CPU properties: a u8 KV cache; with
--genai-ours our CPU properties; with --genai-kv f16 its defaults but that KV cache). Reported: the time to the
first token (median over --repeats runs in the same process, the first run a warm-up not counted), tokens per
second after it, whether the tokens equal our target alone's at the default cache, and the process's peak RSS.

    python benchmarks/long_prompts.py ~/.cache/edge-specdec/bundles/qwen1.5b-int4+smollm2-135m-int8 \
        --lengths 4096 8192 --new 32 --repeats 2 --json benchmarks/results/long_prompts.json
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

SOURCE = Path(__file__).resolve().parent.parent / "edge_specdec"


def prompt_ids(bundle: str, n: int) -> list[int]:
    """N token ids: the chat template around the start of a long text, cut to N tokens of the target's tokenizer."""
    from edge_specdec.runtime import Engine

    engine = Engine(bundle, static_shapes=False, fixed_blocks=False)
    text = "\n\n".join(p.read_text() for p in sorted(SOURCE.rglob("*.py")))
    ids = engine.tokenizer.encode(text)
    if len(ids) < n:
        raise SystemExit(f"the text has only {len(ids)} tokens")
    tail = engine.chat_prompt([{"role": "user", "content": "Summarize the code above."}])
    head = engine.tokenizer.encode("```python\n")
    return head + ids[:n - len(head) - len(tail)] + tail


def run_ours(bundle: str, ids: list[int], new: int, repeats: int, kv_cache, algorithm: str) -> dict:
    from edge_specdec.runtime import GenerationConfig, Pipeline

    pipe = Pipeline(bundle, static_shapes=False, kv_cache=kv_cache, prefix_reuse=False)
    config = GenerationConfig(max_new_tokens=new, temperature=0, ignore_eos=True)
    runs = [pipe.generate(ids, config, algorithm=algorithm) for _ in range(repeats + 1)][1:]
    return {"ttft_s": statistics.median(r.stats.first_token_seconds for r in runs),
            "tokens_per_s_after_first": statistics.median(
                (len(r.token_ids) - 1) / max(1e-9, r.stats.seconds - r.stats.first_token_seconds) for r in runs),
            "token_ids": runs[-1].token_ids, "exact": runs[-1].exact,
            "kv_bytes_per_token": pipe.target_model.kv_bytes_per_token}


def run_genai(bundle: str, ids: list[int], new: int, repeats: int, ours_props: bool,
              kv_cache: Optional[str] = None) -> dict:
    import numpy as np
    import openvino as ov
    import openvino_genai as og

    from edge_specdec.bundle import load_bundle
    from edge_specdec.runtime.devices import PROFILES
    from edge_specdec.runtime.graph import int4_group_size

    target = load_bundle(bundle, verify=False).target
    props = (PROFILES["CPU"].precision_properties("dq", int4_group_size(ov.Core().read_model(str(target.model_xml))))
             if ours_props else {})
    if kv_cache:
        props["KV_CACHE_PRECISION"] = kv_cache
    scheduler = og.SchedulerConfig()
    scheduler.enable_prefix_caching = False
    pipe = og.LLMPipeline(str(target.folder), "CPU", scheduler_config=scheduler, **props)
    config = og.GenerationConfig(max_new_tokens=new, min_new_tokens=new)
    tokens = ov.Tensor(np.array([ids], dtype=np.int64))
    ttfts, rates, out = [], [], None
    for _ in range(repeats + 1):
        first: list[float] = []

        def streamer(_piece) -> bool:
            if not first:
                first.append(time.perf_counter())
            return False
        start = time.perf_counter()
        out = pipe.generate(tokens, config, streamer)
        end = time.perf_counter()
        ttfts.append((first[0] if first else end) - start)
        rates.append((new - 1) / max(1e-9, end - (first[0] if first else end)))
    return {"ttft_s": statistics.median(ttfts[1:]), "tokens_per_s_after_first": statistics.median(rates[1:]),
            "token_ids": [int(t) for t in out.tokens[0]], "exact": None}


def peak_rss_mib() -> float:
    """This process's peak resident memory since its exec (VmHWM; ru_maxrss would keep the parent's peak)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(args) -> None:
    ids = json.loads(Path(args.ids).read_text())
    if args.engine == "genai":
        row = run_genai(args.bundle, ids, args.new, args.repeats, ours_props=False)
    elif args.engine == "genai-ours":
        row = run_genai(args.bundle, ids, args.new, args.repeats, ours_props=True)
    elif args.engine.startswith("genai:"):
        row = run_genai(args.bundle, ids, args.new, args.repeats, ours_props=False, kv_cache=args.engine[6:])
    else:
        algorithm, kv = args.engine.split(":")
        row = run_ours(args.bundle, ids, args.new, args.repeats, None if kv == "default" else kv, algorithm)
    row["peak_rss_mib"] = peak_rss_mib()
    print("ROW " + json.dumps(row), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("bundle")
    p.add_argument("--lengths", type=int, nargs="+", default=[4096, 8192])
    p.add_argument("--new", type=int, default=32)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--kv", default="default,f32,u8", help="our KV cache types (default = f16 on the CPU)")
    p.add_argument("--genai-ours", action="store_true", help="also GenAI with our CPU properties")
    p.add_argument("--genai-kv", nargs="*", default=[], metavar="TYPE",
                   help="also GenAI with these KV cache types (f16, f32), its other properties its defaults")
    p.add_argument("--json", type=Path)
    p.add_argument("--engine", help=argparse.SUPPRESS)
    p.add_argument("--ids", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.engine:
        return child(args)
    engines = ["none:default"] + [f"auto:{kv}" for kv in args.kv.split(",")] + ["genai"] \
        + (["genai-ours"] if args.genai_ours else []) + [f"genai:{kv}" for kv in args.genai_kv]
    results = []
    for n in args.lengths:
        ids_file = Path(f"/tmp/long_prompt_{n}.json")
        ids_file.write_text(json.dumps(prompt_ids(args.bundle, n)))
        reference = None
        for engine in engines:
            out = subprocess.run([sys.executable, __file__, args.bundle, "--engine", engine, "--ids", str(ids_file),
                                  "--new", str(args.new), "--repeats", str(args.repeats)],
                                 capture_output=True, text=True)
            line = next((s for s in out.stdout.splitlines() if s.startswith("ROW ")), None)
            if line is None:
                row = {"error": (out.stderr.strip().splitlines() or ["?"])[-1]}
            else:
                row = json.loads(line[4:])
                if engine == "none:default":
                    reference = row["token_ids"]
                row["same_tokens_as_our_target_alone"] = row["token_ids"] == reference
            row.update(prompt_tokens=n, engine=engine)
            results.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "token_ids"}), flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
