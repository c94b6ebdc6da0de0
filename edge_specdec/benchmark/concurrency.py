"""`edge-specdec bench BUNDLE --clients 1 2 4 8`: several clients at once, ours against serving them one after
another and against OpenVINO GenAI's continuous batching.

    edge-specdec bench BUNDLE --clients 1 2 4 8 [--genai-draft BUNDLE] [--genai-k K] [--categories CAT ...]
                              [--max-new-tokens 64] [--repeats 2] [--setups NAME|PATTERN ...] [--out DIR]

    from edge_specdec.benchmark.concurrency import run_clients_benchmark
    report = run_clients_benchmark("bundles/qwen+smollm", clients=[1, 2, 4], categories=["code_generation"])

For each number of clients N, the same N distinct prompts go through every row (CLIENT_SETUPS):

    ours-none-sequential  our target alone, the N requests one after another on one session. Each request is then
                          served alone by the target alone: its token ids are the reference of every identity check
    ours-spec-sequential  our speculative decoding (algorithm auto), one after another: what the N clients get
                          without batching, the baseline of "N at once should beat N in turn"
    ours-none             N client threads at once, each with its own session on one Engine(batching=True)
                          (sessions of such an engine verify together in one target pass), the target alone
    ours-spec             the same with algorithm auto (standard, SLEM or prompt lookup, by the bundle)
    genai-cb-none         openvino_genai.ContinuousBatchingPipeline on the bundle's target: the N requests added
                          at once, then step() until every one has finished
    genai-cb-sd           the same pipeline with a same-vocabulary draft (draft_model): the bundle's own draft
                          when it shares the target's vocabulary, else the draft of --genai-draft BUNDLE (a bundle
                          of the same target whose draft shares its vocabulary)

Method. The prompts: round-robin over the chosen categories (prompts.json), then, when N asks for more prompts
than those categories hold, the other categories in turn (a note says so); N clients take the first N, so a
larger N adds requests to the smaller N's. Each goes through the target's chat template when it has one, and
both engines get the same token ids. Greedy throughout, both engines stopping at the bundle's EOS tokens.
GenAI runs with its prefix cache off (each request pays its own prefill, as ours does) and its default CPU
properties. Every (N, row) gets one uncounted warm-up round first (a new number of clients can mean new shapes
to prepare); then for each repeat and N every row runs back to back, the order rotated from one (repeat, N) to
the next, so that drift in machine speed hits all rows alike.

What it measures per round: wall seconds from the moment every client sends its request (a barrier releases our
client threads; GenAI's requests are added one after the other at that moment) to the last token of the last
client; aggregate tokens/s = all clients' new tokens / that wall time. Per client: time to first token (from the
round's start; the sequential rows from the request's own start: the time a request waited for the ones
before it is in the wall time, not in its TTFT) and time per output token after the first. Ours: the session's
own clocks (Stats). GenAI: our clock, read after every step() of the pipeline, the moment GenAI itself hands
new tokens to its readers, so a first token is timed at the end of the step that made it; GenAI's own
per-request perf metrics (GenerationHandle.get_perf_metrics) go into report.json beside it.
"""
from __future__ import annotations

import itertools
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, Union

from ..errors import EdgeSpecdecError
from .report import (_f, _first_difference, _median, _round, _spread, _table, prompt_source_lines,
                     write_report)
from .runner import (_fmt_duration, load_genai_draft, load_prompt_set, machine_info, pick_categories, prompt_source,
                     render_prompts)
from .setups import Prompt

# the issue's goals are stated for 4 concurrent clients: the report checks them there when 4 is among --clients
GOAL_CLIENTS = 4
GOAL_SPEEDUP_OVER_SEQUENTIAL = 2.5  # ours-spec aggregate tokens/s over ours-spec-sequential
GOAL_TPOT_VS_ALONE = 2.0  # each client's TPOT at GOAL_CLIENTS over the same request's TPOT served alone
# GenAI's speculative row, by default: its confidence stop at this top probability (the runtime's default stop
# too); on the real same-vocabulary pair it was GenAI's fastest speculative setting (benchmarks/RESULTS.md)
GENAI_CONFIDENCE = 0.7
MAX_CLIENTS = 64  # a guard against a typo such as --clients 100 (there are 20 prompts anyway)


@dataclass(frozen=True)
class ClientSpec:
    """A row of the clients benchmark."""
    name: str
    engine: str  # "ours" or "genai"
    algorithm: str  # ours: "none" or "auto"; genai: "none" or "sd"
    concurrent: bool  # False: the N requests one after another
    description: str


CLIENT_SETUPS = (
    ClientSpec("ours-none-sequential", "ours", "none", False,
               "ours, the target alone, the N requests one after another (each one served alone: the reference "
               "of the identity checks)"),
    ClientSpec("ours-spec-sequential", "ours", "auto", False,
               "ours, speculative decoding (algorithm auto), the N requests one after another (the baseline of "
               "batching)"),
    ClientSpec("ours-none", "ours", "none", True,
               "ours, the target alone, N client threads at once on one Engine(batching=True)"),
    ClientSpec("ours-spec", "ours", "auto", True,
               "ours, speculative decoding (algorithm auto), N client threads at once on one Engine(batching=True)"),
    ClientSpec("genai-cb-none", "genai", "none", True,
               "OpenVINO GenAI ContinuousBatchingPipeline, the target alone, N requests at once"),
    ClientSpec("genai-cb-sd", "genai", "sd", True,
               "OpenVINO GenAI ContinuousBatchingPipeline with a same-vocabulary draft, N requests at once"),
)
SETUP_NAMES = tuple(s.name for s in CLIENT_SETUPS)
REFERENCE = "ours-none-sequential"
# each row's identity is checked against the first run of its reference on the same prompt
BASELINES = {"ours-none-sequential": REFERENCE, "ours-spec-sequential": REFERENCE, "ours-none": REFERENCE,
             "ours-spec": REFERENCE, "genai-cb-none": "genai-cb-none", "genai-cb-sd": "genai-cb-none"}


@dataclass
class ClientPrompt(Prompt):
    """A prompt with the token ids that both engines get."""
    ids: list[int] = field(default_factory=list)


@dataclass
class Request:
    """One client's request in one round."""
    prompt: str  # the prompt's key, category/id
    token_ids: list[int]
    text: str
    seconds: float  # concurrent rows: from the round's start to this client's end; sequential: its own duration
    ttft_ms: Optional[float]
    tpot_ms: Optional[float]
    proposed: Optional[int] = None  # ours: draft tokens proposed / accepted
    accepted: Optional[int] = None
    engine_ttft_ms: Optional[float] = None  # GenAI's own per-request perf metrics, for comparison
    engine_tpot_ms: Optional[float] = None

    @property
    def new_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass
