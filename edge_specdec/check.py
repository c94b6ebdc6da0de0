"""`edge-specdec check`: prove exactness on the hardware at hand, measure the costs, predict the speedup.

On the devices chosen (or AUTO's), for one bundle:
1. block invariance: the target's blocks give the bits of single steps (checked now, not read from the plan);
2. greedy exactness: every algorithm the bundle serves, on a few prompts, gives the target alone's token ids and
   logprob bits;
3. costs: the draft's step d, the target's step t(1) and its blocks t(n), measured on a scratch context;
4. the prediction: the simulated rounds `edge-specdec pair` predicts with (the target's greedy answers replayed
   to the default algorithm in the real decode loop, the rounds priced with the target's measured call costs;
   pairing/replay.py), and for sampled decoding too when asked or when the bundle's defaults sample (its sampled
   answers, the draft's acceptances drawn given them: pairing/sampled.py); and what `run --compare` will
   measure, measured the way it measures it: the default run
   (`auto` with its drafting guard, the bundle's default settings such as the demo's repetition penalty, 128 tokens)
   against the target alone, time per output token, on check's prompts after a warm-up run (everything the
   decode loop pays included), told as verdict.speedup_verdict tells it (no ratio where nothing was drafted,
   "no measurable difference" within the noise band). Beside it the ideal of the cost model: a round that
   drafts k tokens costs k*d + t(k+1) and yields (1 - a^(k+1)) / (1 - a) tokens on average (a: the acceptance
   per drafted token, d: the loop's draft seconds per drafted token, both measured in step 2), against t(1) per
   token for the target alone; its best k is the recommended draft length;
5. the draft's step on every device AUTO could give it (integrated GPUs, NPUs, a free discrete GPU, the CPU):
   the fastest is the recommended placement.

A user with an NPU or an iGPU runs it and reports back; it exits non-zero when exactness fails.
"""
from __future__ import annotations

import dataclasses
import statistics
import time
from pathlib import Path
from typing import Callable, Optional, Union

import numpy as np

from .benchmark.compare import forget_prompt
from .benchmark.verdict import speedup_verdict
from .errors import EdgeSpecdecError
from .pairing.rank import simulate_default
from .runtime import Engine, GenerationConfig
from .runtime.algorithms import AUTO, REGISTRY
from .runtime.devices import compile_config, draft_candidates, list_devices, resolve_cache_dir
from .runtime.probes import _scratch, passes_block_invariance
from .runtime.session import SEQUENCES_AFTER, open_model
from .runtime.settings import EngineConfig

PROMPTS = ["def fibonacci(n):", "The capital of France is", "import json\n\ndef load(path):"]
BLOCKS = (1, 2, 3, 5, 9)  # target block sizes timed
K_MAX = 8
SPEED_TOKENS = 128  # tokens per timed run of the prediction: what `run` generates by default


def exactness(engine: Engine, prompts: list[str], max_new_tokens: int,
              say: Callable[[str], None] = lambda _: None) -> dict:
    """Each algorithm's greedy runs against the target alone's: token ids and logprob bits, and the acceptance."""
    session = engine.session()
    config = GenerationConfig(max_new_tokens=max_new_tokens, temperature=0, logprobs=True, ignore_eos=True).pinned()
    # no run here reads or feeds the draft pool: each prompt is measured as a first request would run it
    reference = {p: session.generate(p, config, algorithm="none", pool_scope=None) for p in prompts}
    out = {}
    for name in engine.algorithms():
        if not REGISTRY[name].speculates:  # the target alone: the reference itself
            continue
        runs = [session.generate(p, config, algorithm=name, pool_scope=None) for p in prompts]
        same = [r.token_ids == reference[p].token_ids
                and [lp.logprob for lp in r.logprobs] == [lp.logprob for lp in reference[p].logprobs]
                for p, r in zip(prompts, runs)]
        proposed = sum(r.stats.draft_tokens_proposed for r in runs)
        accepted = sum(r.stats.draft_tokens_accepted for r in runs)
        out[name] = {"identical": sum(same), "runs": len(runs),
                     "first_difference": next((p for p, ok in zip(prompts, same) if not ok), None),
                     "acceptance": accepted / proposed if proposed else None,
                     # what a drafted token costs in the decode loop: the draft's calls, its re-tokenization
                     # and the lookups, not the bare draft step
                     "draft_seconds_per_drafted_token": (sum(r.stats.draft_seconds for r in runs) / proposed
                                                         if proposed else None),
                     "tokens_per_target_pass": statistics.median(r.stats.tokens_per_target_pass for r in runs),
                     "measured_speedup": loop_speedup([reference[p] for p in prompts], runs)}
        say(f"  {name}: {sum(same)}/{len(runs)} identical to the target alone"
            + (f", acceptance {accepted / proposed:.2f}" if proposed else ""))
    return out


