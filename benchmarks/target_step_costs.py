"""What one decoding step of a target costs under the CPU properties of each engine, interleaved in one run.

Where does a target-alone step's time go: in the steps of 2-3 tokens a block-invariant session feeds (the
token before it re-fed) against the one-token step GenAI takes, in the KV cache's precision (f32 against u8),
or in the group size of the dynamic int8 activation quantization (the int4 weights' 128 against the plugin's
default)? Each property set gets the paged IR compiled once; rounds visit every set in turn, and each round
prefills a prompt of 250 random tokens and times steps of 1, 2 and 3 tokens after it. Prints medians (ms).

    python benchmarks/target_step_costs.py ~/.cache/edge-specdec/bundles/qwen1.5b-int4+smollm2-135m-int8 --rounds 8
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import openvino as ov
from openvino._offline_transformations import paged_attention_transformation

from edge_specdec.runtime.graph import compute_logits_rows
from edge_specdec.runtime.session import CompiledLM

PROPERTY_SETS = {
    "ours: f32 KV, groups of 128": {"KV_CACHE_PRECISION": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": "128"},
    "f32 KV, default groups": {"KV_CACHE_PRECISION": "f32"},
    "u8 KV, groups of 128": {"KV_CACHE_PRECISION": "u8", "DYNAMIC_QUANTIZATION_GROUP_SIZE": "128"},
    "plugin defaults (GenAI)": {},
}
STEP_SIZES = (1, 2, 3)


def open_target(core: ov.Core, model_xml: Path, properties: dict):
    """A session on the paged IR compiled with these properties (not checked for block invariance: a lone
    token is allowed, to time it)."""
    model = core.read_model(str(model_xml))
    paged_attention_transformation(model)
    compute_logits_rows(model)
    compiled = core.compile_model(model, "CPU", {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32",
                                                 **properties})
    vocab = model.output("logits").get_partial_shape()[-1].get_length()
    return CompiledLM(compiled, "paged", "CPU", "dq", None, False, vocab).session()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("bundle", type=Path)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--steps", type=int, default=8, help="steps timed per round and size (the first 2 not counted)")
    args = p.parse_args()
    core = ov.Core()
    sessions = {name: open_target(core, args.bundle / "target" / "openvino_model.xml", props)
                for name, props in PROPERTY_SETS.items()}
    rng = np.random.default_rng(0)
    prompt = [int(t) for t in rng.integers(100, 20000, 250)]
    times: dict = {(name, n): [] for name in sessions for n in STEP_SIZES}
    for _ in range(args.rounds):
        for name, session in sessions.items():
            for n in STEP_SIZES:
                session.reset()
                session.feed(prompt, rows=1)
                for i in range(args.steps):
                    tokens = [int(t) for t in rng.integers(100, 20000, n)]
                    start = time.perf_counter()
                    session.feed(tokens, rows=n)
                    if i >= 2:
                        times[(name, n)].append(time.perf_counter() - start)
    for name in sessions:
        print(f"{name:30s} " + "  ".join(f"{n} token{'s' if n > 1 else ''}: "
                                         f"{1000 * statistics.median(times[(name, n)]):.1f} ms" for n in STEP_SIZES))


if __name__ == "__main__":
    main()