class Round:
    """One row serving N clients once."""
    setup: str
    clients: int
    repeat: int  # -1: the warm-up
    wall_seconds: float
    requests: list[Request]
    batched_calls: Optional[int] = None  # ours with batching: model calls that ran several sessions' blocks at once
    batched_sequences: Optional[int] = None  # and the sessions' blocks in them

    @property
    def new_tokens(self) -> int:
        return sum(r.new_tokens for r in self.requests)

    @property
    def aggregate_tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_seconds if self.wall_seconds > 0 else 0.0


@dataclass
class Row:
    spec: ClientSpec
    run: Callable[[list[ClientPrompt]], Round]  # fills wall_seconds and requests; setup/clients/repeat set by the caller
    rounds: list[Round] = field(default_factory=list)
    failures: list[dict] = field(default_factory=list)  # {"clients", "repeat", "error"}


# --- choosing ---------------------------------------------------------------------------------------------------

def select_client_setups(patterns: Optional[Sequence[str]]) -> tuple[list[ClientSpec], list[str]]:
    """Every row, or those --setups names (names or shell patterns); the references of the rows picked are added
    (ours-none-sequential for ours, genai-cb-none for genai-cb-sd): their identity check needs them."""
    if not patterns:
        return list(CLIENT_SETUPS), []
    chosen: set[str] = set()
    for pattern in patterns:
        hits = [n for n in SETUP_NAMES if fnmatchcase(n, pattern)]
        if not hits:
            raise EdgeSpecdecError(f"unknown setup {pattern!r} for --clients: choose from {', '.join(SETUP_NAMES)} "
                                   f"(or a pattern such as 'ours-*').")
        chosen.update(hits)
    notes = []
    for name in sorted(chosen):
        base = BASELINES[name]
        if base not in chosen:
            chosen.add(base)
            notes.append(f"added {base}: the reference of {name}'s identity check")
    return [s for s in CLIENT_SETUPS if s.name in chosen], notes


def pick_prompt_items(prompt_set: dict, categories: list[str], n: int) -> tuple[list[tuple[str, dict]], list[str]]:
    """n distinct prompts: round-robin over the chosen categories, then over the others when those run out."""
    def round_robin(cats: list[str]) -> list[tuple[str, dict]]:
        queues = [[(c, item) for item in prompt_set[c]] for c in cats]
        out = []
        for i in range(max((len(q) for q in queues), default=0)):
            out += [q[i] for q in queues if i < len(q)]
        return out

    items = round_robin(categories)
    notes = []
    if len(items) < n:
        others = [c for c in prompt_set if c not in categories]
        borrowed = round_robin(others)[:n - len(items)]
        if len(items) + len(borrowed) < n:
            total = sum(len(v) for v in prompt_set.values())
            raise EdgeSpecdecError(f"--clients {n} needs {n} distinct prompts, but the prompt set has {total}: "
                                   f"use at most {total} clients.")
        notes.append(f"{n} clients need {n} distinct prompts and {', '.join(categories)} "
                     f"{'has' if len(categories) == 1 else 'have'} {len(items)}: added "
                     f"{', '.join(c + '/' + item['id'] for c, item in borrowed)} from the other categories")
        items += borrowed
    return items[:n], notes


# --- the rows ---------------------------------------------------------------------------------------------------

def _batched(engine) -> tuple[int, int]:
    """(batched calls, sessions' blocks in them) so far on a batching engine's scheduler; (0, 0) without one."""
    if engine.scheduler is None:
        return 0, 0
    stats = engine.scheduler.stats()
    return stats["batched_calls"], round(stats["batched_calls"] * stats["mean_sequences_per_batched_call"])


def ours_concurrent(sessions: list, algorithm: str, max_new_tokens: int) -> Callable[[list[ClientPrompt]], Round]:
    """N client threads, one session each, released together by a barrier."""
    from ..runtime import GenerationConfig

    config = GenerationConfig(max_new_tokens=max_new_tokens, temperature=0.0)
    engine = sessions[0].engine

    def run(prompts: list[ClientPrompt]) -> Round:
        n = len(prompts)
        barrier = threading.Barrier(n + 1)
        cancel = threading.Event()
        done: list[Any] = [None] * n

        def client(i: int) -> None:
            try:
                barrier.wait()
                start = time.perf_counter()
                result = sessions[i].generate(prompts[i].ours, config, algorithm=algorithm, cancel=cancel)
                done[i] = (start, time.perf_counter(), result)
            except BaseException as exc:  # noqa: BLE001 - handed to the main thread
                done[i] = exc

        threads = [threading.Thread(target=client, args=(i,), name=f"client-{i}", daemon=True) for i in range(n)]
        for t in threads:
            t.start()
        calls_before, sequences_before = _batched(engine)
        barrier.wait()
        t0 = time.perf_counter()
        try:
            for t in threads:
                while t.is_alive():  # a join with a timeout, so that Ctrl-C reaches this thread
                    t.join(0.1)
        except KeyboardInterrupt:
            cancel.set()
            for t in threads:
                t.join()
            raise
        end = max((d[1] for d in done if isinstance(d, tuple)), default=t0)
        for d in done:
            if isinstance(d, BaseException):
                raise d
        requests = []
        for prompt, (start, stop, result) in zip(prompts, done):
            st = result.stats.as_dict()
            requests.append(Request(prompt.key, list(result.token_ids), result.text, stop - t0,
                                    ttft_ms=1000 * (start - t0 + st["first_token_seconds"]),
                                    tpot_ms=st["time_per_output_token_ms"], proposed=st["draft_tokens_proposed"],
                                    accepted=st["draft_tokens_accepted"]))
        calls, sequences = _batched(engine)
        return Round("", n, 0, end - t0, requests, calls - calls_before, sequences - sequences_before)
    return run


