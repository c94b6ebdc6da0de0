"""What one decoding step of a target costs under the CPU properties of each engine, interleaved in one run.

Where does a target-alone step's time go: in the steps of 2-3 tokens a block-invariant session feeds (the
token before it re-fed) against the one-token step GenAI takes, in the KV cache's precision (f32 against u8),
or in the group size of the dynamic int8 activation quantization (the int4 weights' 128 against the plugin's
default)? Each property set gets the paged IR compiled once; rounds visit every set in turn, and each round
prefills a prompt of 250 random tokens and times steps of 1, 2 and 3 tokens after it. Prints medians (ms), and
whether the set is exact: block-invariant (the runtime's own probe, a block against the same tokens in pieces,
never a lone token), the property speculative decoding needs to write what the target alone writes, and after
a rollback (a verified block of 6, 4 of them rolled back, then 3 new tokens as one block against single steps).

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
from edge_specdec.runtime.probes import is_block_invariant
from edge_specdec.runtime.session import CompiledLM

PROPERTY_SETS = {
    "ours: f32 KV, groups of 128": {"KV_CACHE_PRECISION": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": "128"},
    "f32 KV, default groups": {"KV_CACHE_PRECISION": "f32"},
    "u8 KV, groups of 128": {"KV_CACHE_PRECISION": "u8", "DYNAMIC_QUANTIZATION_GROUP_SIZE": "128"},
    "plugin defaults (GenAI)": {},
}
STEP_SIZES = (1, 2, 3)


def exact_after_rollbacks(lm: CompiledLM, trials: int = 6, low: int = 100, high: int = 30000) -> int:
    """In how many trials a block fed after a rollback gets the logits of the same tokens fed one at a time
    (each step re-feeding the token before it, as a block-invariant session does)."""
    rng = np.random.default_rng(1)
    verified, stepped, equal = lm.session(), lm.session(), 0
    for _ in range(trials):
        prompt = rng.integers(low, high, int(rng.integers(20, 300))).tolist()  # token ids drawn from [low, high)
        block, new = rng.integers(low, high, 6).tolist(), rng.integers(low, high, 3).tolist()
        verified.reset()
        verified.feed(prompt, rows=1)
        verified.feed(block)
        verified.rollback(4)
        last = verified.feed(new)[-1]
        stepped.reset()
        stepped.feed(prompt, rows=1)
        for token in block[:2] + new:
            row = stepped.feed([token])[-1]
        equal += bool(np.array_equal(last, row))
    return equal


def open_target(core: ov.Core, model_xml: Path, properties: dict):
    """The paged IR compiled with these properties: (a session that may feed a lone token, to time it; whether
    the model is block-invariant; in how many of 6 trials it is exact after a rollback)."""
    model = core.read_model(str(model_xml))
    paged_attention_transformation(model)
    compute_logits_rows(model)
    compiled = core.compile_model(model, "CPU", {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32",
                                                 **properties})
    vocab = model.output("logits").get_partial_shape()[-1].get_length()
    timed = CompiledLM(compiled, "paged", "CPU", "dq", None, False, vocab).session()
    invariant = CompiledLM(compiled, "paged", "CPU", "dq", None, True, vocab)
    return timed, is_block_invariant(invariant.session()), exact_after_rollbacks(invariant)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("bundle", type=Path)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--steps", type=int, default=8, help="steps timed per round and size (the first 2 not counted)")
    args = p.parse_args()
    core = ov.Core()
    opened = {name: open_target(core, args.bundle / "target" / "openvino_model.xml", props)
              for name, props in PROPERTY_SETS.items()}
    sessions = {name: session for name, (session, _, _) in opened.items()}
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
                                         f"{1000 * statistics.median(times[(name, n)]):.1f} ms" for n in STEP_SIZES)
              + f"  block-invariant: {'yes' if opened[name][1] else 'NO'}, exact after a rollback: "
                f"{opened[name][2]} of 6")


if __name__ == "__main__":
    main()
