"""The KV cache's precision on the CPU: what each one stores per token, and whether it keeps the output exact.

For each KV cache setting (f32, f16, bf16, u8 by token, u8 as the plugin quantizes keys by default: by channel
over a block), with the runtime's activation precision ("dq": dynamic int8 activations in the int4 weights'
groups; "f32" with --activations dq,f32), the target's paged IR is compiled once and measured:

- the element type the plugin gives the cache inputs, and the bytes a token takes in the cache (all layers,
  keys and values, quantization scales included), from the cache inputs' shapes;
- block invariance, the runtime's own probe (`probes.is_block_invariant`), on an empty cache and after a long
  past (--long tokens): what speculative decoding needs to write what the target alone writes;
- exactness after a rollback: a verified block of 6, 4 of them rolled back, 3 new tokens as one block, against
  the same tokens one step at a time (6 trials);
- how far it is from the f32 cache: the greedy tokens of a real prompt (--new tokens, the target alone) that
  match the f32 cache's, and the largest logit difference along them;
- a step's cost after a 250-token prompt (tokens 2 and 3: the steps a block-invariant session takes).

A setting the plugin refuses (bf16 on a CPU without bf16 support) is listed with its error.

    python benchmarks/kv_cache_precision.py ~/.cache/edge-specdec/bundles/qwen1.5b-int4+smollm2-135m-int8
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import openvino as ov
from openvino._offline_transformations import paged_attention_transformation

from edge_specdec.runtime.devices import PROFILES
from edge_specdec.runtime.graph import compute_logits_rows, int4_group_size
from edge_specdec.runtime.probes import is_block_invariant
from edge_specdec.runtime.session import CompiledLM
from target_step_costs import exact_after_rollbacks  # benchmarks/ is on sys.path when a script here runs

CACHES = {
    "f32": {"KV_CACHE_PRECISION": "f32"},
    "f16": {"KV_CACHE_PRECISION": "f16"},
    "bf16": {"KV_CACHE_PRECISION": "bf16"},
    "u8 by token": {"KV_CACHE_PRECISION": "u8", "KEY_CACHE_QUANT_MODE": "BY_TOKEN"},
    "u8 (plugin default: keys by channel)": {"KV_CACHE_PRECISION": "u8"},
}
PROMPT = "def merge_sorted(a, b):\n    \"\"\"Merge two sorted lists into one sorted list.\"\"\"\n"


def cache_bytes_per_token(compiled: ov.CompiledModel) -> float:
    """Bytes one token takes in the paged cache: every key_cache.N / value_cache.N input's block shape
    [heads, block rows, head size] (u8 caches carry their scales in extra rows or columns) over the tokens a
    block holds (the value cache's block size)."""
    caches = [p for p in compiled.inputs if p.get_any_name().startswith(("key_cache.", "value_cache."))]
    block = next(p for p in caches if p.get_any_name().startswith("value_cache.")).get_partial_shape()[2].get_length()
    total = 0
    for port in caches:
        shape = [d.get_length() for d in list(port.get_partial_shape())[1:]]
        total += int(np.prod(shape)) * port.get_element_type().size
    return total / block


def greedy(lm: CompiledLM, prompt: list[int], n: int) -> tuple[list[int], np.ndarray]:
    """The target alone's greedy tokens (one step at a time, as a block-invariant session steps) and their logits."""
    session = lm.session()
    logits = session.feed(prompt, rows=1)[-1]
    tokens, rows = [], []
    for _ in range(n):
        rows.append(logits)
        tokens.append(int(np.argmax(logits)))
        logits = session.feed([tokens[-1]])[-1]
    return tokens, np.stack(rows)


def step_ms(lm: CompiledLM, sizes=(2, 3), reps: int = 6) -> dict[int, float]:
    """Median ms of a call of n tokens after a 250-token prompt (the first two calls of each size not counted)."""
    session = CompiledLM(lm.compiled, "paged", "CPU", lm.precision, None, False, lm.vocab_size).session()
    prompt = np.random.default_rng(0).integers(0, min(20000, lm.vocab_size), 250).tolist()
    session.feed(prompt, rows=1)
    out = {}
    for n in sizes:
        times = []
        for i in range(reps + 2):
            start = time.perf_counter()
            session.feed(prompt[:n], rows=1)
            times.append(time.perf_counter() - start)
            session.rollback(n)
        out[n] = 1000 * statistics.median(times[2:])
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("bundle", type=Path)
    p.add_argument("--activations", default="dq", help="comma-separated: dq, f32")
    p.add_argument("--caches", default=",".join(CACHES), help="comma-separated names of " + ", ".join(CACHES))
    p.add_argument("--long", type=int, default=4096, help="the long past of the block-invariance probe (tokens)")
    p.add_argument("--new", type=int, default=32, help="greedy tokens compared with the f32 cache's")
    p.add_argument("--json", type=Path, help="also write the rows here")
    args = p.parse_args()
    core = ov.Core()
    xml = args.bundle / "target" / "openvino_model.xml"
    tokenizer = core.compile_model(str(args.bundle / "target" / "openvino_tokenizer.xml"), "CPU")
    prompt = tokenizer([PROMPT])["input_ids"][0].tolist()
    model = core.read_model(str(xml))
    paged_attention_transformation(model)
    compute_logits_rows(model)
    vocab = model.output("logits").get_partial_shape()[-1].get_length()
    cpu = PROFILES["CPU"]
    rows, reference = [], {}
    for activations in args.activations.split(","):
        base = {**cpu.properties, **cpu.precision_properties(activations, int4_group_size(model))}
        for name in args.caches.split(","):
            row = {"activations": activations, "cache": name}
            start = time.perf_counter()
            try:
                compiled = core.compile_model(model, "CPU", {**base, **CACHES[name]})
            except RuntimeError as exc:
                row["refused"] = str(exc).strip().splitlines()[-1]
                print(json.dumps(row), flush=True)
                rows.append(row)
                continue
            lm = CompiledLM(compiled, "paged", "CPU", activations, None, True, vocab)
            row["element_type"] = str(compiled.inputs[[p.get_any_name() for p in compiled.inputs].index(
                "key_cache.0")].get_element_type())
            row["bytes_per_token"] = cache_bytes_per_token(compiled)
            row["block_invariant"] = is_block_invariant(lm.session())
            t = time.perf_counter()
            row[f"block_invariant_after_{args.long}"] = is_block_invariant(lm.session(), past=args.long)
            row["long_probe_s"] = round(time.perf_counter() - t, 1)
            row["exact_after_rollback"] = f"{exact_after_rollbacks(lm, low=0, high=min(30000, lm.vocab_size))} of 6"
            tokens, logits = greedy(lm, prompt, args.new)
            if name == "f32":
                reference[activations] = (tokens, logits)
            if activations in reference:
                ref_tokens, ref_logits = reference[activations]
                same = next((i for i, (a, b) in enumerate(zip(tokens, ref_tokens)) if a != b), len(tokens))
                row["greedy_same_as_f32_cache"] = f"first {same} of {len(tokens)}"
                row["max_logit_diff_vs_f32_cache"] = float(np.max(np.abs(logits[:same + 1] - ref_logits[:same + 1])))
            row["step_ms"] = step_ms(lm)
            row["seconds"] = round(time.perf_counter() - start, 1)
            print(json.dumps(row), flush=True)
            rows.append(row)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