def ours_sequential(session, algorithm: str, max_new_tokens: int) -> Callable[[list[ClientPrompt]], Round]:
    """The N requests one after another on one session."""
    from ..runtime import GenerationConfig

    config = GenerationConfig(max_new_tokens=max_new_tokens, temperature=0.0)

    def run(prompts: list[ClientPrompt]) -> Round:
        done = []  # the bookkeeping waits for the end, so that the requests' times add up to the wall time
        t0 = time.perf_counter()
        for prompt in prompts:
            start = time.perf_counter()
            result = session.generate(prompt.ours, config, algorithm=algorithm)
            done.append((start, time.perf_counter(), result))
            if result.stop_reason == "interrupted":  # the session swallowed a Ctrl-C: hand it on
                raise KeyboardInterrupt
        wall = time.perf_counter() - t0
        requests = []
        for prompt, (start, stop, result) in zip(prompts, done):
            st = result.stats.as_dict()
            requests.append(Request(prompt.key, list(result.token_ids), result.text, stop - start,
                                    ttft_ms=1000 * st["first_token_seconds"], tpot_ms=st["time_per_output_token_ms"],
                                    proposed=st["draft_tokens_proposed"], accepted=st["draft_tokens_accepted"]))
        return Round("", len(prompts), 0, wall, requests)
    return run


def load_genai_cb(target_folder: Path, draft_folder: Optional[Path], need_alone: bool) -> tuple[Any, Any, str]:
    """GenAI's continuous-batching pipelines on the target (need_alone) and with the draft (draft_folder), its
    prefix cache off and its default CPU properties. Raises what GenAI raises."""
    import openvino_genai

    def scheduler():
        s = openvino_genai.SchedulerConfig()
        s.enable_prefix_caching = False  # every request pays its own prefill, as ours does
        return s
    alone = (openvino_genai.ContinuousBatchingPipeline(str(target_folder), scheduler(), "CPU")
             if need_alone else None)
    sd = None
    if draft_folder is not None:
        sd = openvino_genai.ContinuousBatchingPipeline(
            str(target_folder), scheduler(), "CPU", {"draft_model": openvino_genai.draft_model(str(draft_folder),
                                                                                              "CPU")})
    return alone, sd, openvino_genai.__version__


_request_ids = itertools.count()  # GenAI wants a request id per request, unique within a pipeline


def genai_cb(pipe, eos_token_ids: list[int], max_new_tokens: int, assistant_tokens: Optional[int] = None,
             confidence: Optional[float] = None) -> Callable[[list[ClientPrompt]], Round]:
    """N requests added to a ContinuousBatchingPipeline at once, then step() until all have finished; every
    handle is read after every step."""
    import numpy as np
    import openvino as ov
    import openvino_genai

    config = openvino_genai.GenerationConfig()
    config.max_new_tokens = max_new_tokens
    config.do_sample = False
    if eos_token_ids:  # the bundle's EOS tokens, as ours stops on (a fresh config knows none)
        config.set_eos_token_id(eos_token_ids[0])
        config.stop_token_ids = set(eos_token_ids)
    if assistant_tokens:
        config.num_assistant_tokens = assistant_tokens
    elif confidence:
        config.assistant_confidence_threshold = confidence
    running = openvino_genai.GenerationStatus.RUNNING
    finished = openvino_genai.GenerationStatus.FINISHED
    tokenizer = pipe.get_tokenizer()

    def run(prompts: list[ClientPrompt]) -> Round:
        inputs = [ov.Tensor(np.array([p.ids], dtype=np.int64)) for p in prompts]
        n = len(prompts)
        tokens: list[list[int]] = [[] for _ in range(n)]
        first: list[Optional[float]] = [None] * n
        end: list[Optional[float]] = [None] * n
        t0 = time.perf_counter()
        handles = [pipe.add_request(next(_request_ids), ids, config) for ids in inputs]

        def read(now: float) -> None:
            for i, h in enumerate(handles):
                if end[i] is not None:
                    continue
                if h.can_read():
                    for output in h.read().values():  # greedy: one sequence, its new tokens since the last read
                        tokens[i] += list(output.generated_ids)
                if tokens[i] and first[i] is None:
                    first[i] = now
                if h.get_status() != running and not h.can_read():
                    end[i] = now
        try:
            while pipe.has_non_finished_requests():
                pipe.step()
                read(time.perf_counter())
        except KeyboardInterrupt:
            for h in handles:  # leave the pipeline empty for whatever runs next
                h.cancel()
            while pipe.has_non_finished_requests():
                pipe.step()
            raise
        read(time.perf_counter())
        stop = max((e for e in end if e is not None), default=time.perf_counter())
        requests = []
        for i, (prompt, h) in enumerate(zip(prompts, handles)):
            status = h.get_status()
            if status != finished:
                raise EdgeSpecdecError(f"GenAI ended request {prompt.key} with status {status.name}"
                                       + (" (out of KV cache memory)" if status.name == "IGNORED" else ""))
            e = end[i] if end[i] is not None else stop
            n_tok = len(tokens[i])
            ttft = 1000 * (first[i] - t0) if first[i] is not None else None
            tpot = 1000 * (e - first[i]) / (n_tok - 1) if first[i] is not None and n_tok > 1 else None
            req = Request(prompt.key, tokens[i], tokenizer.decode(tokens[i]), e - t0, ttft_ms=ttft, tpot_ms=tpot)
            try:  # GenAI's own per-request clocks, beside ours
                pm = h.get_perf_metrics()
                req.engine_ttft_ms, req.engine_tpot_ms = pm.get_ttft().mean, pm.get_tpot().mean
            except Exception:  # noqa: BLE001 - not every GenAI version has them per handle
                pass
            requests.append(req)
        return Round("", n, 0, stop - t0, requests)
    return run


# --- the run ----------------------------------------------------------------------------------------------------

def _progress(r: Round) -> str:
    tpot = _median(q.tpot_ms for q in r.requests)
    ttft = _median(q.ttft_ms for q in r.requests)
    return (f"{r.new_tokens:5d} tok {r.wall_seconds:7.2f} s {r.aggregate_tokens_per_s:7.1f} tok/s aggregate, "
            f"TTFT {_f(ttft, '.0f')} ms, TPOT {_f(tpot, '.1f')} ms (medians)")


def _run_one(row: Row, prompts: list[ClientPrompt], n: int, repeat: int) -> Round:
    r = row.run(prompts[:n])
    r.setup, r.clients, r.repeat = row.spec.name, n, repeat
    return r


