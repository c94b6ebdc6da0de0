"""How well a bundle's draft drafts for its target, on the held-out prompts, with our own runtime.

Each prompt is generated greedily with the engine's default speculative settings (algorithm auto, as `edge-specdec
run` does), one after another on one session. Greedy output does not depend on the draft, so before and after
alignment the target writes the same text, and the draft is judged on the same text: acceptance (drafted tokens
the target kept / drafted tokens proposed) and tokens per target pass (output tokens / target passes, the figure
the speedup follows).
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Optional

from ...runtime import Engine, GenerationConfig
from .prompts import held_out_prompts

PROGRESS_SECONDS = 30.0  # a progress line at most this often


def evaluate_bundle(bundle: Path, count: Optional[int], max_new_tokens: int, say: Callable[[str], None],
                    label: str) -> dict[str, Any]:
    start = time.monotonic()
    engine = Engine(bundle)
    prompts = held_out_prompts(engine, count)
    session = engine.session()
    config = GenerationConfig(max_new_tokens=max_new_tokens, temperature=0.0)
    totals = {"new_tokens": 0, "target_passes": 0, "proposed": 0, "accepted": 0, "seconds": 0.0}
    by_category: dict[str, dict[str, int]] = {}
    last_line = time.monotonic()
    for done, prompt in enumerate(prompts):
        if time.monotonic() - last_line >= PROGRESS_SECONDS:
            last_line = time.monotonic()
            say(f"evaluate ({label}): {done}/{len(prompts)} prompts")
        result = session.generate(prompt.ours, config)
        stats = result.stats
        for key, value in (("new_tokens", stats.new_tokens), ("target_passes", stats.target_passes),
                           ("proposed", stats.draft_tokens_proposed), ("accepted", stats.draft_tokens_accepted),
                           ("seconds", stats.seconds)):
            totals[key] += value
        cat = by_category.setdefault(prompt.category, {"new_tokens": 0, "target_passes": 0})
        cat["new_tokens"] += stats.new_tokens
        cat["target_passes"] += stats.target_passes
    algorithm = engine.resolve_algorithm("auto", config)
    report = {
        "prompts": len(prompts), "max_new_tokens": max_new_tokens, "algorithm": algorithm,
        "acceptance": round(totals["accepted"] / totals["proposed"], 4) if totals["proposed"] else 0.0,
        "tokens_per_target_pass": round(totals["new_tokens"] / max(1, totals["target_passes"]), 4),
        "tokens_per_s": round(totals["new_tokens"] / max(totals["seconds"], 1e-9), 2),
        "new_tokens": totals["new_tokens"], "target_passes": totals["target_passes"],
        "draft_tokens_proposed": totals["proposed"], "draft_tokens_accepted": totals["accepted"],
        "tokens_per_target_pass_by_category": {c: round(v["new_tokens"] / max(1, v["target_passes"]), 3)
                                               for c, v in by_category.items()},
        "seconds": round(time.monotonic() - start, 1),
    }
    say(f"evaluate ({label}): {len(prompts)} held-out prompts, {algorithm}: acceptance {report['acceptance']:.3f}, "
        f"{report['tokens_per_target_pass']:.2f} tokens per target pass, {report['tokens_per_s']:.1f} tokens/s "
        f"({report['seconds']:.0f} s)")
    return report
