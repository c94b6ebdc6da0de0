"""What a bigger target gains: block costs of random-weight targets of the Qwen2.5-1.5B / 3B / 7B shapes and the
draft's step, measured with `check`'s cost model, and the speedup that model predicts at several acceptances.

The targets are int4 bundles exported by edge-specdec's export stage from benchmarks/random_target.py's folders,
at two depths per shape (the whole 3B and 7B take 12 and 30 GB in the export's fp32 conversion).
A call's cost at depth L is t_L(n) = a(n) + L * b(n) (the embedding and output layer once, then L identical
layers), so two depths give a(n) and b(n) and the full depth's t(n). The 1.5B shape is the check: its projection
against the real Qwen2.5-Coder-1.5B int4 target, measured in the same run. The draft is the real pair's
(SmolLM2-135M int8, its output layer cut as the engine cuts it). Costs: `check.step_costs` (a call of n tokens after
a short context, median of interleaved rounds; a block-invariant session's single step feeds 2 tokens); the
prediction: `check.predict` (a round drafting k tokens costs k*d + t(k+1) and yields (1 - a^(k+1)) / (1 - a)
tokens, i.i.d. acceptance a per drafted token, the best k <= 8, against t(1) per token for the target alone).

    python benchmarks/target_sizes.py --real ~/.cache/edge-specdec/bundles/qwen1.5b-int4+smollm2-135m-int8 \
        --random ~/.cache/edge-specdec/random-bundles --json benchmarks/results/target_sizes.json
"""
from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path

from edge_specdec.bundle import load_bundle
from edge_specdec.check import BLOCKS, predict, step_costs
from edge_specdec.runtime.devices import compile_config
from edge_specdec.runtime.pipeline import draft_output_ids
from edge_specdec.runtime.session import open_model

FULL_DEPTH = {"qwen2.5-1.5b": 28, "qwen2.5-3b": 36, "qwen2.5-7b": 28}
ACCEPTANCES = (0.4, 0.5, 0.594, 0.7, 0.8, 0.9)  # 0.594: the real pair's SLEM acceptance on code (RESULTS)


def target_costs(model_xml: Path, reps: int) -> dict[int, float]:
    """Seconds of a target call of n tokens, as the engine compiles the target on the CPU (dq, paged)."""
    model = open_model(model_xml, "CPU", config=compile_config("CPU", None), known_invariant={"dq": True})
    return step_costs(model.session(), BLOCKS, reps)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--real", type=Path, required=True, help="the real pair's bundle (its target and draft)")
    p.add_argument("--random", type=Path, required=True, help="the folder of the random bundles (SHAPE-LN)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    start = time.perf_counter()
    real = load_bundle(args.real, verify=False)
    draft = open_model(real.draft.model_xml, "CPU", block_invariant=False, config=compile_config("CPU", None),
                       output_ids=draft_output_ids(real.load_vocab_map().draft, 65536))
    d = step_costs(draft.session(), (1,), args.reps)[1]
    measured = {"real qwen2.5-coder-1.5b": target_costs(real.target.model_xml, args.reps)}
    depths: dict[str, dict[int, dict[int, float]]] = {}
    for folder in sorted(args.random.iterdir()):
        match = re.fullmatch(r"(qwen2\.5-[0-9.]+b)-L(\d+)", folder.name)
        if match and (folder / "manifest.json").is_file():
            costs = target_costs(load_bundle(folder, verify=False).target.model_xml, args.reps)
            depths.setdefault(match[1], {})[int(match[2])] = costs
            measured[folder.name] = costs
            print(folder.name, {n: round(1000 * s, 1) for n, s in costs.items()}, flush=True)
    projected = {}
    for shape, by_depth in depths.items():
        if len(by_depth) < 2:
            continue
        (l1, c1), (l2, c2) = sorted(by_depth.items())[:2]
        full = FULL_DEPTH[shape]
        projected[f"{shape} (projected to {full} layers)"] = {
            n: c1[n] + (full - l1) * (c2[n] - c1[n]) / (l2 - l1) for n in BLOCKS}
    rows = []
    for name, costs in {"real qwen2.5-coder-1.5b": measured["real qwen2.5-coder-1.5b"], **projected}.items():
        row = {"target": name, "t_ms": {n: round(1000 * s, 1) for n, s in costs.items()},
               "draft_over_target_step": round(d / costs[1], 3)}
        for a in ACCEPTANCES:
            pred = predict(a, d, costs)
            row[f"a={a}"] = {"speedup": round(pred["predicted_speedup"], 2), "k": pred["draft_length"]}
        rows.append(row)
    print(f"draft step {1000 * d:.1f} ms")
    header = "| target | t(1) | t(3) | t(9) ms | d / t(1) | " + " | ".join(f"a = {a}" for a in ACCEPTANCES) + " |"
    print(header + "\n|" + "---|" * (5 + len(ACCEPTANCES)))
    for row in rows:
        t = row["t_ms"]
        print(f"| {row['target']} | {t[1]} | {t[3]} | {t[9]} | {row['draft_over_target_step']} | "
              + " | ".join(f"{row[f'a={a}']['speedup']}x (k {row[f'a={a}']['k']})" for a in ACCEPTANCES) + " |")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"draft_step_ms": 1000 * d, "measured_ms": {
            k: {n: 1000 * s for n, s in v.items()} for k, v in measured.items()}, "rows": rows,
            "seconds": time.perf_counter() - start}, indent=1))


if __name__ == "__main__":
    main()