def run_rounds(rows: list[Row], prompts: list[ClientPrompt], clients: list[int], repeats: int,
               say: Callable[[str], None]) -> bool:
    """The warm-ups, then for each repeat and N every row back to back, the order rotated each time.
    Returns False if interrupted (Ctrl-C): what ran so far is kept."""
    width = max(len(r.spec.name) for r in rows)
    try:
        for n in clients:
            for row in rows:
                try:
                    say(f"  warm-up clients {n:2d} {row.spec.name:<{width}} "
                        f"{_progress(_run_one(row, prompts, n, -1))}")
                except KeyboardInterrupt:
                    raise
                except Exception as exc:  # noqa: BLE001 - the timed rounds will record it
                    say(f"  warm-up clients {n:2d} {row.spec.name:<{width}} FAILED: {type(exc).__name__}: "
                        f"{str(exc)[:160]}")
    except KeyboardInterrupt:
        return False
    total, done, start, rotation = repeats * len(clients) * len(rows), 0, time.perf_counter(), 0
    try:
        for rep in range(repeats):
            for n in clients:
                shift = rotation % len(rows)
                rotation += 1
                for row in rows[shift:] + rows[:shift]:
                    done += 1
                    elapsed = time.perf_counter() - start
                    head = (f"[{done:{len(str(total))}d}/{total}] rep {rep + 1}/{repeats} clients {n:2d} "
                            f"{row.spec.name:<{width}}")
                    try:
                        r = _run_one(row, prompts, n, rep)
                    except KeyboardInterrupt:
                        raise
                    except Exception as exc:  # noqa: BLE001 - a row that fails once must not end the run
                        error = f"{type(exc).__name__}: {str(exc)[:200]}"
                        row.failures.append({"clients": n, "repeat": rep, "error": error})
                        say(f"{head} FAILED: {error}")
                        continue
                    row.rounds.append(r)
                    eta = elapsed / (done - 1) * (total - done + 1) if done > 1 else None
                    say(f"{head} {_progress(r)}" + (f"  eta {_fmt_duration(eta)}" if eta is not None else ""))
    except KeyboardInterrupt:
        say("interrupted: reporting the rounds done so far")
        return False
    return True


