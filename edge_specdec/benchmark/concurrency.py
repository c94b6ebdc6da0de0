"""`edge-specdec bench clients BUNDLE --clients 1 2 4 8`: several clients at once, ours against serving them one after
another and against OpenVINO GenAI's continuous batching.

    edge-specdec bench clients BUNDLE --clients 1 2 4 8 [--genai-draft BUNDLE] [--genai-k K] [--categories CAT ...]
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

The modules: client_setups.py (the rows and what a round records), client_runners.py (how each row serves N
clients), this one (the options, loading, the interleaved rounds), client_summary.py (the figures) and
client_report.py (report.md, report.json, clients.png).
"""
from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, Union

from ..errors import EdgeSpecdecError
from .client_report import write_clients_report
from .client_runners import genai_cb, load_genai_cb, ours_concurrent, ours_sequential
from .client_setups import SETUP_NAMES, ClientPrompt, ClientSpec, Round, Row, select_client_setups
from .client_summary import build_clients_report
from .genai_draft import load_genai_draft
from .interleave import run_interleaved
from .machine import machine_info, note_load_at_end
from .markdown import cell
from .prompt_set import load_prompt_set, pick_categories, pick_prompt_items, prompt_source, render_prompts
from .stats import median

# GenAI's speculative row, by default: its confidence stop at this top probability (the runtime's default stop
# too); on the real same-vocabulary pair it was GenAI's fastest speculative setting (benchmarks/RESULTS.md)
GENAI_CONFIDENCE = 0.7
MAX_CLIENTS = 64  # a guard against a typo such as --clients 100 (there are 20 prompts anyway)


def run_clients_benchmark(bundle: Union[str, Path], clients: Sequence[int] = (1, 2, 4, 8),
                          setups: Optional[Sequence[str]] = None, max_new_tokens: int = 64, repeats: int = 2,
                          categories: Optional[Sequence[str]] = None, out: Union[str, Path, None] = None,
                          genai: bool = True, genai_draft: Union[str, Path, None] = None,
                          genai_k: Optional[int] = None, engine_config=None, command: Optional[str] = None,
                          progress: Optional[Callable[[str], None]] = None, plot: bool = True,
                          prompts_file: Union[str, Path, None] = None) -> dict[str, Any]:
    """Run the clients benchmark (see the module's docstring) and write report.json, report.md and clients.png
    (with matplotlib) into `out` (default bench-results/<bundle name>-clients). Returns the report with "files".
    prompts_file: the user's prompts instead of the shipped set, as in run_benchmark. engine_config: the
    EngineConfig our Engine loads with (default EngineConfig(); batching is always on)."""
    from ..bundle import load_bundle
    from ..runtime.settings import EngineConfig

    say = progress or (lambda message: print(message, file=sys.stderr, flush=True))
    clients = _checked_clients(clients, max_new_tokens, repeats, genai_k)
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
    engine = Engine(b, config=dataclasses.replace(engine_config or EngineConfig(), batching=True))
    sessions = [engine.session() for _ in range(max(clients))]
    engine.compile_static_copies()  # timed as a server runs once its copies serve, not while they compile
    # the engine may turn batching off (a target that is not bit-exact batched): it says so in batching_note
    batching_note = engine.batching_note
    say(f"loaded our Engine(batching=True) and {len(sessions)} sessions in {time.perf_counter() - t:.1f} s: "
        f"{engine.placement.describe()}" + (f"; {batching_note}" if batching_note else ""))
    prompts, prompt_format = _client_prompts(engine, items)
    rows = [Row(spec, ours_concurrent(sessions, spec.algorithm, max_new_tokens) if spec.concurrent
                else ours_sequential(sessions[0], spec.algorithm, max_new_tokens))
            for spec in specs if spec.engine == "ours"]
    genai_rows, skipped, genai_info = _genai_rows([s for s in specs if s.engine == "genai"], b, other,
                                                  max_new_tokens, genai_k, say)
    order = {n: i for i, n in enumerate(SETUP_NAMES)}
    rows = sorted(rows + genai_rows, key=lambda r: order[r.spec.name])

    say(f"bench clients --clients {' '.join(map(str, clients))} on {b.path} ({relation} vocabulary): "
        f"{', '.join(r.spec.name for r in rows)}; {len(prompts)} prompts "
        + (f"from {prompts_file} " if prompts_file else "") + f"({prompt_format}), {repeats} repeat(s), "
        f"{max_new_tokens} new tokens at most, greedy")
    machine = machine_info()
    complete = run_rounds(rows, prompts, clients, repeats, say)
    note_load_at_end(machine)
    settings = {"bundle": str(b.path), "relation": relation, "clients": clients, "max_new_tokens": max_new_tokens,
                "repeats": repeats, "categories": chosen_categories, "prompt_format": prompt_format,
                "prompts_file": prompt_source(prompts_file, prompt_set),
                "precision": engine.config.precision, "kv_rollback": engine.config.kv_rollback,
                "draft_vocab": engine.config.draft_vocab,
                "batching": True, "batching_on": engine.scheduler is not None,
                "batching_note": batching_note,
                "algorithms": {a: engine.resolve_algorithm(a) for a in ("none", "auto")},
                "placement": engine.placement.describe(),
                "genai": genai_info or None, "genai_draft": str(other.path) if other is not None else None,
                "greedy": True, "interrupted": not complete}
    report = build_clients_report(rows, prompts, settings, machine, b.manifest, skipped, notes, command,
                                  b.target.eos_token_ids)
    report["files"] = write_clients_report(report, out_dir, plot=plot, say=say)
    return report


