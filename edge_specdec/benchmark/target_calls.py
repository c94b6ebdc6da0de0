"""What the target's calls cost inside real decoding, for the long-prompts suite's --per-call and --profile.

--per-call: a run records each target pass (generate's record_target_calls, Stats.target_calls: its tokens, its
block on the device, the past it attends over, its seconds); `call_figures` sums a run's record up by kind of call
(the prefill, the target alone's one-token steps, verification blocks of k tokens) and `calls_markdown` tables it
by call size. --profile: the target's own infer request, compiled with OpenVINO's PERF_COUNT=YES, is read after each
call of one run (`NodeProfile`: get_profiling_info, each executed node's real time summed by node type and kind of
call, from the plugin's running means), beside the threads and streams the plugin reports for the compiled model
(`plugin_threads`); profiled runs are slower than plain ones, so they give shares of a call's time, not timings to
compare.
"""
from __future__ import annotations

import os
import statistics
from collections import Counter, defaultdict
from contextlib import contextmanager
from typing import Any, Iterator, Optional, Sequence

PREFILL = "prefill"
NODES_SHOWN = 12  # node types shown per profile table, by time (the rest summed as "other")


def call_kind(tokens: int, past: int, prompt: int) -> str:
    """A target call's kind: the prefill (it starts inside the prompt), a one-token step (the target alone's exact
    step), or a verification block of k tokens."""
    if past < prompt - 1:
        return PREFILL
    return "1-token step" if tokens == 1 else f"{tokens}-token block"


def call_figures(calls: Sequence[Sequence[float]], prompt: int) -> dict[str, Optional[float]]:
    """One run's record (TargetCall rows: tokens, block, past, seconds) summed up: the mean milliseconds of its
    one-token steps and of its verification blocks, the blocks' mean tokens and the mean past of the calls after
    the prefill (None where the run had no such call)."""
    decode = [c for c in calls if call_kind(c[0], c[2], prompt) != PREFILL]
    steps = [c for c in decode if c[0] == 1]
    blocks = [c for c in decode if c[0] > 1]

    def mean(values) -> Optional[float]:
        values = list(values)
        return statistics.fmean(values) if values else None
    step_ms, block_ms = mean(1000 * c[3] for c in steps), mean(1000 * c[3] for c in blocks)
    return {"step_ms": step_ms, "block_ms": block_ms, "block_tokens": mean(c[0] for c in blocks),
            "decode_past": mean(c[2] for c in decode)}


def calls_markdown(records: dict[str, dict[str, list]], prompts: dict[str, int]) -> str:
    """The per-call record of every row and cell (records[row][cell]: the runs' TargetCall rows) by kind of call:
    calls, the mean block on the device, the mean and median milliseconds, the past's range."""
    lines = ["## The target's calls (--per-call)", "",
             "Every target pass of the timed runs, by kind: the prefill (with the first proposal), the target alone's "
             "one-token steps and k-token verification blocks; block: the tokens of the call on the device (a "
             "widened block feeds cached tokens again); ms: the pass as Stats.target_seconds counts it (the call, "
             "the verification of its rows, the rollback).", "",
             "| row | cell | call | calls | block | mean ms | median ms | past |", "|---|---|---|---|---|---|---|---|"]
    for row, cells in records.items():
        for cell, runs in cells.items():
            kinds: dict[str, list] = defaultdict(list)
            for calls in runs:
                for c in calls:
                    kinds[call_kind(c[0], c[2], prompts[cell])].append(c)
            order = sorted(kinds, key=lambda k: (k != PREFILL, int(k.split("-")[0]) if k != PREFILL else 0))
            for kind in order:
                cs = kinds[kind]
                ms = [1000 * c[3] for c in cs]
                lines.append(f"| {row} | {cell} | {kind} | {len(cs)} | {statistics.fmean(c[1] for c in cs):.1f} | "
                             f"{statistics.fmean(ms):.2f} | {statistics.median(ms):.2f} | "
                             f"{min(c[2] for c in cs)}-{max(c[2] for c in cs)} |")
    return "\n".join(lines) + "\n"


@contextmanager
def counted_calls() -> Iterator[Counter]:
    """Counts the calls on the device of every paged session, by model (id of its CompiledLM; calls on a static copy,
    another compiled model, are left out), while the block runs: the plugin's per-node times are means over all
    the calls of a compiled model, so NodeProfile needs their number from its first call on (enter this before
    the Pipeline compiles)."""
    from ..runtime.session import PagedSession

    counts: Counter = Counter()
    original = PagedSession.infer_alone

    def counting(session, tokens, rows):
        if len(tokens) not in session.model.static:
            counts[id(session.model)] += 1
        return original(session, tokens, rows)
    PagedSession.infer_alone = counting
    try:
        yield counts
    finally:
        PagedSession.infer_alone = original