def loop_speedup(alone: list, runs: list) -> float:
    """The median over prompts of the target alone's time per output token over the algorithm's: what a run
    gains once its first token is out, with everything the decode loop pays (each call's overhead, syncs and
    re-tokenization, lookup rounds, the Python between calls), which a model built from step costs leaves out."""
    return float(statistics.median(a.stats.time_per_output_token / r.stats.time_per_output_token
                                   for a, r in zip(alone, runs)))


def default_speedup(engine: Engine, prompts: list[str], max_new_tokens: int = SPEED_TOKENS) -> dict:
    """The default run against the target alone as `run --compare` measures them: `auto` with the bundle's default
    settings (`engine.default_config`), greedy, after one untimed warm-up run of both (the first calls of a block
    shape prepare its kernels; the drafting guard learns its verdict), then each prompt with both. Returns the
    median ratio of times per output token, of tokens/s, the tokens drafted, the rounds in which drafting was
    paused, and the verdict in words (verdict.speedup_verdict: no ratio where nothing was drafted)."""
    session = engine.session()
    config = dataclasses.replace(engine.default_config, max_new_tokens=max_new_tokens, temperature=0,
                                 ignore_eos=True)

    def fresh(prompt: str, algorithm: str):  # from empty caches, as `run --compare` runs each side
        forget_prompt(session)
        return session.generate(prompt, config, algorithm=algorithm, pool_scope=None)

    for algorithm in (AUTO, "none"):
        fresh(prompts[0], algorithm)
    runs = [(fresh(p, AUTO), fresh(p, "none")) for p in prompts]
    speedup = loop_speedup([alone for _, alone in runs], [drafted for drafted, _ in runs])
    ratios = [a.stats.time_per_output_token / d.stats.time_per_output_token for d, a in runs]
    drafted_tokens = sum(d.stats.draft_tokens_proposed + d.stats.free_tokens_proposed for d, _ in runs)
    return {"speedup": speedup, "verdict": speedup_verdict(speedup, drafted_tokens > 0, ratios),
            "drafted_tokens": drafted_tokens,
            "tokens_per_s_speedup": float(statistics.median(d.stats.tokens_per_s / a.stats.tokens_per_s
                                                            for d, a in runs)),
            "algorithm": runs[0][0].extra.get("algorithm"), "max_new_tokens": max_new_tokens,
            "repetition_penalty": config.repetition_penalty,
            "rounds_drafting_paused": sum(d.stats.rounds_drafting_paused for d, _ in runs),
            "rounds": sum(d.stats.rounds for d, _ in runs)}


def step_costs(session, sizes: tuple[int, ...], reps: int = 3) -> dict[int, float]:
    """Median seconds of a call of n tokens (the logits of its last token) after a short context, per n: in
    interleaved rounds, four calls of a size in a row of which the first two (a change of shape) are not counted."""
    times: dict[int, list[float]] = {n: [] for n in sizes}
    with _scratch(session, max(sizes)) as timed:
        for _ in range(reps):
            for n in sizes:
                times[n] += [timed(n) for _ in range(4)][2:]
    return {n: float(np.median(t)) for n, t in times.items()}


def draft_steps(engine: Engine, placed_ms: float) -> dict[str, float]:
    """Milliseconds of a draft step on each device AUTO could put the draft on (the placed one already measured)."""
    devices = list_devices(engine.core)
    steps = {}
    for device in draft_candidates(devices, engine.placement.target):
        if device == engine.placement.draft:
            steps[device] = placed_ms
            continue
        model = open_model(engine.bundle.draft.model_xml, device, core=engine.core, block_invariant=False,
                           config=compile_config(device, resolve_cache_dir(engine.config.cache_dir), 1))
        steps[device] = 1000 * step_costs(model.session(), (1,))[1]
    return steps


def predict(acceptance: float, draft_step: float, target: dict[int, float], k_max: int = K_MAX) -> dict:
    """The cost model's best draft length and its expected speedup over the target alone (see the docstring)."""
    a = min(max(acceptance, 0.0), 0.99)
    sizes = sorted(target)

    def t(n: int) -> float:  # measured, or on the line through the two nearest measured sizes
        if n in target:
            return target[n]
        lo = max((s for s in sizes if s < n), default=sizes[0])
        hi = min((s for s in sizes if s > n), default=sizes[-1])
        return target[lo] if lo == hi else target[lo] + (target[hi] - target[lo]) * (n - lo) / (hi - lo)

    def rate(k: int) -> float:  # tokens per second
        return (1 - a ** (k + 1)) / (1 - a) / (k * draft_step + t(k + 1))

    best = max(range(1, k_max + 1), key=rate)
    speedup = rate(best) * t(1)
    return {"draft_length": best if speedup > 1 else 0, "predicted_speedup": speedup,
            "rates": {k: rate(k) for k in range(1, k_max + 1)}}