def run_clients_benchmark(bundle: Union[str, Path], clients: Sequence[int] = (1, 2, 4, 8),
                          setups: Optional[Sequence[str]] = None, max_new_tokens: int = 64, repeats: int = 2,
                          categories: Optional[Sequence[str]] = None, out: Union[str, Path, None] = None,
                          genai: bool = True, genai_draft: Union[str, Path, None] = None,
                          genai_k: Optional[int] = None, precision: str = "dq", kv_rollback: Optional[str] = None,
                          draft_vocab: Optional[int] = None, command: Optional[str] = None,
                          progress: Optional[Callable[[str], None]] = None, plot: bool = True,
                          prompts_file: Union[str, Path, None] = None) -> dict[str, Any]:
    """Run the clients benchmark (see the module's docstring) and write report.json, report.md and clients.png
    (with matplotlib) into `out` (default bench-results/<bundle name>-clients). Returns the report with "files".
    prompts_file: the user's prompts instead of the shipped set, as in run_benchmark."""
    from ..bundle import load_bundle

    say = progress or (lambda message: print(message, file=sys.stderr, flush=True))
    clients = list(dict.fromkeys(int(n) for n in clients))
    if not clients or min(clients) < 1:
        raise EdgeSpecdecError("--clients needs numbers of clients of at least 1, e.g. --clients 1 2 4 8.")
    if max(clients) > MAX_CLIENTS:
        raise EdgeSpecdecError(f"--clients {max(clients)}: at most {MAX_CLIENTS} clients.")
    clients.sort()
    if max_new_tokens < 1:
        raise EdgeSpecdecError("--max-new-tokens must be at least 1.")
    if repeats < 1:
        raise EdgeSpecdecError("--repeats must be at least 1.")
    if genai_k is not None and genai_k < 1:
        raise EdgeSpecdecError("--genai-k must be at least 1 (or leave it out: GenAI's confidence stop).")
    specs, notes = select_client_setups([p for item in (setups or []) for p in str(item).split(",") if p.strip()])
    if not genai:
        specs = [s for s in specs if s.engine != "genai"]
    prompt_set = load_prompt_set(prompts_file)
    chosen_categories = pick_categories(prompt_set, categories)
    items, prompt_notes = pick_prompt_items(prompt_set, chosen_categories, max(clients))
    notes += prompt_notes
    b = load_bundle(bundle, verify=False)  # the cheap checks first: a bad bundle or option fails fast
    relation = b.vocabulary["relation"]
    other = load_genai_draft(b, genai_draft, genai)
    out_dir = Path(out) if out is not None else Path("bench-results") / f"{b.path.name}-clients"
    if out_dir.exists() and not out_dir.is_dir():
        raise EdgeSpecdecError(f"--out {out_dir} is a file: give a folder for the report.")
    for note in notes:
        say(note)

    # ours: one Engine for every ours row, a session per client
    from ..runtime import Engine

    t = time.perf_counter()
    engine = Engine(b, precision=precision, kv_rollback=kv_rollback, draft_vocab=draft_vocab, batching=True)
    sessions = [engine.session() for _ in range(max(clients))]
    # the engine may turn batching off (a target that is not bit-exact batched): it says so in batching_note
    batching_note = engine.batching_note
    say(f"loaded our Engine(batching=True) and {len(sessions)} sessions in {time.perf_counter() - t:.1f} s: "
        f"{engine.placement.describe()}" + (f"; {batching_note}" if batching_note else ""))
    prompts, prompt_format = [], ""
    for category, item in items:
        rendered, prompt_format = render_prompts(engine, {category: [item]}, [category])
        p = rendered[0]
        ids = list(p.ours) if isinstance(p.ours, list) else engine.tokenizer.encode(p.ours)
        prompts.append(ClientPrompt(p.id, p.category, p.messages, p.text, ids, ids))  # both engines get the ids

    rows: list[Row] = []
    skipped: list[dict] = []
    algorithm_names = {a: engine.resolve_algorithm(a) for a in ("none", "auto")}
    for spec in specs:
        if spec.engine == "ours":
            run = (ours_concurrent(sessions, spec.algorithm, max_new_tokens) if spec.concurrent
                   else ours_sequential(sessions[0], spec.algorithm, max_new_tokens))
            rows.append(Row(spec, run))
    genai_specs = [s for s in specs if s.engine == "genai"]
    genai_info: dict[str, Any] = {}
    if genai_specs:
        want_sd = any(s.algorithm == "sd" for s in genai_specs)
        draft_folder, draft_from = None, None
        if want_sd:
            if other is not None:
                draft_folder, draft_from = other.draft.folder, f"the draft of --genai-draft {other.path}"
            elif relation == "identical":
                draft_folder, draft_from = b.draft.folder, "the bundle's own draft"
            else:
                reason = (f"this bundle's draft has another vocabulary ({relation}) and GenAI's speculative "
                          f"decoding needs the target's: give --genai-draft BUNDLE, a bundle of the same target "
                          f"with a same-vocabulary draft")
                say(f"skipping genai-cb-sd: {reason}")
                skipped.append({"setup": "genai-cb-sd", "reason": reason})
                genai_specs = [s for s in genai_specs if s.algorithm != "sd"]
        try:
            t = time.perf_counter()
            alone, sd, version = load_genai_cb(b.target.folder, draft_folder if want_sd else None,
                                               any(s.algorithm == "none" for s in genai_specs))
            say(f"loaded OpenVINO GenAI {version} continuous-batching pipelines in {time.perf_counter() - t:.1f} s")
        except ImportError as exc:
            reason = f"openvino_genai is not importable ({exc}); pip install 'edge-specdec[bench]'"
        except Exception as exc:  # noqa: BLE001 - report what GenAI says, go on without it
            reason = f"GenAI refused the bundle folders: {type(exc).__name__}: {str(exc)[:300]}"
        else:
            reason = None
            eos = b.target.eos_token_ids
            for spec in genai_specs:
                if spec.algorithm == "sd" and sd is not None:
                    rows.append(Row(spec, genai_cb(sd, eos, max_new_tokens, genai_k,
                                                   None if genai_k else GENAI_CONFIDENCE)))
                elif spec.algorithm == "none" and alone is not None:
                    rows.append(Row(spec, genai_cb(alone, eos, max_new_tokens)))
            genai_info = {"version": version, "draft": str(draft_folder) if draft_folder else None,
                          "draft_from": draft_from,
                          "assistant": f"num_assistant_tokens {genai_k}" if genai_k
                          else f"assistant_confidence_threshold {GENAI_CONFIDENCE}"}
        if reason is not None:
            say(f"skipping {', '.join(s.name for s in genai_specs)}: {reason}")
            skipped += [{"setup": s.name, "reason": reason} for s in genai_specs]
    order = {n: i for i, n in enumerate(SETUP_NAMES)}
    rows.sort(key=lambda r: order[r.spec.name])

    say(f"bench --clients {' '.join(map(str, clients))} on {b.path} ({relation} vocabulary): "
        f"{', '.join(r.spec.name for r in rows)}; {len(prompts)} prompts "
        + (f"from {prompts_file} " if prompts_file else "") + f"({prompt_format}), {repeats} repeat(s), "
        f"{max_new_tokens} new tokens at most, greedy")
    machine = machine_info()
    complete = run_rounds(rows, prompts, clients, repeats, say)
    try:
        machine["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        pass
    settings = {"bundle": str(b.path), "relation": relation, "clients": clients, "max_new_tokens": max_new_tokens,
                "repeats": repeats, "categories": chosen_categories, "prompt_format": prompt_format,
                "prompts_file": prompt_source(prompts_file, prompt_set),
                "precision": precision, "kv_rollback": kv_rollback, "draft_vocab": draft_vocab,
                "batching": True, "batching_on": engine.scheduler is not None,
                "batching_note": batching_note, "algorithms": algorithm_names, "placement": engine.placement.describe(),
                "genai": genai_info or None, "genai_draft": str(other.path) if other is not None else None,
                "greedy": True, "interrupted": not complete}
    report = build_clients_report(rows, prompts, settings, machine, b.manifest, skipped, notes, command,
                                  b.target.eos_token_ids)
    report["files"] = write_clients_report(report, out_dir, plot=plot, say=say)
    return report


# --- the summary ------------------------------------------------------------------------------------------------

def _strip_eos(ids: list[int], eos: set[int]) -> list[int]:
    return ids[:-1] if ids and ids[-1] in eos else ids


def _identity(row: Row, reference: dict[str, list[int]], n: Optional[int] = None,
              eos: Optional[set[int]] = None) -> tuple[Optional[bool], list[dict], int]:
    """Every request of the row's timed rounds (with n clients, or all) against reference[prompt]; eos: compare
    without a final EOS token (GenAI against ours)."""
    mismatches, compared = [], 0
    for r in row.rounds:
        if n is not None and r.clients != n:
            continue
        for q in r.requests:
            ref = reference.get(q.prompt)
            if ref is None or ref is q.token_ids:  # none, or the reference itself
                continue
            a, b = (q.token_ids, ref) if eos is None else (_strip_eos(q.token_ids, eos), _strip_eos(ref, eos))
            compared += 1
            if a != b:
                d = _first_difference(a, b)
                mismatches.append({"prompt": q.prompt, "clients": r.clients, "repeat": r.repeat,
                                   "first_difference": d, "length": len(a), "reference_length": len(b),
                                   "got": repr(a[d:d + 8]), "reference": repr(b[d:d + 8])})
    return (not mismatches if compared else None), mismatches, compared


def _references(rows: dict[str, Row]) -> dict[str, dict[str, list[int]]]:
    """Per reference row, each prompt's token ids in its first timed round that served it."""
    refs: dict[str, dict[str, list[int]]] = {}
    for name in set(BASELINES.values()):
        if name in rows:
            ids: dict[str, list[int]] = {}
            for r in sorted(rows[name].rounds, key=lambda r: (r.repeat, r.clients)):
                for q in r.requests:
                    ids.setdefault(q.prompt, q.token_ids)
            refs[name] = ids
    return refs


def _paired(a: Optional[Row], b: Optional[Row], n: int, value: Callable[[Round], Optional[float]]) -> list[float]:
    """value(a's round) / value(b's round) for each repeat both ran with n clients."""
    if a is None or b is None:
        return []
    theirs = {r.repeat: r for r in b.rounds if r.clients == n}
    out = []
    for r in a.rounds:
        other = theirs.get(r.repeat)
        if r.clients == n and other is not None:
            x, y = value(r), value(other)
            if x is not None and y:
                out.append(x / y)
    return out


def _tpot_vs_alone(row: Optional[Row], alone: Optional[Row], n: int) -> list[float]:
    """Each client's TPOT in row with n clients / the same request's TPOT served alone (`alone`, a sequential
    row of the same algorithm, same n and repeat)."""
    if row is None or alone is None:
        return []
    theirs = {(r.repeat, q.prompt): q.tpot_ms for r in alone.rounds if r.clients == n for q in r.requests}
    return [q.tpot_ms / theirs[(r.repeat, q.prompt)] for r in row.rounds if r.clients == n for q in r.requests
            if q.tpot_ms and theirs.get((r.repeat, q.prompt))]


def summarize_row(row: Row, n: int, refs: dict, eos: set[int]) -> dict[str, Any]:
    rounds = [r for r in row.rounds if r.clients == n]
    requests = [q for r in rounds for q in r.requests]
    base = BASELINES[row.spec.name]
    identical, mismatches, compared = _identity(row, refs.get(base, {}), n)
    out = {"setup": row.spec.name, "engine": row.spec.engine, "clients": n, "rounds": len(rounds),
           "failed_rounds": sum(1 for f in row.failures if f["clients"] == n),
           "failures": [f for f in row.failures if f["clients"] == n][:10],
           "new_tokens_total": sum(r.new_tokens for r in rounds),
           "aggregate_tokens_per_s": _spread([r.aggregate_tokens_per_s for r in rounds]),
           "wall_seconds": _median(r.wall_seconds for r in rounds),
           "client_tokens_per_s": _median(q.tokens_per_s for q in requests),
           "client_tokens_per_s_min": min((q.tokens_per_s for q in requests), default=None),
           "ttft_ms": _median(q.ttft_ms for q in requests), "tpot_ms": _median(q.tpot_ms for q in requests),
           "tpot_ms_max": max((q.tpot_ms for q in requests if q.tpot_ms is not None), default=None),
           "identity_reference": base, "identical": identical, "identity_checked_requests": compared,
           "mismatches": mismatches[:10], "mismatched_requests": len(mismatches)}
    proposed = sum(q.proposed or 0 for q in requests)
    out["acceptance"] = sum(q.accepted or 0 for q in requests) / proposed if proposed else None
    batched = [r for r in rounds if r.batched_calls is not None]
    calls = sum(r.batched_calls for r in batched)
    out["batched_calls"] = calls if batched else None
    out["sequences_per_batched_call"] = sum(r.batched_sequences for r in batched) / calls if calls else None
    if row.spec.engine == "genai":
        out["genai_own_ttft_ms"] = _median(q.engine_ttft_ms for q in requests)
        out["genai_own_tpot_ms"] = _median(q.engine_tpot_ms for q in requests)
        same, differ, checked = _identity(row, refs.get(REFERENCE, {}), n, eos=eos)
        out["identical_to_ours_target_alone"], out["checked_against_ours"] = same, checked
        out["differing_from_ours"] = len(differ)
    return out


def build_clients_report(rows: list[Row], prompts: list[ClientPrompt], settings: dict, machine: dict, manifest: dict,
                         skipped: list[dict], notes: list[str], command: Optional[str],
                         eos_token_ids: Sequence[int] = ()) -> dict[str, Any]:
    by_name = {r.spec.name: r for r in rows}
    refs = _references(by_name)
    eos = set(eos_token_ids)
    clients = settings["clients"]
    results = [{"clients": n, "rows": [summarize_row(r, n, refs, eos) for r in rows]} for n in clients]

    def agg(r: Round) -> float:
        return r.aggregate_tokens_per_s
    spec_row, seq, alone = by_name.get("ours-spec"), by_name.get("ours-spec-sequential"), by_name.get("ours-none")
    cb_sd, cb = by_name.get("genai-cb-sd"), by_name.get("genai-cb-none")
    tpot_at_1 = {name: _median(q.tpot_ms for r in row.rounds if r.clients == 1 for q in r.requests)
                 for name, row in by_name.items()} if 1 in clients else {}
    summary = []
    for n in clients:
        vs_alone = _tpot_vs_alone(spec_row, seq, n)
        tpot_n = _median(q.tpot_ms for r in spec_row.rounds if r.clients == n for q in r.requests) if spec_row else None
        summary.append({
            "clients": n,
            "spec_vs_sequential": _median(_paired(spec_row, seq, n, agg)),
            "spec_vs_ours_none": _median(_paired(spec_row, alone, n, agg)),
            "spec_vs_genai_cb_sd": _median(_paired(spec_row, cb_sd, n, agg)),
            "ours_none_vs_genai_cb_none": _median(_paired(alone, cb, n, agg)),
            "spec_tpot_vs_alone_median": _median(vs_alone),
            "spec_tpot_vs_alone_max": max(vs_alone, default=None),
            "spec_tpot_vs_one_client": (tpot_n / tpot_at_1["ours-spec"]
                                        if tpot_n and tpot_at_1.get("ours-spec") else None),
        })
    ours_rows = [row for res in results for row in res["rows"] if row["engine"] == "ours"]
    report = {
        "tool": "edge-specdec bench --clients", "command": command, "settings": settings, "machine": machine,
        "bundle": {"path": settings["bundle"], "relation": settings["relation"],
                   **{side: {"source": manifest[side].get("source", {}).get("given"),
                             "weights": manifest[side].get("weights", {}).get("format")}
                      for side in ("target", "draft") if manifest.get(side)}},
        "setups": [{"setup": r.spec.name, "description": r.spec.description} for r in rows],
        "prompts": [{"key": p.key, "category": p.category, "tokens": len(p.ids)} for p in prompts],
        "results": results, "summary": summary, "goals": _goals(summary, results),
        "skipped": skipped, "notes": notes,
        "genai_clock_difference_ms": max(
            (abs(a - b) for row in rows if row.spec.engine == "genai" for r in row.rounds for q in r.requests
             for a, b in ((q.ttft_ms, q.engine_ttft_ms), (q.tpot_ms, q.engine_tpot_ms))
             if a is not None and b is not None), default=None),
        "ours_identical": (all(r["identical"] is not False for r in ours_rows)
                           if any(r["identity_checked_requests"] for r in ours_rows) else None),
        "not_identical": sorted({f"{r['setup']} (clients {r['clients']})" for res in results for r in res["rows"]
                                 if r["identical"] is False}),
        "rounds": [{"setup": r.setup, "clients": r.clients, "repeat": r.repeat,
                    "wall_seconds": r.wall_seconds, "new_tokens": r.new_tokens,
                    "requests": [{"prompt": q.prompt, "new_tokens": q.new_tokens, "seconds": q.seconds,
                                  "ttft_ms": q.ttft_ms, "tpot_ms": q.tpot_ms, "genai_own_ttft_ms": q.engine_ttft_ms,
                                  "genai_own_tpot_ms": q.engine_tpot_ms} for q in r.requests]}
                   for row in rows for r in row.rounds],
    }
    return _round(report, 4)


def _goals(summary: list[dict], results: list[dict]) -> Optional[list[dict]]:
    """The issue's goals, checked at GOAL_CLIENTS clients when that was measured."""
    at = next((s for s in summary if s["clients"] == GOAL_CLIENTS), None)
    if at is None:
        return None
    ours = [r for res in results for r in res["rows"] if r["engine"] == "ours"]
    checked = sum(r["identity_checked_requests"] for r in ours)
    identical = all(r["identical"] is not False for r in ours) if checked else None

    def goal(what: str, value, met: Optional[bool], shown: str) -> dict:
        return {"goal": what, "value": value, "shown": shown, "met": met}

    def ratio_goal(what: str, value: Optional[float], met: Callable[[float], bool]) -> dict:
        return goal(what, value, None if value is None else met(value), _f(value, ".2f", "x"))
    return [
        ratio_goal(f"ours-spec aggregate tokens/s with {GOAL_CLIENTS} clients >= {GOAL_SPEEDUP_OVER_SEQUENTIAL}x the "
                   f"same requests one after another (ours-spec-sequential)", at["spec_vs_sequential"],
                   lambda v: v >= GOAL_SPEEDUP_OVER_SEQUENTIAL),
        goal("every output of ours identical to the target alone, every number of clients", identical, identical,
             "-" if identical is None else f"{'yes' if identical else 'NO'} ({checked} requests checked)"),
        ratio_goal(f"each client's TPOT with {GOAL_CLIENTS} clients <= {GOAL_TPOT_VS_ALONE}x its TPOT alone "
                   f"(the worst client)", at["spec_tpot_vs_alone_max"], lambda v: v <= GOAL_TPOT_VS_ALONE),
        ratio_goal(f"ours-spec ahead of genai-cb-sd (GenAI continuous batching with its same-vocabulary draft) "
                   f"with {GOAL_CLIENTS} clients", at["spec_vs_genai_cb_sd"], lambda v: v > 1.0),
    ]


# --- Markdown ---------------------------------------------------------------------------------------------------

DEFINITIONS = """\
- aggregate tok/s: all clients' new tokens / wall seconds of the round, from the moment every client sent its
  request to the last token of the last client; the median over repeats. Sequential rows: the N requests one
  after another, wall = their sum.
- client tok/s: a client's new tokens / its seconds from the round's start to its last token (sequential rows:
  from its own start); the median over clients and repeats.
- TTFT: time to the first token, from the round's start (concurrent rows) or from the request's own start
  (sequential rows: the wait for the requests before it is in the wall time, not here). TPOT: time per output
  token after the first. Medians over clients and repeats; TPOT max: the worst client.
  Ours: the session's own clocks. GenAI: our clock, read after every step() of the pipeline (when GenAI hands
  out new tokens), so a first token counts at the end of the step that made it; GenAI's own per-request perf
  metrics (GenerationHandle.get_perf_metrics) are in report.json beside them.
- identical: greedy decoding must not change the output. Ours: each request's token ids equal those of the same
  prompt served alone by our target alone (ours-none-sequential, its first timed run; its own later runs are
  checked against that too). GenAI: token ids against genai-cb-none's first run of the same prompt (GenAI
  against its own target alone, as the other bench rows compare GenAI); "= ours target alone": GenAI's ids
  against ours-none-sequential, a final EOS aside (GenAI runs with other CPU properties, so differences there
  are expected and are not a fault of either).
- batched calls: our rows at once, on a batching engine: the model calls (target and draft) that ran several
  sessions' blocks together, summed over the repeats, and the mean number of blocks in one; "-": not batching.
- ratios: medians over repeats of paired ratios (two rows with the same clients in the same repeat). TPOT vs
  alone: each client's TPOT in ours-spec / the same request's TPOT in ours-spec-sequential of the same repeat
  (there each request is served alone).
- every (clients, row) had one uncounted warm-up round first; within a repeat and a number of clients, all
  rows ran back to back, the order rotated from one to the next.
"""


def _clients(n: int) -> str:
    return f"{n} client{'s' if n != 1 else ''}"


def _identity_cell(row: dict) -> str:
    is_reference = row["setup"] == row["identity_reference"]
    if row["identical"] is None:  # nothing compared: no runs, or only the reference's own first runs
        return "no runs" if not row["rounds"] else "the reference" if is_reference else "no reference"
    ref = " (the reference: against its own first run)" if is_reference else ""
    if row["identical"]:
        return f"yes, {row['identity_checked_requests']}/{row['identity_checked_requests']}{ref}"
    return f"**NO**, {row['mismatched_requests']} of {row['identity_checked_requests']} differ{ref}"


def render_clients_markdown(report: dict) -> str:
    s, m, b = report["settings"], report["machine"], report["bundle"]
    lines = [f"# edge-specdec bench --clients: {Path(s['bundle']).name}", ""]
    if report.get("command"):
        lines += ["```", report["command"], "```", ""]
    sides = "; ".join(f"{side} {b[side]['source']} ({b[side]['weights']})" for side in ("target", "draft") if side in b)
    g = s.get("genai") or {}
    lines += [f"Bundle `{s['bundle']}`: {sides}; vocabulary {s['relation']}. Clients: "
              f"{', '.join(map(str, s['clients']))}; {s['max_new_tokens']} new tokens at most, greedy, "
              f"{s['repeats']} repeat(s); {len(report['prompts'])} distinct prompts ({s['prompt_format']}), "
              f"N clients send the first N. Ours: one Engine("
              f"{'batching=True' if s['batching'] else 'without a batching option'})"
              + (f" ({s['batching_note']})" if s.get("batching_note") else "")
              + f", a session per client, algorithm auto = {s['algorithms']['auto']}, precision {s['precision']}; "
              f"{s['placement']}."
              + (f" GenAI {g['version']}, continuous batching, prefix cache off, its default CPU properties; its "
                 f"speculative row: {g['draft_from']} ({g['assistant']})." if g.get("version") else ""), ""]
    lines += prompt_source_lines(s)
    if s.get("interrupted"):
        lines += ["**Interrupted**: the figures cover only the rounds done before Ctrl-C.", ""]
    if report.get("goals"):
        lines += [f"## Goals at {GOAL_CLIENTS} clients", ""]
        lines += _table(["goal", "measured", "met"],
                        [[x["goal"], x["shown"], {True: "yes", False: "**no**", None: "-"}[x["met"]]]
                         for x in report["goals"]])
        lines.append("")
    lines += ["## Summary", "",
              "Aggregate tokens/s ratios (paired per repeat) and ours-spec's time per output token.", ""]
    lines += _table(["clients", "ours-spec / one after another", "ours-spec / ours-none", "ours-spec / genai-cb-sd",
                     "ours-none / genai-cb-none", "ours-spec TPOT vs alone (median, worst)",
                     "ours-spec TPOT vs 1 client"],
                    [[str(x["clients"]), _f(x["spec_vs_sequential"], ".2f", "x"), _f(x["spec_vs_ours_none"], ".2f", "x"),
                      _f(x["spec_vs_genai_cb_sd"], ".2f", "x"), _f(x["ours_none_vs_genai_cb_none"], ".2f", "x"),
                      f"{_f(x['spec_tpot_vs_alone_median'], '.2f', 'x')}, {_f(x['spec_tpot_vs_alone_max'], '.2f', 'x')}",
                      _f(x["spec_tpot_vs_one_client"], ".2f", "x")] for x in report["summary"]])
    for res in report["results"]:
        lines += ["", f"## {_clients(res['clients'])}", ""]
        lines += _table(
            ["setup", "rounds", "aggregate tok/s", "wall s", "client tok/s", "TTFT ms", "TPOT ms", "TPOT max ms",
             "acceptance", "batched calls (blocks / call)", "identical to the target alone",
             "GenAI = ours target alone"],
            [[r["setup"], str(r["rounds"]) + (f" ({r['failed_rounds']} failed)" if r["failed_rounds"] else ""),
              _f((r["aggregate_tokens_per_s"] or {}).get("median")), _f(r["wall_seconds"]),
              _f(r["client_tokens_per_s"]), _f(r["ttft_ms"], ".0f"), _f(r["tpot_ms"], ".1f"),
              _f(r["tpot_ms_max"], ".1f"), _f(r["acceptance"], ".3f"),
              "-" if r.get("batched_calls") is None else
              f"{r['batched_calls']}" + (f" ({r['sequences_per_batched_call']:.2f})" if r["batched_calls"] else ""),
              _identity_cell(r),
              "-" if r.get("identical_to_ours_target_alone") is None
              else f"yes, {r['checked_against_ours']}/{r['checked_against_ours']}" if r["identical_to_ours_target_alone"]
              else f"no, {r['differing_from_ours']} of {r['checked_against_ours']} differ"]
             for r in res["rows"]])
    problems = []
    for res in report["results"]:
        for r in res["rows"]:
            for mm in r["mismatches"]:
                problems.append(f"- NOT identical: {r['setup']} with {_clients(r['clients'])} on {mm['prompt']} "
                                f"(repeat {mm['repeat'] + 1}): first difference at token {mm['first_difference']}: "
                                f"{mm['got']} vs {mm['reference']}")
            for fail in r["failures"]:
                problems.append(f"- failed: {r['setup']} with {_clients(r['clients'])} (repeat {fail['repeat'] + 1}): "
                                f"{fail['error']}")
    problems += [f"- skipped: {x['setup']}: {x['reason']}" for x in report["skipped"]]
    problems += [f"- note: {note}" for note in report["notes"]]
    if problems:
        lines += ["", "## Failures, mismatches, skipped rows, notes", "", *problems]
    lines += ["", "## What GenAI gives per request, and what not", "",
              "- TTFT and TPOT: per request, from our clock read after every step() (GenAI hands out tokens only "
              "between steps, so a token is timed at the end of the step that made it) and from GenAI's own "
              "GenerationHandle.get_perf_metrics(), both in report.json; "
              + (f"the two differ by at most {report['genai_clock_difference_ms']:.1f} ms in this run."
                 if report.get("genai_clock_difference_ms") is not None else "no GenAI request ran."),
              "- acceptance and tokens per target pass: GenAI counts draft tokens for a whole generate() call "
              "(its extended perf metrics), not per GenerationHandle, so genai-cb-sd has no acceptance here.",
              "- batched calls: GenAI batches every scheduled request in each step; it has no count comparable "
              "to ours.", ""]
    lines += ["## Setups", ""] + [f"- `{x['setup']}`: {x['description']}" for x in report["setups"]]
    lines += ["", "## Prompts", "", ", ".join(f"{p['key']} ({p['tokens']} tokens)" for p in report["prompts"])]
    lines += ["", "## Definitions", "", DEFINITIONS.rstrip()]
    versions = ", ".join(f"{k} {m[k]}" for k in ("openvino", "openvino_genai", "edge_specdec") if k in m)
    load = ""
    if "load_average_at_start" in m:
        load = (f"; load average {'/'.join(map(str, m['load_average_at_start']))} at the start"
                + (f", {'/'.join(map(str, m['load_average_at_end']))} at the end" if "load_average_at_end" in m
                   else ""))
    lines += ["", "## Machine", "",
              f"{m['cpu']}, {m['cores']} cores" + (f" ({m['cores_usable']} usable)" if "cores_usable" in m else "")
              + f"; {m['platform']}; Python {m['python']}; {versions}; {m['date']}{load}.", ""]
    return "\n".join(lines)


def plot_clients(report: dict, path: Path) -> None:
    """Aggregate tokens/s and median TPOT against the number of clients, one line per row."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    clients = report["settings"]["clients"]
    names = [x["setup"] for x in report["setups"]]
    series = {name: {res["clients"]: r for res in report["results"] for r in res["rows"] if r["setup"] == name}
              for name in names}
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 5))
    style = {"ours-spec": ("tab:red", "-"), "ours-none": ("tab:blue", "-"), "ours-spec-sequential": ("tab:red", ":"),
             "ours-none-sequential": ("tab:blue", ":"), "genai-cb-sd": ("tab:green", "--"),
             "genai-cb-none": ("tab:gray", "--")}
    for name in names:
        xs = [n for n in clients if (series[name].get(n) or {}).get("aggregate_tokens_per_s")]
        if not xs:
            continue
        color, line = style.get(name, (None, "-"))
        left.plot(xs, [series[name][n]["aggregate_tokens_per_s"]["median"] for n in xs], marker="o", color=color,
                  linestyle=line, label=name)
        tx = [n for n in xs if series[name][n]["tpot_ms"] is not None]
        right.plot(tx, [series[name][n]["tpot_ms"] for n in tx], marker="o", color=color, linestyle=line,
                   label=name)
    for ax, label in ((left, "aggregate tokens/s (all clients)"), (right, "time per output token, ms (median client)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(clients)
        ax.set_xticklabels([str(n) for n in clients])
        ax.set_xlabel("concurrent clients")
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
    left.legend(fontsize="small")
    s = report["settings"]
    fig.suptitle(f"{Path(s['bundle']).name}: {s['max_new_tokens']} tokens per client, greedy, "
                 f"{s['repeats']} repeat(s)")
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def write_clients_report(report: dict, out_dir: Path, plot: bool = True,
                         say: Callable[[str], None] = print) -> dict[str, str]:
    return write_report(report, out_dir, plot, say, render=render_clients_markdown, chart=plot_clients,
                        chart_name="clients.png")


__all__ = ["CLIENT_SETUPS", "run_clients_benchmark", "render_clients_markdown"]