class NodeProfile:
    """OpenVINO's profile of a session's own calls, by kind of call and node type. The model must be compiled with
    PERF_COUNT=YES; the CPU plugin then reports for each node (get_profiling_info) its mean real time over every
    call of the compiled model so far, in whole microseconds, so a call's time in a node is its mean times the
    number of calls (`counts`, from counted_calls) after the call less the same before it: within that number of
    microseconds per node, a small error that averages out over many calls. Kinds: the prefill (the calls until
    the cache holds the prompt), else the call's block on the device. Attached by wrapping the session's call;
    detach() puts it back."""

    def __init__(self, session, prompt: int, counts: Counter):
        self.session, self.prompt, self.counts = session, prompt, counts
        self.key = id(session.model)
        self.seconds: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.calls: dict[str, int] = defaultdict(int)
        self.prefilled = False
        self._totals = self._read()
        self._infer = session._infer
        session._infer = self._profiled

    def _read(self) -> dict[str, float]:
        """Seconds spent so far in each node type over all the compiled model's calls (mean x calls)."""
        totals: dict[str, float] = defaultdict(float)
        for node in self.session.request.get_profiling_info():
            if node.status.name == "EXECUTED":
                totals[node.node_type] += node.real_time.total_seconds() * self.counts[self.key]
        return totals

    def _profiled(self, tokens, rows):
        past = self.session.length
        logits = self._infer(tokens, rows)
        kind = PREFILL if not self.prefilled else f"{len(tokens)}-token call"
        self.prefilled = self.prefilled or past + len(tokens) >= self.prompt
        totals = self._read()
        self.calls[kind] += 1
        for node, seconds in totals.items():
            self.seconds[kind][node] += seconds - self._totals.get(node, 0.0)
        self._totals = totals
        return logits

    def detach(self) -> None:
        self.session._infer = self._infer

    def summary(self) -> dict[str, Any]:
        """{kind: {"calls": n, "nodes": {node type: seconds summed}}}, kinds in the order they first ran."""
        return {kind: {"calls": self.calls[kind], "nodes": dict(self.seconds[kind])} for kind in self.calls}


def plugin_threads(compiled) -> dict[str, Any]:
    """What the plugin reports for a compiled model: its inference threads and streams (None where it does not
    say), and the CPUs this process may run on."""
    def read(name: str):
        try:
            return compiled.get_property(name)
        except RuntimeError:  # a device that does not report it
            return None
    threads, streams = read("INFERENCE_NUM_THREADS"), read("NUM_STREAMS")
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"inference_num_threads": None if threads is None else int(threads),
            "num_streams": None if streams is None else int(streams), "process_cpus": cpus}


def profile_markdown(profiles: list[dict]) -> str:
    """The profiles (one per cell and algorithm: "cell", "algorithm", "threads", "device", "calls") as tables: per
    kind of call, the milliseconds per call of each node type, the largest first."""
    lines = ["# edge-specdec bench long-prompts --profile", "",
             "The target's own infer request in one run of the decode loop, compiled with PERF_COUNT=YES: each "
             "executed node's real time (get_profiling_info after every call) summed by node type, in milliseconds "
             "per call of each kind. The plugin reports running means in whole microseconds, from which a call's "
             "time is taken back (NodeProfile): a node type of a few microseconds can come out slightly negative. "
             "Profiling slows the calls: read shares, not timings.", ""]
    for p in profiles:
        t = p["threads"]
        lines += [f"## {p['cell']}, {p['algorithm']}", "",
                  f"target on {p['device']}: INFERENCE_NUM_THREADS {t['inference_num_threads']}, NUM_STREAMS "
                  f"{t['num_streams']}, this process may run on {t['process_cpus']} CPUs", ""]
        kinds = list(p["calls"])
        totals: dict[str, float] = defaultdict(float)
        for kind in kinds:
            for node, seconds in p["calls"][kind]["nodes"].items():
                totals[node] += seconds
        nodes = sorted(totals, key=totals.get, reverse=True)
        shown, rest = nodes[:NODES_SHOWN], nodes[NODES_SHOWN:]
        lines += ["| node type | " + " | ".join(f"{k} ({p['calls'][k]['calls']} calls)" for k in kinds) + " |",
                  "|---|" + "---|" * len(kinds)]

        def per_call(kind: str, names) -> str:
            entry = p["calls"][kind]
            return f"{1000 * sum(entry['nodes'].get(n, 0.0) for n in names) / max(1, entry['calls']):.3f}"
        for node in shown:
            lines.append(f"| {node} | " + " | ".join(per_call(k, [node]) for k in kinds) + " |")
        if rest:
            lines.append("| other | " + " | ".join(per_call(k, rest) for k in kinds) + " |")
        lines += ["| **all nodes** | " + " | ".join(per_call(k, nodes) for k in kinds) + " |", ""]
    return "\n".join(lines)