def describe_simulated(simulated: dict) -> str:
    """The prediction from simulated rounds, as `edge-specdec pair` makes it."""
    speedup = simulated["speedup"]
    figure = f"{speedup:.2f}x the target alone" if speedup is not None else "no figure (the runs were too short)"
    return (f"simulated rounds (as `edge-specdec pair` predicts; {simulated.get('decoding', 'greedy')}, "
            f"{simulated['max_new_tokens']} tokens, the drafting guard left out): {simulated['algorithm']} {figure}")


def sampling_to_predict(engine: Engine, sampling=None):
    """The sampled decoding check predicts too (a pairing.Sampling): the one asked for, else the bundle's own
    defaults where they sample (their temperature and top-p), else None."""
    from .pairing.sampled import Sampling

    if sampling is not None:
        return sampling
    defaults = engine.default_config
    return Sampling(defaults.temperature, defaults.top_p) if not defaults.greedy else None


def describe_prediction(prediction: dict) -> str:
    """check's last line: the measured default run against the target alone (verdict.speedup_verdict: no ratio
    where it drafted nothing), and the cost model's ideal, a drafted token priced as the decode loop paid it."""
    k, run = prediction["draft_length"], prediction["default_run"]
    paused = (f"; drafting paused in {run['rounds_drafting_paused']} of its {run['rounds']} rounds, where it "
              "lost to the target alone" if run["rounds_drafting_paused"] else "")
    verdict = run["verdict"]
    told = f"about {verdict} the target alone per output token" if verdict.endswith("x") else verdict
    ideal = prediction["ideal_speedup"]
    allow = (f"would allow {ideal:.2f}x with {k} drafted token{'' if k == 1 else 's'} per round" if k else
             f"would allow no gain (at best {ideal:.2f}x)")
    return (f"prediction: {told} with the default run ({run['algorithm']}{paused}), as `run --compare` measures "
            f"it; {prediction['algorithm']}'s acceptance {prediction['acceptance']:.2f} and its cost per drafted "
            f"token in the loop ({1000 * prediction['draft_seconds_per_drafted_token']:.2f} ms; exactness runs) "
            f"with the target's step costs {allow}")


