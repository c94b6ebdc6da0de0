"""`edge-specdec run --compare`: one prompt, the speculative run against the target alone on the same pipeline."""
from __future__ import annotations

import dataclasses

from ..errors import EdgeSpecdecError


def warm_up(pipe, prompt, config, speculative) -> None:
    """Run both sides once, untimed and at full length, as the benchmark warms up: the first calls of a process
    prepare kernels for each new block shape and text length, which would otherwise land on the timed run.
    speculative: the run's SpeculativeConfig."""
    if pipe.resolve_algorithm(speculative.algorithm, config) == "none":
        raise EdgeSpecdecError("--compare measures speculative decoding against the target alone: choose an "
                               "algorithm other than none.")
    for algorithm in (speculative.algorithm, "none"):
        pipe.generate(prompt, config, dataclasses.replace(speculative, algorithm=algorithm, pool_scope=None))


def against_target_alone(pipe, prompt, config, result) -> dict:
    """The target alone on the same prompt and settings, and how the speculative `result` compares."""
    baseline = pipe.generate(prompt, config, algorithm="none", pool_scope=None)
    speedup = result.stats.tokens_per_s / baseline.stats.tokens_per_s if baseline.stats.tokens_per_s else 0.0
    return {"target_alone_tokens_per_s": round(baseline.stats.tokens_per_s, 3), "speedup": round(speedup, 3),
            "target_alone_time_per_output_token_ms": baseline.stats.as_dict()["time_per_output_token_ms"],
            "identical": result.token_ids == baseline.token_ids if config.greedy else None}


def compare_line(comparison: dict, algorithm: str) -> str:
    same = {True: "output identical to the target alone",
            False: "output DIFFERS from the target alone: a bug, please report it",
            None: "sampled: the same distribution as the target alone, not the same text"}[comparison["identical"]]
    return (f"compare: the target alone {comparison['target_alone_tokens_per_s']:.1f} tokens/s; {algorithm} "
            f"{comparison['speedup']:.2f}x that; {same}")
