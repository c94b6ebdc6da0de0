"""`edge-specdec run --compare`: one prompt, the speculative run against the target alone on the same pipeline."""
from __future__ import annotations

import dataclasses

from ..errors import EdgeSpecdecError
from .verdict import speedup_verdict


def warm_up(pipe, prompt, config, speculative) -> None:
    """Run both sides once, untimed and at full length, as the benchmark warms up: the first calls of a process
    prepare kernels for each new block shape and text length, which would otherwise land on the timed run.
    speculative: the run's SpeculativeConfig. The caches are emptied after it (see forget_prompt)."""
    if pipe.resolve_algorithm(speculative.algorithm, config) == "none":
        raise EdgeSpecdecError("--compare measures speculative decoding against the target alone: choose an "
                               "algorithm other than none.")
    for algorithm in (speculative.algorithm, "none"):
        pipe.generate(prompt, config, dataclasses.replace(speculative, algorithm=algorithm, pool_scope=None))
    forget_prompt(pipe)


def forget_prompt(pipe) -> None:
    """Empty the KV caches of a Pipeline (or of one DecodingSession), so that the next run prefills its whole
    prompt as a one-shot run does, and reuses nothing that the warm-up or the other side of a comparison left."""
    for session in (pipe.target, pipe.draft):
        if session is not None:
            session.reset()


def against_target_alone(pipe, prompt, config, result) -> dict:
    """The target alone on the same prompt and settings (from empty caches, as `result` ran), and how the
    speculative `result` compares: its speedup in tokens/s, whether it drafted at all, and the verdict in words
    (verdict.speedup_verdict)."""
    forget_prompt(pipe)
    baseline = pipe.generate(prompt, config, algorithm="none", pool_scope=None)
    speedup = result.stats.tokens_per_s / baseline.stats.tokens_per_s if baseline.stats.tokens_per_s else 0.0
    drafted = result.stats.draft_tokens_proposed + result.stats.free_tokens_proposed > 0
    return {"target_alone_tokens_per_s": round(baseline.stats.tokens_per_s, 3), "speedup": round(speedup, 3),
            "target_alone_time_per_output_token_ms": baseline.stats.as_dict()["time_per_output_token_ms"],
            "drafted": drafted, "verdict": speedup_verdict(speedup, drafted),
            "identical": result.token_ids == baseline.token_ids if config.greedy else None}


def compare_line(comparison: dict, algorithm: str) -> str:
    same = {True: "output identical to the target alone",
            False: "output DIFFERS from the target alone: a bug, please report it",
            None: "sampled: the same distribution as the target alone, not the same text"}[comparison["identical"]]
    verdict = comparison["verdict"]
    if not comparison["drafted"]:
        told = verdict
    else:
        told = f"{algorithm} {verdict} that" if verdict.endswith("x") else f"{algorithm}: {verdict}"
    return f"compare: the target alone {comparison['target_alone_tokens_per_s']:.1f} tokens/s; {told}; {same}"