def run_check(bundle: Union[str, Path], config: Optional[EngineConfig] = None, *,
              prompts: Optional[list[str]] = None, max_new_tokens: int = 64,
              say: Callable[[str], None] = lambda _: None, core=None, sampling=None, **settings) -> dict:
    """The whole check of the Engine that `config` (or its fields as keyword arguments) opens on `core`; `ok` is
    False when any exactness check failed. sampling (a pairing.Sampling): the simulated rounds predict this sampled
    decoding too (`prediction.simulated_sampled`), as they do for a bundle whose defaults sample."""
    start = time.perf_counter()
    engine = Engine(bundle, config, core=core, **settings)
    engine.compile_static_copies()  # measured as a server runs once its copies serve, not while they compile
    say(f"placement: {engine.placement.describe()}")
    target = engine.target_model
    invariant = target.rollback_method == "paged" and passes_block_invariance(target.session())
    say(f"block invariance of the target ({target.precision}, {target.rollback_method} rollback, "
        f"{target.kv_cache or 'its device'}'s KV cache; on an empty cache and after a long past): "
        + ("yes" if invariant else "NO: speculative runs are exact only up to float noise"))
    memory = memory_report(engine)
    if memory.get("kv_bytes_per_token"):
        say(f"KV cache: {memory['kv_bytes_per_token'] / 1024:.1f} KiB per token of context (the target's "
            f"{target.kv_cache} cache, all layers); 4096 tokens: {memory['kv_bytes_per_token'] * 4096 / 2**20:.0f} MiB")
    long_prompts = long_prompt_line(engine)
    say(long_prompts)
    say("greedy exactness (token ids and logprob bits) against the target alone:")
    exact = exactness(engine, prompts or PROMPTS, max_new_tokens, say)
    costs = {"target_blocks_ms": {n: 1000 * s for n, s in step_costs(target.session(), BLOCKS).items()}}
    prediction = {}
    if engine.draft_model is not None:
        draft_step = step_costs(engine.draft_model.session(), (1,))[1]
        costs["draft_step_ms"] = 1000 * draft_step
        drafted = {name: r for name, r in exact.items()
                   if REGISTRY[name].needs_draft and r["acceptance"] is not None}
        default = engine.resolve_algorithm("auto", GenerationConfig())
        if drafted:
            name = default if default in drafted else max(drafted, key=lambda n: drafted[n]["acceptance"])
            target_s = {n: ms / 1000 for n, ms in costs["target_blocks_ms"].items()}
            per_drafted = drafted[name]["draft_seconds_per_drafted_token"]
            ideal = predict(drafted[name]["acceptance"], per_drafted, target_s)
            say(f"the default run against the target alone, as `run --compare` runs them ({len(prompts or PROMPTS)}"
                f" prompts, {SPEED_TOKENS} tokens, the bundle's default settings):")
            measured = default_speedup(engine, prompts or PROMPTS)
            simulated = simulated_or_error(engine, prompts or PROMPTS, None, say)
            to_sample = sampling_to_predict(engine, sampling)
            if to_sample is not None:
                prediction["simulated_sampled"] = simulated_or_error(engine, prompts or PROMPTS, to_sample, say)
            prediction |= {"simulated": simulated, "algorithm": name, "acceptance": drafted[name]["acceptance"],
                          "draft_seconds_per_drafted_token": per_drafted,
                          "draft_length": ideal["draft_length"], "ideal_speedup": ideal["predicted_speedup"],
                          "rates": ideal["rates"], "predicted_speedup": measured["speedup"], "default_run": measured}
        costs["draft_step_ms_by_device"] = draft_steps(engine, costs["draft_step_ms"])
    say("costs: target " + ", ".join(f"{n} token{'' if int(n) == 1 else 's'} {ms:.1f} ms"
                                     for n, ms in costs["target_blocks_ms"].items())
        + (f"; draft step {costs['draft_step_ms']:.1f} ms" if "draft_step_ms" in costs else ""))
    if "draft_step_ms_by_device" in costs:
        steps = costs["draft_step_ms_by_device"]
        best = min(steps, key=steps.get)
        prediction["draft_device"] = best
        say(f"draft device: {best} (a step: " + ", ".join(f"{d} {ms:.1f} ms" for d, ms in steps.items()) + ")")
    if "draft_length" in prediction:
        say(describe_prediction(prediction))
    ok = invariant and all(r["identical"] == r["runs"] for r in exact.values())
    memory["peak_rss_mib"] = peak_rss_mib()
    say(f"peak memory of this process (the engine, its sessions and the checks): {memory['peak_rss_mib']:.0f} MiB")
    return {"bundle": str(bundle), "placement": vars(engine.placement), "precision": target.precision,
            "kv_cache": target.kv_cache, "long_prompts": long_prompts, "block_invariant": invariant,
            "exactness": exact, "costs": costs,
            "prediction": prediction, "memory": memory, "ok": ok, "seconds": time.perf_counter() - start}


def long_prompt_line(engine: Engine) -> str:
    """How prompts of SEQUENCES_AFTER tokens or more are prefilled (EngineConfig.long_prompt_precision), and why not
    on a copy where the setting allowed one."""
    target, asked = engine.target_model, engine.config.long_prompt_precision
    head = f"long prompts ({SEQUENCES_AFTER}+ tokens, --long-prompt-precision {asked}): prefilled "
    if target.prefill is not None:
        return head + f"on a {target.prefill_precision} copy of the target"
    return head + "on the target" + (f" ({target.prefill_note})" if target.prefill_note else "")


def simulated_or_error(engine: Engine, prompts: list[str], sampling, say: Callable[[str], None]) -> dict:
    """simulate_default's prediction (greedy, or this sampled decoding), told; its error instead where it fails
    (the exactness report stands without it)."""
    try:
        simulated = simulate_default(engine, prompts, SPEED_TOKENS, sampling)
    except EdgeSpecdecError as exc:
        say(f"simulated rounds: not available ({exc})")
        return {"error": str(exc)}
    say(describe_simulated(simulated))
    return simulated


def peak_rss_mib() -> float:
    """The peak resident memory of this process so far (MiB; Linux and macOS count it in different units)."""
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024


def memory_report(engine: Engine) -> dict:
    """The target's KV cache per token (bytes, None where the device keeps the cache) and its element type."""
    target = engine.target_model
    return {"kv_cache": target.kv_cache, "kv_bytes_per_token": target.kv_bytes_per_token}