def _checked_clients(clients: Sequence[int], max_new_tokens: int, repeats: int, genai_k: Optional[int]) -> list[int]:
    """The numbers of clients, each once, in ascending order, once they and the other numbers make sense."""
    clients = list(dict.fromkeys(int(n) for n in clients))
    if not clients or min(clients) < 1:
        raise EdgeSpecdecError("--clients needs numbers of clients of at least 1, e.g. --clients 1 2 4 8.")
    if max(clients) > MAX_CLIENTS:
        raise EdgeSpecdecError(f"--clients {max(clients)}: at most {MAX_CLIENTS} clients.")
    if max_new_tokens < 1:
        raise EdgeSpecdecError("--max-new-tokens must be at least 1.")
    if repeats < 1:
        raise EdgeSpecdecError("--repeats must be at least 1.")
    if genai_k is not None and genai_k < 1:
        raise EdgeSpecdecError("--genai-k must be at least 1 (or leave it out: GenAI's confidence stop).")
    return sorted(clients)


def _client_prompts(engine, items: list[tuple[str, dict]]) -> tuple[list[ClientPrompt], str]:
    """The prompts in the target's chat template, as token ids that both engines get; and how they were rendered."""
    prompts, prompt_format = [], ""
    for category, item in items:
        rendered, prompt_format = render_prompts(engine, {category: [item]}, [category])
        p = rendered[0]
        ids = list(p.ours) if isinstance(p.ours, list) else engine.tokenizer.encode(p.ours)
        prompts.append(ClientPrompt(p.id, p.category, p.messages, p.text, ids, ids))
    return prompts, prompt_format


def _genai_rows(specs: list[ClientSpec], b, other, max_new_tokens: int, genai_k: Optional[int],
                say: Callable[[str], None]) -> tuple[list[Row], list[dict], dict[str, Any]]:
    """GenAI's rows: its continuous-batching pipelines on the target alone and with a same-vocabulary draft (the
    bundle's own, or that of `other`, the --genai-draft bundle). A row that cannot load is skipped with its reason.
    Returns (rows, skipped [{"setup", "reason"}], what the report says of GenAI)."""
    if not specs:
        return [], [], {}
    relation = b.vocabulary["relation"]
    rows: list[Row] = []
    skipped: list[dict] = []
    want_sd = any(s.algorithm == "sd" for s in specs)
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
            specs = [s for s in specs if s.algorithm != "sd"]
    try:
        t = time.perf_counter()
        alone, sd, version = load_genai_cb(b.target.folder, draft_folder if want_sd else None,
                                           any(s.algorithm == "none" for s in specs))
        say(f"loaded OpenVINO GenAI {version} continuous-batching pipelines in {time.perf_counter() - t:.1f} s")
    except ImportError as exc:
        reason = f"openvino_genai is not importable ({exc}); pip install 'edge-specdec[bench]'"
    except Exception as exc:  # noqa: BLE001 - report what GenAI says, go on without it
        reason = f"GenAI refused the bundle folders: {type(exc).__name__}: {str(exc)[:300]}"
    else:
        eos = b.target.eos_token_ids
        for spec in specs:
            if spec.algorithm == "sd" and sd is not None:
                rows.append(Row(spec, genai_cb(sd, eos, max_new_tokens, genai_k,
                                               None if genai_k else GENAI_CONFIDENCE)))
            elif spec.algorithm == "none" and alone is not None:
                rows.append(Row(spec, genai_cb(alone, eos, max_new_tokens)))
        info = {"version": version, "draft": str(draft_folder) if draft_folder else None, "draft_from": draft_from,
                "assistant": f"num_assistant_tokens {genai_k}" if genai_k
                else f"assistant_confidence_threshold {GENAI_CONFIDENCE}"}
        return rows, skipped, info
    say(f"skipping {', '.join(s.name for s in specs)}: {reason}")
    skipped += [{"setup": s.name, "reason": reason} for s in specs]
    return rows, skipped, {}


# --- the rounds -------------------------------------------------------------------------------------------------

def _progress(r: Round) -> str:
    tpot = median(q.tpot_ms for q in r.requests)
    ttft = median(q.ttft_ms for q in r.requests)
    return (f"{r.new_tokens:5d} tok {r.wall_seconds:7.2f} s {r.aggregate_tokens_per_s:7.1f} tok/s aggregate, "
            f"TTFT {cell(ttft, '.0f')} ms, TPOT {cell(tpot, '.1f')} ms (medians)")


def run_rounds(rows: list[Row], prompts: list[ClientPrompt], clients: list[int], repeats: int,
               say: Callable[[str], None]) -> bool:
    """A warm-up round for each number of clients and row, then for each repeat and N every row back to back, the
    order rotated each time (interleave.py). Returns False if interrupted (Ctrl-C): what ran so far is kept."""
    def run(row: Row, n: int, repeat: int) -> Round:
        r = row.run(prompts[:n])
        r.setup, r.clients, r.repeat = row.spec.name, n, repeat
        return r

    def fail(row: Row, n: int, repeat: int, error: str) -> None:
        row.failures.append({"clients": n, "repeat": repeat, "error": error})
    return run_interleaved(rows, clients, repeats, say, name=lambda row: row.spec.name,
                           label=lambda n: f"clients {n:2d} ", run=run, show=_progress,
                           keep=lambda row, n, repeat, r: row.rounds.append(r), fail=fail, warm_ups=clients)


__all__ = ["GENAI_CONFIDENCE", "run_clients_benchmark"]
