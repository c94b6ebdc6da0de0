"""Where a process's memory goes: resident memory (anonymous and file-backed) and its peak at each stage of a load
and of long prompts, for our Pipeline (as `edge-specdec bench long-prompts` runs it) or OpenVINO GenAI's LLMPipeline.

    python benchmarks/memory_stages.py BUNDLE --engine ours --lengths 2048 8192 --algorithm none
    python benchmarks/memory_stages.py BUNDLE --engine genai --lengths 2048

The prompts are the long-prompts suite's quote task (cut in a fresh process of their own); the measured engine then
runs in another fresh process, which prints one line per stage: after the imports, around each read_model,
compile_model, block-invariance probe, warm-up and tokenizer of ours (target and draft load in two threads, so their
lines interleave), after the load, after each prompt's first token (its prefill) and after its 64 greedy tokens,
with the KV blocks each session holds. Peak = VmHWM, as the suite's peak_rss_mib. Linux only (/proc/self/status).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def child(bundle: str, engine: str, algorithm: str, prompts: dict[str, list[int]]) -> None:
    """The measured process: load the engine, run each prompt, print a line per stage."""
    import threading
    import time

    start = time.perf_counter()

    def log(what: str) -> None:
        status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
        mib = {k: int(status[k].split()[0]) // 1024 for k in ("VmRSS", "RssAnon", "RssFile", "VmHWM")}
        print(f"{time.perf_counter() - start:7.1f}s {threading.current_thread().name[:10]:10s} {what:42s} "
              f"rss {mib['VmRSS']:5d}  anon {mib['RssAnon']:5d}  file {mib['RssFile']:5d}  peak {mib['VmHWM']:5d} MiB",
              flush=True)

    def wrap(owner, name: str, label: str = "") -> None:
        function = getattr(owner, name)

        def logged(*args, **kwargs):
            log(f"> {label or name}")
            result = function(*args, **kwargs)
            log(f"< {label or name}")
            return result
        setattr(owner, name, logged)

    log("start")
    import numpy as np
    import openvino as ov
    log("imported openvino")
    if engine == "genai":
        import openvino_genai as og
        from edge_specdec.bundle import load_bundle
        log("imported openvino_genai")
        scheduler = og.SchedulerConfig()
        scheduler.enable_prefix_caching = False
        pipe = og.LLMPipeline(str(load_bundle(bundle, verify=False).target.folder), "CPU", scheduler_config=scheduler)
        log("LLMPipeline loaded")
        config = og.GenerationConfig(max_new_tokens=64, min_new_tokens=64)
        for key, ids in prompts.items():
            first: list = []

            def streamer(text: str) -> bool:
                if not first:
                    first.append(text)
                    log(f"first token after {len(ids)} tokens")
                return False
            pipe.generate(ov.Tensor(np.array([ids], dtype=np.int64)), config, streamer=streamer)
            log(f"64 tokens after {len(ids)}")
        return
    from edge_specdec.benchmark.suites.long_prompts import ours_pipeline
    from edge_specdec.runtime import GenerationConfig, pipeline, session
    log("imported edge_specdec.runtime")
    wrap(ov.Core, "read_model")
    wrap(ov.Core, "compile_model")
    wrap(session, "passes_block_invariance", "block-invariance probes")
    wrap(pipeline.Engine, "_warm_up", "warm-up")
    wrap(pipeline, "PromptTokenizer", "a tokenizer")
    pipe = ours_pipeline(bundle)
    log("Pipeline loaded")
    config = GenerationConfig(max_new_tokens=64, temperature=0, ignore_eos=True)
    for key, ids in prompts.items():
        first = []

        def on_text(text: str) -> None:
            if not first:
                first.append(text)
                log(f"first token after {len(ids)} tokens")
        if pipe.draft is not None:
            pipe.draft.reset()
        pipe.generate(ids, config, algorithm=algorithm, on_text=on_text)
        log(f"64 tokens after {len(ids)} ({algorithm})")
        for role, s in (("target", pipe.target), ("draft", pipe.draft)):
            if s is not None and hasattr(s, "pool"):
                kv = getattr(pipe, f"{role}_model").kv_bytes_per_token
                print(f"         {role}: {len(s.blocks)} KV blocks of {s.block_size} tokens, pool of "
                      f"{s.pool.capacity}, {kv:.0f} bytes a token: {len(s.blocks) * s.block_size * kv / 2**20:.1f} "
                      f"MiB", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle", help="a bundle folder (the target is what GenAI loads)")
    ap.add_argument("--engine", choices=("ours", "genai"), default="ours", help="whose process to measure")
    ap.add_argument("--lengths", type=int, nargs="+", default=[2048], metavar="N",
                    help="prompt lengths in tokens, run one after another in the one process (default 2048)")
    ap.add_argument("--algorithm", default="none", help="ours: the algorithm of each run (none: the target alone; "
                                                        "auto: the default)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.bundle, a.engine, a.algorithm, json.loads(sys.stdin.read()))
        return 0
    sys.path.insert(0, str(ROOT))
    from edge_specdec.benchmark.fresh_process import run_fresh

    bundle = str(Path(a.bundle).resolve())
    ids = run_fresh("edge_specdec.benchmark.suites.long_prompts:prompt_ids", bundle=bundle,
                    lengths=sorted(set(a.lengths)), tasks=["quote"])["ids"]
    prompts = {str(n): ids[f"{n}/quote"] for n in a.lengths}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    return subprocess.run([sys.executable, __file__, bundle, "--engine", a.engine, "--algorithm", a.algorithm,
                           "--child", "1"], input=json.dumps(prompts), text=True, env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
