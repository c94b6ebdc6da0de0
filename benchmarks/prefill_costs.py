"""What a long prompt's prefill costs by the size of the calls it is fed in, at each CPU precision, and which call
sizes keep the rows' bits.

An exact session feeds a prompt in even pieces of at most its longest block (session.py, "Long blocks"): every call
then has sizes the block-invariance check covers. This script measures, on the real target:

- times: the prefill of a TOKENS-token prompt (random ids) in even pieces of each --pieces size (0: one call), at
  each --precisions, interleaved (each repeat visits every variant, the order rotating), after one uncounted
  prefill per variant. Prints the median ms per token, the ratio to one call at the same precision and to dq's
  one call, and the ms per token of the first and last quarter of the prompt (paged attention's cost of the past).
- bits: after a 40-token prompt, the rows of a block of n tokens against the same tokens fed in pieces of 8, for
  n up to 256 (--bits-sizes), at each precision: "equal" or the largest difference;
- the runtime's own probes at each precision: the longest exact call (probes.longest_exact_call), then the check
  (probes.passes_block_invariance) with calls of at most that many tokens;
- --profile N: the CPU plugin's per-operation times of one call of N tokens after a 1024-token past (matmuls
  against attention), at each precision.
- --prefill-copy PRECISION: instead of all the above, the runtime's own long-prompt prefill copy (the Pipeline of
  `edge-specdec bench long-prompts` with --long-prompt-precision PRECISION, session.py, "A long prompt's prefill in
  bf16"): the time to the first token of a TOKENS-token prompt with the copy's calls cut at each --pieces size in
  turn (its prefill_longest), its pieces aligned to each --aligns multiple (its prefill_align; 1: even pieces) and
  a call padded up to it by at most each --pads fraction of it (session.PREFILL_PAD_MOST; 0: no pads), interleaved,
  and whether every variant wrote the same tokens. With --call-sizes, instead: one call on the copy of each size
  after a past of --past tokens, and whether padding it up to the next multiple of its alignment would save time
  (what session.PREFILL_PAD_MOST is chosen from).

Precisions: dq and f32 as the runtime sets them (devices.CPU_PRECISIONS), bf16 = INFERENCE_PRECISION_HINT bf16
(what OpenVINO GenAI runs on CPUs with AMX or AVX-512 BF16), with the dynamic quantization of dq. The machine's
load average is printed before and after: read only the ratios of a run on a busy machine.

    python benchmarks/prefill_costs.py /root/bundles/real-pair --tokens 2048 --pieces 32 64 128 256 0 \\
        --precisions dq f32 bf16 --repeats 3
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import numpy as np
import openvino as ov

from edge_specdec.bundle import load_bundle
from edge_specdec.runtime.devices import PREFILL_PRECISIONS, compile_config, profile
from edge_specdec.runtime.graph import int4_group_size
from edge_specdec.runtime.probes import longest_exact_call, passes_block_invariance
from edge_specdec.runtime.session import LONGEST_BLOCK, PREFILL_ALIGN, PREFILL_PAD_MOST, open_model

# name -> (the runtime precision whose properties it starts from, properties laid over them)
PRECISIONS = {
    "dq": ("dq", {}),
    "f32": ("f32", {}),
    "bf16": ("dq", {"INFERENCE_PRECISION_HINT": "bf16"}),
}
BITS_SIZES = (12, 16, 32, 48, 64, 80, 84, 96, 112, 128, 160, 192, 224, 256)


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def open_precision(core: ov.Core, model_xml: Path, name: str, threads: int):
    """The target compiled as the runtime compiles it, at one precision (its probes skipped: this script runs them)."""
    base, extra = PRECISIONS[name]
    config = {**compile_config("CPU", None, threads), **extra}
    model = open_model(model_xml, "CPU", core=core, precision=base, config=config, known_invariant={base: True},
                       known_longest={base: LONGEST_BLOCK})
    hint = model.compiled.get_property("INFERENCE_PRECISION_HINT")
    return model, str(hint)


def even_pieces(n: int, piece: int) -> list[tuple[int, int]]:
    """The bounds of n tokens cut in even pieces of at most `piece` tokens (session._feed_in_pieces' cut)."""
    if piece <= 0 or n <= piece:
        return [(0, n)]
    count = -(-n // piece)
    bounds = np.linspace(0, n, count + 1).round().astype(int)
    return list(zip(bounds[:-1].tolist(), bounds[1:].tolist()))


def prefill(session, tokens: list[int], piece: int) -> tuple[list[tuple[int, float]], float]:
    """Feed tokens into the emptied session in even pieces, each call alone (its 2 last rows' logits, as an exact
    session computes); the (tokens, wall seconds) of each call, and the CPU seconds of the process over all of them
    (every thread's: on a machine other jobs share, the work done, which their competition inflates less than the
    wall time)."""
    session.reset()
    calls = []
    cpu = time.process_time()
    for start, end in even_pieces(len(tokens), piece):
        began = time.perf_counter()
        session.feed(tokens[start:end], rows=2)
        calls.append((end - start, time.perf_counter() - began))
    return calls, time.process_time() - cpu


def quarter_ms(calls: list[tuple[int, float]], first: bool) -> float:
    """ms per token of the calls in the first (or last) quarter of the prompt."""
    total, seen, ms, count = sum(n for n, _ in calls), 0, 0.0, 0
    for n, seconds in calls:
        inside = seen < total / 4 if first else seen >= 3 * total / 4
        if inside or len(calls) == 1:
            ms, count = ms + seconds * 1000, count + n
        seen += n
    return ms / count


def times(models: dict, tokens: list[int], pieces: list[int], repeats: int, verbose: bool = True) -> None:
    variants = [(name, piece) for name in models for piece in pieces]
    per_token = {v: [] for v in variants}
    first_q = {v: [] for v in variants}
    last_q = {v: [] for v in variants}
    cpu_ms = {v: [] for v in variants}
    sessions = {name: model.session() for name, model in models.items()}
    for name in models:
        sessions[name].block_invariant = False  # the script cuts the pieces itself; a call is never re-cut
    for r in range(repeats + 1):
        order = variants[r % len(variants):] + variants[:r % len(variants)]
        for name, piece in order:
            calls, cpu = prefill(sessions[name], tokens, piece)
            if verbose:
                print(f"    {name} in pieces of {piece or 'one call'}: {sum(s for _, s in calls):.2f} s "
                      f"(CPU {cpu:.2f} s)", flush=True)
            if r == 0:
                continue  # uncounted: each variant's call sizes prepared once
            per_token[name, piece].append(sum(s for _, s in calls) * 1000 / len(tokens))
            first_q[name, piece].append(quarter_ms(calls, True))
            last_q[name, piece].append(quarter_ms(calls, False))
            cpu_ms[name, piece].append(cpu * 1000 / len(tokens))
        print(f"  repeat {r}{' (uncounted)' if r == 0 else ''} done, load average {loadavg()}", flush=True)
    med = {v: statistics.median(x) for v, x in per_token.items()}
    cpu = {v: statistics.median(x) for v, x in cpu_ms.items()}
    print(f"\nprefill of {len(tokens)} tokens: median ms per token over {repeats} repeats (wall; CPU: the process's "
          f"CPU ms per token, all threads)")
    print(f"{'precision':>9} {'piece':>6} {'ms/token':>9} {'vs one call':>12} {'vs dq one call':>15} "
          f"{'first 1/4':>10} {'last 1/4':>9} {'prompt s':>9} {'CPU ms/tok':>11} {'CPU vs one':>11}")
    reference = med.get(("dq", 0))
    for name, piece in variants:
        one = med.get((name, 0))
        ratio = f"{med[name, piece] / one:.3f}x" if one else "-"
        vs_dq = f"{med[name, piece] / reference:.3f}x" if reference else "-"
        print(f"{name:>9} {piece or 'one':>6} {med[name, piece]:>9.3f} {ratio:>12} {vs_dq:>15} "
              f"{statistics.median(first_q[name, piece]):>10.3f} {statistics.median(last_q[name, piece]):>9.3f} "
              f"{med[name, piece] * len(tokens) / 1000:>9.2f} {cpu[name, piece]:>11.3f} "
              f"{(f'{cpu[name, piece] / cpu[name, 0]:.3f}x' if (name, 0) in cpu else '-'):>11}")


def bits(models: dict, sizes: list[int], prompt_tokens: int = 40) -> None:
    """Rows of one block of n tokens against the same tokens in pieces of 8, after a prompt."""
    rng = np.random.default_rng(3)
    longest = max(sizes)
    print(f"\nbits: rows of one call of n tokens against the same tokens in calls of 8, after a {prompt_tokens}-token "
          f"prompt ('equal' = bit for bit; else the largest difference)")
    print(f"{'n':>5} " + " ".join(f"{name:>10}" for name in models))
    rows = {}
    for name, model in models.items():
        vocab = model.vocab_size
        prompt = rng.integers(0, vocab, prompt_tokens).tolist()
        block = rng.integers(0, vocab, longest).tolist()
        session = model.session()
        session.block_invariant = False  # each feed below is one call
        for start in range(0, prompt_tokens, 8):
            session.feed(prompt[start:start + 8])
        reference = np.concatenate([session.feed(block[i:i + 8]) for i in range(0, longest, 8)])
        session.rollback(longest)
        for n in sizes:
            whole = session.feed(block[:n])
            session.rollback(n)
            diff = float(np.max(np.abs(whole - reference[:n])))
            rows[name, n] = "equal" if np.array_equal(whole, reference[:n]) else f"{diff:.1e}"
    for n in sizes:
        print(f"{n:>5} " + " ".join(f"{rows[name, n]:>10}" for name in models))


def checks(models: dict) -> None:
    print("\nthe runtime's probes at load: the longest exact call (longest_exact_call), then the check with calls of at "
          "most that many tokens (passes_block_invariance: empty cache, after a 160-token prefill, after 8192 tokens)")
    for name, model in models.items():
        session = model.session()
        began = time.perf_counter()
        session.longest_call = longest = longest_exact_call(session)
        verdict = passes_block_invariance(session)
        print(f"{name:>9}: longest exact call {longest} tokens, {'block-invariant' if verdict else 'NOT block-invariant'}"
              f" ({time.perf_counter() - began:.1f} s)")


def profile_call(core, model_xml: Path, models: dict, n: int, threads: int) -> None:
    """Per-operation-type time of one call of n tokens after a 1024-token past (PERF_COUNT on a fresh compile)."""
    print(f"\nprofile: one call of {n} tokens after a 1024-token past, ms by operation type")
    rng = np.random.default_rng(5)
    for name in models:
        base, extra = PRECISIONS[name]
        config = {**compile_config("CPU", None, threads), **extra, "PERF_COUNT": True}
        model = open_model(model_xml, "CPU", core=core, precision=base, config=config, known_invariant={base: True},
                           known_longest={base: LONGEST_BLOCK})
        session = model.session()
        session.block_invariant = False
        prompt = rng.integers(0, model.vocab_size, 1024 + n).tolist()
        for start in range(0, 1024, 256):
            session.feed(prompt[start:start + 256], rows=1)
        for _ in range(2):  # the second call is the one profiled (the first prepares its shape)
            session.feed(prompt[1024:1024 + n], rows=2)
            session.rollback(n)
        by_type: dict[str, float] = {}
        for info in session.request.profiling_info:
            key = info.node_type
            by_type[key] = by_type.get(key, 0.0) + info.real_time.total_seconds() * 1000
        total = sum(by_type.values())
        top = sorted(by_type.items(), key=lambda kv: -kv[1])[:6]
        print(f"{name:>9}: {total:.1f} ms: " + ", ".join(f"{k} {v:.1f}" for k, v in top))


def copy_times(bundle: str, precision: str, length: int, pieces: list[int], aligns: list[int], pads: list[float],
               repeats: int) -> None:
    """--prefill-copy: the first token of one prompt through the runtime's prefill copy, its calls cut at each size,
    aligned to each multiple and padded up to it by at most each fraction of it."""
    from edge_specdec.benchmark.suites.long_prompts import ours_pipeline
    from edge_specdec.runtime import GenerationConfig
    from edge_specdec.runtime import session as session_module

    pipe = ours_pipeline(bundle, long_prompt_precision=precision)  # as the long-prompts suite runs it
    model = pipe.target_model
    if model.prefill is None:
        raise SystemExit(f"no {precision} prefill copy: {pipe.long_prompt_note}")
    tokens = np.random.default_rng(0).integers(100, 20000, length).tolist()
    # as many new tokens as the long-prompt suite: the session then holds blocks past the prompt for a pad to go into
    config = GenerationConfig(max_new_tokens=64, temperature=0, ignore_eos=True)
    variants = [(n, align, pad) for n in pieces for align in aligns for pad in pads]
    seconds: dict[tuple, list[float]] = {variant: [] for variant in variants}
    outputs: dict[tuple, list[int]] = {}
    for r in range(repeats + 1):  # repeat 0 uncounted
        for variant in variants[r % len(variants):] + variants[:r % len(variants)]:
            model.prefill_longest, model.prefill_align, session_module.PREFILL_PAD_MOST = variant
            result = pipe.generate(tokens, config, algorithm="none")
            outputs.setdefault(variant, list(result.token_ids))
            if r:
                seconds[variant].append(result.stats.first_token_seconds)
        print(f"  repeat {r}{' (uncounted)' if r == 0 else ''} done, load average {loadavg()}", flush=True)
    print(f"\nthe {precision} prefill copy, a {length}-token prompt: median seconds to the first token over {repeats} "
          f"repeats, by the most tokens a call on the copy holds, the multiple its pieces are aligned to and the "
          f"most a call is padded up to it (a fraction of it)")
    for n, align, pad in variants:
        runs = seconds[n, align, pad]
        print(f"{n:>6} aligned to {align:>4}, padded by at most {pad:.2f}: {statistics.median(runs):.2f} s  "
              f"({' '.join(f'{x:.2f}' for x in runs)})")
    print(f"the same tokens in every variant: {len({tuple(v) for v in outputs.values()}) == 1}")


def copy_call_times(bundle: str, precision: str, past: int, sizes: list[int], repeats: int) -> None:
    """--prefill-copy with --call-sizes: one call on the copy of each size after `past` tokens (random ids, no pads),
    the sizes interleaved, after one uncounted round; each size's median time against that of the multiple of the
    copy's alignment it would be padded up to."""
    from edge_specdec.benchmark.suites.long_prompts import ours_pipeline
    from edge_specdec.runtime import session as session_module

    pipe = ours_pipeline(bundle, long_prompt_precision=precision)
    model = pipe.target_model
    if model.prefill is None:
        raise SystemExit(f"no {precision} prefill copy: {pipe.long_prompt_note}")
    align = model.prefill_align
    session_module.PREFILL_PAD_MOST = 0.0  # each call as long as asked
    padded = {n: -(-n // align) * align for n in sizes}  # the call a pad makes of each size
    sizes = sorted(set(sizes) | set(padded.values()))
    if max(sizes) > model.prefill_longest:
        raise SystemExit(f"--call-sizes: the copy's calls hold at most {model.prefill_longest} tokens")
    rng = np.random.default_rng(0)
    session = pipe.session().target
    session.reserve(past + max(sizes))
    session.begin_long_prefill()  # every call on the copy
    session.feed(rng.integers(100, 20000, past).tolist(), rows=1)
    seconds: dict[int, list[float]] = {n: [] for n in sizes}
    for r in range(repeats + 1):  # round 0 uncounted
        for n in sizes if r % 2 else sizes[::-1]:
            tokens = rng.integers(100, 20000, n).tolist()
            start = time.perf_counter()
            session.feed(tokens, rows=1)
            if r:
                seconds[n].append(time.perf_counter() - start)
            session.rollback(n)
        print(f"  round {r}{' (uncounted)' if r == 0 else ''} done, load average {loadavg()}", flush=True)
    median = {n: statistics.median(v) for n, v in seconds.items()}
    print(f"\nthe {precision} prefill copy: one call after a past of {past} tokens, median ms over {repeats} rounds, "
          f"against the call of the next multiple of {align} tokens (the call a pad makes of it)")
    for n in sizes:
        up = padded.get(n, n)
        verdict = "" if up == n else (f"; padded to {up}: {median[up] * 1000:.0f} ms, "
                                      f"{'saves' if median[up] < median[n] else 'costs'} "
                                      f"{abs(median[n] - median[up]) * 1000:.0f} ms")
        print(f"{n:>5} tokens: {median[n] * 1000:6.0f} ms ({median[n] / n * 1000:.2f} ms a token){verdict}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bundle", nargs="?", default="/root/bundles/real-pair", help="a bundle folder (its target)")
    parser.add_argument("--tokens", type=int, default=2048, help="the prompt's length for the times (default 2048)")
    parser.add_argument("--pieces", type=int, nargs="+", default=[32, 64, 128, 256, 0],
                        help="piece sizes to time; 0 = the whole prompt in one call (default 32 64 128 256 0)")
    parser.add_argument("--precisions", nargs="+", default=list(PRECISIONS), choices=list(PRECISIONS),
                        help="CPU precisions (default: all)")
    parser.add_argument("--repeats", type=int, default=3, help="counted repeats of the times (default 3)")
    parser.add_argument("--bits-sizes", type=int, nargs="*", default=list(BITS_SIZES),
                        help="block sizes for the bits (none: skip them)")
    parser.add_argument("--no-times", action="store_true", help="skip the times")
    parser.add_argument("--no-check", action="store_true", help="skip the runtime's check")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="also profile one call of N tokens per precision (0: no)")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="INFERENCE_NUM_THREADS (default: all)")
    parser.add_argument("--prefill-copy", choices=PREFILL_PRECISIONS, metavar="PRECISION",
                        help="instead: the runtime's long-prompt prefill copy at PRECISION, its first token with its "
                             "calls cut at each --pieces size (each above 0)")
    parser.add_argument("--aligns", type=int, nargs="+", default=[PREFILL_ALIGN],
                        help=f"with --prefill-copy: the multiples the copy's pieces are aligned to, in turn (1: even "
                             f"pieces; default {PREFILL_ALIGN}, the runtime's)")
    parser.add_argument("--pads", type=float, nargs="+", default=[PREFILL_PAD_MOST],
                        help=f"with --prefill-copy: the most a call on the copy is padded up to its alignment, a "
                             f"fraction of it, in turn (0: no pads; default {PREFILL_PAD_MOST}, the runtime's)")
    parser.add_argument("--call-sizes", type=int, nargs="+", metavar="N",
                        help="with --prefill-copy: instead of the first token, one call on the copy of each of these "
                             "sizes (and of the multiples of its alignment they round up to) after --past tokens")
    parser.add_argument("--past", type=int, default=1536, help="with --call-sizes: the past the calls follow "
                                                               "(default 1536)")
    args = parser.parse_args()
    if args.call_sizes and not args.prefill_copy:
        parser.error("--call-sizes times calls on the prefill copy: give --prefill-copy PRECISION too")
    if args.call_sizes:
        if min(args.call_sizes) < 8 or args.past < 1:
            parser.error("--call-sizes takes sizes of at least 8 tokens (the copy's fewest), after a --past of at "
                         "least 1")
        copy_call_times(args.bundle, args.prefill_copy, args.past, args.call_sizes, args.repeats)
        return
    if args.prefill_copy:
        if min(args.pieces) <= 0:
            parser.error("--prefill-copy takes --pieces sizes above 0 (the copy's calls are cut at each)")
        if min(args.aligns) <= 0:
            parser.error("--aligns takes multiples above 0 (1: even pieces)")
        if not all(0 <= pad < 1 for pad in args.pads):
            parser.error("--pads takes fractions from 0 (no pads) up to but not including 1")
        copy_times(args.bundle, args.prefill_copy, args.tokens, args.pieces, args.aligns, args.pads, args.repeats)
        return

    model_xml = load_bundle(args.bundle, verify=False).target.model_xml
    core = ov.Core()
    print(f"{core.get_property('CPU', 'FULL_DEVICE_NAME')}, openvino {ov.__version__}, {args.threads} threads, "
          f"load average {loadavg()}")
    group = int4_group_size(core.read_model(str(model_xml)))
    models = {}
    for name in args.precisions:
        began = time.perf_counter()
        models[name], hint = open_precision(core, model_xml, name, args.threads)
        print(f"{name}: compiled in {time.perf_counter() - began:.1f} s, INFERENCE_PRECISION_HINT {hint}, "
              f"properties {profile('CPU').precision_properties(PRECISIONS[name][0], group)} + {PRECISIONS[name][1]}",
              flush=True)
    tokens = np.random.default_rng(0).integers(0, min(m.vocab_size for m in models.values()), args.tokens).tolist()
    if args.bits_sizes:
        bits(models, sorted(args.bits_sizes))
    if not args.no_check:
        checks(models)
    if not args.no_times:
        times(models, tokens, args.pieces, args.repeats)
    if args.profile:
        profile_call(core, model_xml, models, args.profile, args.threads)
    print(f"\nload average at the end {loadavg()}")


if __name__ == "__main__":
    main()
