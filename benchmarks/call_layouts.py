"""How a call's tokens are laid out for paged attention: what each layout costs after a long past, and whether
its rows keep their bits.

The CPU plugin's PagedAttention runs a call through one of two loops. When every sequence of the call has one
query token and there are fewer sequences than threads, it takes its single-token loop (the one a one-token
decode step takes, as OpenVINO GenAI's does), which splits each sequence's past across threads and sums the
partial results in an order that depends on the thread count. Otherwise it takes its mixed loop, which re-lays
the whole past of every sequence with more than one query token into scratch buffers on every call (our
exact decode step, a 2-token call, pays that) and gives each one-token sequence a kernel of its own that sums
over the past in block order on one thread.

Layouts timed, interleaved round by round, after each past:

- block n: today's call, the n tokens as one sequence (q_len = n), the mixed loop's multi-token kernel;
- block 1: a one-token call, GenAI's decode step (not block-invariant: a lone row takes other matmul kernels);
- seqs n/GUARD: the n tokens as n sequences of one token each over the same block table (past lengths p, p+1,
  ..., p+n-1), so that each takes the mixed loop's one-token kernel and nothing re-lays the past. GUARD keeps
  the mixed loop whatever the thread count: "none" (no guard), "q2" (one more sequence of two pad tokens on a
  scratch block, with no past: a sequence of more than one token always selects the mixed loop), "q1" (pad
  sequences of one token on a scratch block until there are as many sequences as threads, and at least 2 rows),
  "hk" (such pads until there are more sequences than threads: the mixed loop then hands each kernel the query
  heads of one key/value head together, which read the past once, instead of one query head each).

Printed per layout and past: the median wall time, the fastest, and the median CPU time of the process (all its
threads; the steadiest of the three when other processes share the cores), each with its ratio to block 2.

Bit checks (each a yes/no with the largest difference where no), after a past saved once and restored before
every call, so that every layout and thread count sees the same key/value bytes:

- across n: the row of the same token at the same position from seqs calls of n = 1..8 and 64 tokens;
- across guards, and against block calls (expected to differ: another attention kernel);
- key/value slots: the same tokens fed as seqs calls of 2 and of 5 tokens leave the same bytes in the cache,
  and a later call sees the same rows;
- across thread counts (--threads): the same rows from models compiled with each INFERENCE_NUM_THREADS. The CPU
  plugin runs at most as many threads as the machine has cores (it says so): the single-token loop's hazard, more
  threads than sequences with no guard, shows only on a machine with more cores than a call has tokens.

The target is opened as the runtime opens it (open_model at --precision dq, the CPU profile's properties, an f16
KV cache), its block-invariance probe skipped. The past is made by probes.fill_past (a short real prefill whose
blocks are copied along the table). On a shared machine, times are noisy: read ratios, and the load average
printed with them.

    python benchmarks/call_layouts.py /root/bundles/real-pair --pasts 2048 4096 8192 --rounds 15 --threads 1 2 4
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import openvino as ov

from edge_specdec.runtime.devices import compile_config
from edge_specdec.runtime.graph import LOGITS_ROWS
from edge_specdec.runtime.probes import fill_past
from edge_specdec.runtime.session import open_model

GUARDS = ("none", "q2", "q1", "hk")
CHECK_SIZES = (1, 2, 3, 4, 5, 6, 7, 8, 64)
TIMED_SIZES = (2, 1, 5, 9, 17)  # a step of today (2), GenAI's (1), verification blocks of 4, 8 and 16 drafts


class Caller:
    """The real target's paged model on the CPU, compiled with a thread count (None: the runtime's default), and
    raw calls on it in each layout."""

    def __init__(self, model_xml: Path, threads: int | None, capacity: int):
        config = compile_config("CPU", None, threads)
        self.lm = open_model(model_xml, "CPU", precision="dq", config=config, known_invariant={"dq": True})
        self.threads = int(self.lm.compiled.get_property("INFERENCE_NUM_THREADS"))
        self.session = self.lm.session()
        self.session.reserve(capacity)
        self.pool, self.request = self.session.pool, self.session.request
        self.blocks = np.asarray(self.session.blocks, np.int32)
        self.block_size = self.session.block_size
        self.scratch = self.pool.allocate(1)[0]  # the pad sequences' block, outside the table
        self.picks_rows = self.session.picks_rows

    def close(self) -> None:
        del self.session, self.request, self.pool, self.lm

    # ---- the layouts -------------------------------------------------------------------------------------------
    def _run(self, ids, positions, past_lens, begins, table, table_begins, max_context, rows) -> np.ndarray:
        x = {"input_ids": np.asarray(ids, np.int64), "position_ids": np.asarray(positions, np.int64),
             "past_lens": np.asarray(past_lens, np.int32), "subsequence_begins": np.asarray(begins, np.int32),
             "block_indices": np.asarray(table, np.int32), "block_indices_begins": np.asarray(table_begins, np.int32),
             "max_context_len": np.asarray(max_context, np.int32)}
        if self.picks_rows:
            x[LOGITS_ROWS] = np.asarray(rows, np.int64)
        for name, array in x.items():
            self.request.set_tensor(name, ov.Tensor(array, shared_memory=True))
        self.request.infer()
        logits = self.request.get_tensor("logits").data
        return logits.reshape(len(logits), -1).copy()

    def block(self, tokens: list[int], past: int) -> np.ndarray:
        """Today's call: one sequence of n tokens; the logits of all of them (at least 2 rows computed)."""
        n = len(tokens)
        used = -(-(past + n) // self.block_size)
        rows = list(range(n)) if n >= 2 else [0]
        return self._run(tokens, range(past, past + n), [past], [0, n], self.blocks[:used], [0, used], past + n, rows)

    def pads(self, n: int, guard: str) -> list[int]:
        """The q_len of each pad sequence a guard adds to a call of n one-token sequences."""
        if guard == "q2":
            return [2]
        if guard == "q1":
            return [1] * max(0, self.threads - n, 2 - n)
        if guard == "hk":  # more sequences than threads: the mixed loop then gives each kernel a whole group of
            return [1] * max(0, self.threads + 1 - n, 2 - n)  # query heads, which reads the keys once per group
        return []

    def seqs(self, tokens: list[int], past: int, guard: str) -> np.ndarray:
        """The n tokens as n one-token sequences over the same block table, plus the guard's pad sequences on the
        scratch block; the logits of the n tokens (and of pad rows when fewer than 2 rows would be computed)."""
        n = len(tokens)
        ids, positions, past_lens, begins = list(tokens), list(range(past, past + n)), [], [0]
        table, table_begins = [], [0]
        for i in range(n):
            used = -(-(past + i + 1) // self.block_size)
            past_lens.append(past + i)
            begins.append(i + 1)
            table.extend(self.blocks[:used])
            table_begins.append(len(table))
        for q in self.pads(n, guard):  # pad sequences: token 0 at positions 0..q-1 of the scratch block, no past
            ids += [0] * q
            positions += list(range(q))
            past_lens.append(0)
            begins.append(begins[-1] + q)
            table.append(self.scratch)
            table_begins.append(len(table))
        rows = list(range(max(n, min(2, len(ids)))))
        return self._run(ids, positions, past_lens, begins, table, table_begins, past + n, rows)[:n]

    # ---- the cache ---------------------------------------------------------------------------------------------
    def snapshot(self) -> dict[str, np.ndarray]:
        return {name: self.pool.tensors[name].data.copy() for name in self.pool.names}

    def load(self, saved: dict[str, np.ndarray]) -> None:
        for name in self.pool.names:
            self.pool.tensors[name].data[:] = saved[name]

    def restore(self, saved: dict[str, np.ndarray], start: int, end: int) -> None:
        """Put back the saved bytes of the blocks that hold slots start..end-1 (what calls there overwrote)."""
        ids = self.blocks[start // self.block_size:-(-end // self.block_size)]
        for name in self.pool.names:
            self.pool.tensors[name].data[ids] = saved[name][ids]

    def slots(self, start: int, end: int) -> list[np.ndarray]:
        """The cache bytes of slots start..end-1, every layer, keys and values."""
        out = []
        for name in self.pool.names:
            data = self.pool.tensors[name].data
            for s in range(start, end):
                out.append(np.array(data[self.blocks[s // self.block_size], :, s % self.block_size]))
        return out


def same(a: np.ndarray, b: np.ndarray) -> str:
    if a.shape == b.shape and np.array_equal(a, b):
        return "yes"
    return f"NO (max diff {float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))):.2e})"


def all_same(rows: list[np.ndarray]) -> str:
    worst = next((same(rows[0], r) for r in rows[1:] if same(rows[0], r) != "yes"), "yes")
    return worst


def bit_checks(caller: Caller, saved: dict, pasts: list[int], tokens: list[int]) -> dict:
    """The rows of each layout at each past (the cache restored before each call), and the slot checks."""
    rows: dict = {}
    report: list[tuple[str, str]] = []
    for past in pasts:
        def fresh(n):
            caller.restore(saved, past, past + n + 1)
        for guard in GUARDS:
            for n in CHECK_SIZES:
                fresh(n)
                rows[(past, "seqs", guard, n)] = caller.seqs(tokens[:n], past, guard)
        for n in (2, 5, 64):
            fresh(n)
            rows[(past, "block", "", n)] = caller.block(tokens[:n], past)
        # across n, per guard: row j of every call that holds token j
        for guard in GUARDS:
            sizes = [n for n in CHECK_SIZES if n >= 2 or guard != "none"]  # a lone row takes other matmuls
            verdicts = [all_same([rows[(past, "seqs", guard, n)][j] for n in sizes if n > j]) for j in range(8)]
            bad = [v for v in verdicts if v != "yes"]
            report.append((f"past {past}, seqs/{guard}: rows equal across n = {sizes}", bad[0] if bad else "yes"))
        ref = rows[(past, "seqs", "q2", 64)]
        for guard in ("none", "q1", "hk"):
            report.append((f"past {past}, seqs/{guard} n=64 rows equal to seqs/q2 n=64",
                           same(rows[(past, "seqs", guard, 64)], ref)))
        report.append((f"past {past}, block n=64 rows equal to seqs/q2 n=64 (another kernel: expected NO)",
                       same(rows[(past, "block", "", 64)], ref)))
        report.append((f"past {past}, block n=2 rows equal to block n=64 rows (today's invariance)",
                       same(rows[(past, "block", "", 2)], rows[(past, "block", "", 64)][:2])))
        # key/value slots: 10 tokens as seqs calls of 2 and of 5, then a later call of 3
        for guard in ("q2",):
            written, later = [], []
            for step in (2, 5, 1):
                caller.restore(saved, past, past + 16)
                for start in range(0, 10, step):
                    caller.seqs(tokens[start:start + step], past + start, guard)
                written.append(caller.slots(past, past + 10))
                later.append(caller.seqs(tokens[10:13], past + 10, guard))
            kv = all(all(np.array_equal(a, b) for a, b in zip(written[0], w)) for w in written[1:])
            report.append((f"past {past}, K/V slots of 10 tokens fed as seqs/{guard} calls of 2, 5 and 1: equal",
                           "yes" if kv else "NO"))
            report.append((f"past {past}, a later call of 3 after them: rows equal", all_same(later)))
        caller.restore(saved, past, past + 80)  # the next past sees the saved bytes only
    return {"rows": rows, "report": report}


def label(kind: str, guard: str, n: int) -> str:
    return f"block {n}" if kind == "block" else f"seqs {n}/{guard}"


def time_layouts(caller: Caller, pasts: list[int], rounds: int, prefill_rounds: int, tokens: list[int],
                 only: set[str]) -> dict:
    """Per (past, layout): the wall seconds and the process's CPU seconds of each timed call, interleaved round by
    round. Each visit makes 3 calls of the same layout and times the last 2 (the first pays the change of shape
    from the layout before)."""
    variants = [("block", "", n) for n in TIMED_SIZES]
    variants += [("seqs", g, n) for n in TIMED_SIZES for g in GUARDS if not (n == 1 and g == "none")]
    long_variants = [("block", "", 64), ("seqs", "q2", 64)]
    if only:
        variants = [v for v in variants if label(*v) in only or v == ("block", "", 2)]
        long_variants = [v for v in long_variants if label(*v) in only]
    wall: dict = {}
    cpu: dict = {}

    def visit(kind, guard, n, past):
        for i in range(3):
            start, start_cpu = time.perf_counter(), time.process_time()
            if kind == "block":
                caller.block(tokens[:n], past)
            else:
                caller.seqs(tokens[:n], past, guard)
            if i:
                wall.setdefault((past, kind, guard, n), []).append(time.perf_counter() - start)
                cpu.setdefault((past, kind, guard, n), []).append(time.process_time() - start_cpu)

    for r in range(rounds):
        for past in pasts:
            for v in variants:
                visit(*v, past)
            if r < prefill_rounds:
                for v in long_variants:
                    visit(*v, past)
        print(f"  round {r + 1}/{rounds} done, load {load()}", flush=True)
    return {"median wall": {k: statistics.median(v) for k, v in wall.items()},
            "fastest wall": {k: min(v) for k, v in wall.items()},
            "median CPU time (all threads)": {k: statistics.median(v) for k, v in cpu.items()}}


def print_table(title: str, values: dict, pasts: list[int]) -> None:
    print(f"\n{title}, ms, and the ratio to today's 2-token call (block 2)")
    keys = sorted({key[1:] for key in values}, key=lambda k: (k[2], k[0], k[1]))
    print("| layout | " + " | ".join(f"past {past}" for past in pasts) + " |")
    print("|---" * (len(pasts) + 1) + "|")
    for kind, guard, n in keys:
        cells = []
        for past in pasts:
            t, base = values.get((past, kind, guard, n)), values.get((past, "block", "", 2))
            cells.append(f"{1000 * t:.1f} ({t / base:.2f}x)" if t is not None and base else "")
        print(f"| {label(kind, guard, n)} | " + " | ".join(cells) + " |")


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n    python")[0],
                                epilog="Example: python benchmarks/call_layouts.py /root/bundles/real-pair "
                                       "--pasts 2048 4096 8192 --rounds 15 --threads 1 2 4",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bundle", type=Path, help="a bundle folder (its target/openvino_model.xml is opened)")
    p.add_argument("--pasts", type=int, nargs="+", default=[64, 2048, 4096, 8192],
                   help="past lengths to time and check after (rounded down to whole KV blocks)")
    p.add_argument("--rounds", type=int, default=15, help="interleaved timing rounds (medians over them)")
    p.add_argument("--prefill-rounds", type=int, default=5,
                   help="of those rounds, how many also time a 64-token call in each layout (slow at long pasts)")
    p.add_argument("--threads", type=int, nargs="*", default=[1, 2, 4],
                   help="INFERENCE_NUM_THREADS values whose rows are compared bit for bit (capped at the cores)")
    p.add_argument("--timing-threads", type=int, default=0,
                   help="INFERENCE_NUM_THREADS for the timing (0: the runtime's default for this machine)")
    p.add_argument("--no-timing", action="store_true", help="only the bit checks")
    p.add_argument("--no-checks", action="store_true", help="only the timing")
    p.add_argument("--only", nargs="*", default=[],
                   help='time only these layouts (as the table names them: "block 1", "seqs 1/q2", "seqs 64/q2"; '
                        "block 2, the reference, always)")
    args = p.parse_args()
    xml = args.bundle / "target" / "openvino_model.xml"
    if not xml.is_file():
        p.error(f"no target model at {xml}: give a bundle folder (one with target/openvino_model.xml)")
    top = max(args.pasts)
    capacity = top + 2 * 64 + 64
    rng = np.random.default_rng(7)
    print(f"load before: {load()}", flush=True)

    main_caller = Caller(xml, args.timing_threads or None, capacity)
    fill_past(main_caller.session, top)
    filled = main_caller.session.length
    pasts = sorted({min(past // main_caller.block_size * main_caller.block_size, filled) for past in args.pasts})
    tokens = rng.integers(100, 30000, 80).tolist()
    saved = main_caller.snapshot()
    print(f"model opened with INFERENCE_NUM_THREADS={main_caller.threads}; past filled to {filled}; pasts {pasts}",
          flush=True)

    if not args.no_timing:
        tables = time_layouts(main_caller, pasts, args.rounds, args.prefill_rounds, tokens, set(args.only))
        print(f"\nload after timing: {load()}; INFERENCE_NUM_THREADS={main_caller.threads}; {args.rounds} "
              f"interleaved rounds (64-token calls: {args.prefill_rounds}), 2 timed calls per layout and round")
        for title, values in tables.items():
            print_table(title, values, pasts)
    main_caller.restore(saved, 0, capacity)

    if args.no_checks:
        return
    print("\nBit checks", flush=True)
    results = {main_caller.threads: bit_checks(main_caller, saved, pasts, tokens)}
    for line, verdict in results[main_caller.threads]["report"]:
        print(f"  threads {main_caller.threads}: {line}: {verdict}")
    main_caller.close()
    for threads in args.threads:
        if threads in results:
            continue
        caller = Caller(xml, threads, capacity)
        if caller.threads != threads:  # the CPU plugin caps the threads at the machine's cores
            print(f"  INFERENCE_NUM_THREADS={threads} asked, the model runs {caller.threads}: its rows are those of "
                  f"{caller.threads} threads (more threads than sequences cannot be tried on this machine)")
        caller.load(saved)
        results[threads] = bit_checks(caller, saved, pasts, tokens)
        for line, verdict in results[threads]["report"]:
            print(f"  threads {threads}: {line}: {verdict}", flush=True)
        caller.close()
    base = next(iter(results))
    for threads in list(results)[1:]:
        for past in pasts:
            for guard in GUARDS:
                a = [results[base]["rows"][(past, "seqs", guard, n)] for n in CHECK_SIZES]
                b = [results[threads]["rows"][(past, "seqs", guard, n)] for n in CHECK_SIZES]
                bad = [same(x, y) for x, y in zip(a, b) if same(x, y) != "yes"]
                print(f"  past {past}, seqs/{guard}, n = {CHECK_SIZES}: rows at {threads} threads equal to "
                      f"{base} threads: {bad[0] if bad else 'yes'}")
            a, b = (results[t]["rows"][(past, "block", "", 64)] for t in (base, threads))
            print(f"  past {past}, block 64: rows at {threads} threads equal to {base} threads: {same(a, b)}")
    print(f"load at the end: {load()}")


if __name__ == "__main__":
    main()
