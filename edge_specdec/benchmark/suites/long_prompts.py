"""The long-prompts suite: prompts of thousands of tokens (documents, tool schemas), each engine in a fresh process of
its own: time to the first token, tokens/s after it and peak memory, ours at each KV cache type against OpenVINO
GenAI's LLMPipeline on the same target, on two tasks over the same document: summarize it, and quote a function
from it word for word (an extractive answer, which copies the document)."""
from __future__ import annotations

import argparse
import re
import statistics
from pathlib import Path
from typing import Optional

from ..suite_runs import Cell, Figure, Measured, Suite, SuiteRow

SUMMARY = ("prompts of thousands of tokens (summarize a document, quote from it), a fresh process per run: time to "
           "the first token, decoding and peak memory")

FIGURES = [Figure("ttft_s", "TTFT s", ".2f", lower_is_better=True),
           Figure("tokens_per_s_after_first", "tok/s after the first"),
           Figure("peak_rss_mib", "peak RSS MiB", ".0f", lower_is_better=True),
           # rows with a draft: its seconds a run, and the share of rounds its guard ran the target alone (what a
           # row's figures came from: drafting, or checks of it)
           Figure("draft_s", "draft s", ".2f", lower_is_better=True),
           Figure("alone_share", "share of rounds the target ran alone", ".2f"),
           Figure("kv_bytes_per_token", "KV bytes / token", ".0f", lower_is_better=True),
           Figure("process_wall_s", "process wall s", ".1f", lower_is_better=True)]

# the tasks on the document, by name: what the request asks of it (quote: {name} is a function in the document)
TASKS = {"summarize": "Summarize the code above.",
         "quote": "Quote the function `{name}` from the code above exactly as it is written, and nothing else."}
QUESTION_ROOM = 64  # tokens kept for the question when choosing the function to quote (see prompt_ids)

METHOD = ("A prompt of N tokens is cut from a long text (this package's own Python sources, a stand-in for a "
          "document), followed by a task in the chat template: \"Summarize the code above.\", or \"Quote the function "
          "`NAME` from the code above exactly as it is written\" for a function defined near the middle of the cut "
          "text (an extractive answer: its tokens are in the prompt). Every run generates --max-new-tokens greedy "
          "tokens (EOS ignored) from exactly those token ids, in a fresh process of its own (fresh_process.py) so "
          "that its peak resident memory is its own: one uncounted run, then the median of --runs-per-process "
          "timed runs in that process; --repeats such processes per row and cell, interleaved with the other "
          "rows'. Ours alone loads the bundle's target without its draft (as GenAI's row holds the target "
          "alone); the default loads both. Ours with the engine's defaults as the Python API and serve open it (a "
          "draft under 256 MB gets copies compiled for its most-run call sizes, in the uncounted run), but without "
          "prefix reuse (each run prefills the whole prompt, the draft's cache emptied too) and without a draft "
          "pool: its time to the first token and after it are from its own Stats. GenAI with its prefix cache off "
          "and no streamer: its time to the first token and its time per output token after it are GenAI's own "
          "perf_metrics of the run (get_ttft, get_tpot), so neither side's figures include a streamer's callbacks. "
          "The u8 KV cache is exact only up to float noise, and GenAI runs with other CPU properties: their tokens "
          "are not compared.")

# --per-call: what the target's calls cost inside the timed runs of ours (benchmark/target_calls.py)
PER_CALL_FIGURES = [Figure("step_ms", "target ms / 1-token step", ".2f", lower_is_better=True),
                    Figure("block_ms", "target ms / block", ".2f", lower_is_better=True),
                    Figure("block_tokens", "tokens / block", ".2f"),
                    Figure("decode_past", "past at those calls", ".0f")]

SOURCE = Path(__file__).resolve().parent.parent.parent  # edge_specdec: the long text


def long_text() -> str:
    """The long text prompts are cut from: this package's own Python sources, one after another."""
    return "\n\n".join(p.read_text() for p in sorted(SOURCE.rglob("*.py")))


def quoted_function(text: str) -> str:
    """The function a quote task asks for: of the functions defined in text whose name appears there once, the one
    whose definition starts nearest the middle (an answer from deep inside the document)."""
    found = [(m.start(), m.group(1)) for m in re.finditer(r"^\s*def (\w+)\(", text, re.MULTILINE)]
    unique = [(at, name) for at, name in found if len(re.findall(rf"\b{name}\b", text)) == 1]
    if not unique:
        raise RuntimeError("the document's cut holds no function defined once to quote: give longer --lengths")
    return min(unique, key=lambda item: abs(item[0] - len(text) / 2))[1]


def prompt_ids(started: float, bundle: str, lengths: list[int], tasks: list[str]) -> dict:
    """In a fresh process: the suite's prompts (suite_prompts) for the bundle."""
    from ...runtime import Engine

    engine = Engine(bundle, static_shapes=False, fixed_blocks=False, draft_pool_tokens=0)
    return {"ids": suite_prompts(engine, lengths, tasks)}


def suite_prompts(engine, lengths: list[int], tasks: list[str]) -> dict[str, list[int]]:
    """For each length N and task ("N/task"), N token ids of an open engine's target: the start of a long text, then
    the task's request (in the chat template where the target has one)."""
    from ...runtime.text import decode

    ids = engine.tokenizer.encode(long_text())
    head = engine.tokenizer.encode("```python\n")
    if len(ids) < max(lengths):
        raise RuntimeError(f"the text has only {len(ids)} tokens, fewer than {max(lengths)}")

    def request(question: str) -> list[int]:
        if engine.chat_template is not None:
            return engine.chat_prompt([{"role": "user", "content": question}])
        return engine.tokenizer.encode(f"\n\n{question}\n")

    out: dict[str, list[int]] = {}
    for n in lengths:
        room = n - len(head) - QUESTION_ROOM  # the document's tokens, whatever the question
        for task in tasks:
            question = TASKS[task]
            if "{name}" in question:
                question = question.format(name=quoted_function(decode(engine.vocab_map.target, ids[:room])))
            tail = request(question)
            if len(tail) > QUESTION_ROOM:
                raise RuntimeError(f"the {task} request takes {len(tail)} tokens, more than {QUESTION_ROOM}")
            out[f"{n}/{task}"] = head + ids[:n - len(head) - len(tail)] + tail
    return out


def ours_pipeline(bundle: str, kv_cache: Optional[str] = None, core=None, long_prompt_precision: str = "auto",
                  draft: bool = True, prefix_reuse: bool = False):
    """Our Pipeline as the suite runs it: the engine's defaults as the Python API and serve open it (static copies
    for a small draft's most-run call sizes among them: the desktop apps that send long prompts talk to serve), but
    no prefix reuse (each run prefills the whole prompt; prefix_reuse=True: the target keeps the prompt's KV from
    one run to the next) and no draft pool (a repeat must not copy the answer of the run before it); draft=False:
    the bundle's target alone, its draft not loaded (what a row of the target alone measures, as GenAI's row holds
    the target alone)."""
    from ...bundle import load_bundle
    from ...runtime import Pipeline

    loaded = load_bundle(bundle, verify=False)
    return Pipeline(loaded if draft else loaded.without_draft(), kv_cache=kv_cache, prefix_reuse=prefix_reuse,
                    draft_pool_tokens=0, core=core, long_prompt_precision=long_prompt_precision)


def add_one_prompt_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of a benchmark script that times runs on one of this suite's prompts on one engine
    (benchmarks/guard_*.py): the bundle, the prompt's length and task, the tokens a run writes."""
    parser.add_argument("bundle", help="a bundle folder with a draft model")
    parser.add_argument("--length", type=int, default=8192, help="the prompt's tokens")
    parser.add_argument("--task", default="summarize", choices=sorted(TASKS))
    parser.add_argument("--max-new-tokens", type=int, default=64)


def one_prompt(args: argparse.Namespace, prefix_reuse: bool = False):
    """For such a script: our Pipeline as this suite opens it (ours_pipeline, with prefix_reuse), the prompt's token
    ids, and the greedy config of its runs (EOS ignored, so each writes --max-new-tokens tokens)."""
    from ...runtime import GenerationConfig

    pipe = ours_pipeline(args.bundle, prefix_reuse=prefix_reuse)
    ids = suite_prompts(pipe, [args.length], [args.task])[f"{args.length}/{args.task}"]
    return pipe, ids, GenerationConfig(max_new_tokens=args.max_new_tokens, temperature=0, ignore_eos=True)


def ours_long(started: float, bundle: str, ids: list[int], max_new_tokens: int, repeats: int,
              kv_cache: Optional[str], algorithm: str, draft_window: Optional[int] = None,
              per_call: bool = False, long_prompt_precision: str = "auto") -> dict:
    """In a fresh process: our Pipeline on the prompt, one uncounted run, then the medians of `repeats` runs;
    draft_window: SpeculativeConfig.draft_window (None: its default). per_call: the timed runs record their target
    calls, summed up as PER_CALL_FIGURES (medians over the runs), and returned whole as "target_calls".
    long_prompt_precision: EngineConfig.long_prompt_precision (one asked for by name must be kept)."""
    from ...runtime import GenerationConfig
    from ..target_calls import call_figures

    pipe = ours_pipeline(bundle, kv_cache, long_prompt_precision=long_prompt_precision, draft=algorithm != "none")
    if long_prompt_precision not in ("auto", "off") and pipe.target_model.prefill is None:
        raise RuntimeError(f"--long-prompt-precisions {long_prompt_precision}: {pipe.long_prompt_note}")
    config = GenerationConfig(max_new_tokens=max_new_tokens, temperature=0, ignore_eos=True)

    def run(record: bool):
        if pipe.draft is not None:  # the draft prefills the prompt in every run too, as the target does
            pipe.draft.reset()
        return pipe.generate(ids, config, algorithm=algorithm, draft_window=draft_window, record_target_calls=record)
    runs = [run(per_call and i > 0) for i in range(repeats + 1)][1:]
    out = {"ttft_s": statistics.median(r.stats.first_token_seconds for r in runs),
           "tokens_per_s_after_first": statistics.median(
               (len(r.token_ids) - 1) / max(1e-9, r.stats.seconds - r.stats.first_token_seconds) for r in runs),
           "token_ids": list(runs[-1].token_ids), "kv_bytes_per_token": pipe.target_model.kv_bytes_per_token}
    if pipe.draft is not None:
        out["draft_s"] = statistics.median(r.stats.draft_seconds for r in runs)
        out["alone_share"] = statistics.median(r.stats.rounds_drafting_paused / max(1, r.stats.rounds) for r in runs)
    if per_call:
        figures = [call_figures(r.stats.target_calls, len(ids)) for r in runs]
        for f in PER_CALL_FIGURES:
            values = [x[f.key] for x in figures if x[f.key] is not None]
            out[f.key] = statistics.median(values) if values else None
        out["target_calls"] = [[list(c) for c in r.stats.target_calls] for r in runs]
    return out


def profile_long(started: float, bundle: str, ids: list[int], max_new_tokens: int, algorithm: str) -> dict:
    """In a fresh process: our Pipeline with the CPU plugin's PERF_COUNT=YES, one uncounted run, then one run whose
    target calls are profiled (target_calls.NodeProfile); with the threads the plugin reports."""
    import openvino as ov

    from ...errors import EdgeSpecdecError
    from ...runtime import GenerationConfig
    from ..target_calls import NodeProfile, counted_calls, plugin_threads

    core = ov.Core()  # (after the runtime's import: openvino_tokenizers adds its operations to every Core)
    core.set_property("CPU", {"PERF_COUNT": "YES"})
    with counted_calls() as counts:  # from the compile on: the plugin's node times are means over every call
        pipe = ours_pipeline(bundle, core=core, draft=algorithm != "none")  # as the timed row of that algorithm
        compiled = pipe.target_model.compiled
        threads = plugin_threads(compiled)
        if str(compiled.get_property("PERF_COUNT")).upper() not in ("YES", "TRUE") or threads["num_streams"] != 1:
            raise EdgeSpecdecError(f"--profile reads the CPU plugin's per-node times of a target compiled for one "
                                   f"stream, and the target runs on {pipe.placement.target} with "
                                   f"{threads['num_streams']} streams: run it where the target runs on the CPU.")
        config = GenerationConfig(max_new_tokens=max_new_tokens, temperature=0, ignore_eos=True)
        pipe.generate(ids, config, algorithm=algorithm)
        if pipe.draft is not None:
            pipe.draft.reset()
        profile = NodeProfile(pipe.target, len(ids), counts)
        try:
            pipe.generate(ids, config, algorithm=algorithm)
        finally:
            profile.detach()
    return {"calls": profile.summary(), "threads": threads, "device": pipe.placement.target}


def genai_long(started: float, bundle: str, ids: list[int], max_new_tokens: int, repeats: int,
               properties: str) -> dict:
    """In a fresh process: GenAI's LLMPipeline on the same ids; properties "default", "ours" (our CPU
    properties) or a KV cache type (its defaults but that KV cache). Its figures are its own perf_metrics: the time
    to the first token (get_ttft) and the mean time per output token after it (get_tpot), both in milliseconds."""
    import numpy as np
    import openvino as ov
    import openvino_genai as og

    from ...bundle import load_bundle
    from ...runtime.devices import PROFILES
    from ...runtime.graph import int4_group_size

    target = load_bundle(bundle, verify=False).target
    props = {}
    if properties == "ours":
        props = PROFILES["CPU"].precision_properties("dq", int4_group_size(ov.Core().read_model(str(target.model_xml))))
    elif properties != "default":
        props["KV_CACHE_PRECISION"] = properties
    scheduler = og.SchedulerConfig()
    scheduler.enable_prefix_caching = False
    pipe = og.LLMPipeline(str(target.folder), "CPU", scheduler_config=scheduler, **props)
    config = og.GenerationConfig(max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens)
    tokens = ov.Tensor(np.array([ids], dtype=np.int64))
    ttfts, rates, generated = [], [], []
    for _ in range(repeats + 1):
        result = pipe.generate(tokens, config)
        metrics = result.perf_metrics
        ttfts.append(metrics.get_ttft().mean / 1000)
        rates.append(1000 / max(1e-9, metrics.get_tpot().mean))
        generated = [int(t) for t in result.tokens[0]]
    return {"ttft_s": statistics.median(ttfts[1:]), "tokens_per_s_after_first": statistics.median(rates[1:]),
            "token_ids": generated}


def fresh_row(name: str, description: str, function: str, reference: Optional[str],
              calls: Optional[dict] = None, **kwargs) -> SuiteRow:
    """A row whose every run is one of this module's functions in a fresh process, on the cell's token ids; calls
    (a dict) gets the target calls its timed runs recorded (--per-call), calls[name][cell key]."""
    from ..fresh_process import run_fresh

    def run(c: Cell, repeat: int) -> Measured:
        got = run_fresh(f"{__name__}:{function}", ids=c.value, **kwargs)
        if calls is not None and repeat >= 0 and got.get("target_calls"):
            calls.setdefault(name, {}).setdefault(c.key, []).extend(got["target_calls"])
        return Measured({f.key: got.get(f.key) for f in FIGURES + PER_CALL_FIGURES}, got.get("token_ids"))
    return SuiteRow(name, description, run, reference=reference)


def long_prompt_rows(args, bundle: str, say, calls: Optional[dict] = None) -> tuple[list[SuiteRow], list[dict]]:
    """Ours alone and with the default algorithm (at the default KV cache, each of --kv-caches, each exact one
    checked against the target alone on it, and each of --draft-windows), then GenAI's; calls (with --per-call):
    where ours' rows put their target calls."""
    import importlib.util

    common = {"bundle": bundle, "max_new_tokens": args.max_new_tokens, "repeats": args.runs_per_process}
    ours = {**common, "per_call": calls is not None, "calls": calls}
    rows = [fresh_row("ours-none", "ours, the target alone (the draft not loaded), the default KV cache", "ours_long",
                      None, kv_cache=None, algorithm="none", **ours),
            fresh_row("ours-auto", "ours, the default algorithm, the default KV cache", "ours_long", "ours-none",
                      kv_cache=None, algorithm="auto", **ours)]
    for kv in dict.fromkeys(args.kv_caches):
        # another exact cache type computes other (equally exact) tokens: its reference is the target alone on it
        reference = None if kv == "u8" else f"ours-none-kv-{kv}"
        if reference:
            rows.append(fresh_row(reference, f"ours, the target alone (the draft not loaded), a {kv} KV cache",
                                  "ours_long", None, kv_cache=kv, algorithm="none", **ours))
        rows.append(fresh_row(f"ours-auto-kv-{kv}", f"ours, the default algorithm, a {kv} KV cache", "ours_long",
                              reference, kv_cache=kv, algorithm="auto", **ours))
    rows += [fresh_row(f"ours-auto-window-{n}" if n else "ours-auto-no-window",
                       "ours, the default algorithm, the draft reading "
                       + (f"a window of {n} tokens" if n else "the whole prompt (no window)"),
                       "ours_long", "ours-none", kv_cache=None, algorithm="auto", draft_window=n, **ours)
             for n in dict.fromkeys(args.draft_windows)]
    for p in dict.fromkeys(args.long_prompt_precisions):
        # the copy computes the prompt otherwise: the reference is the target alone with the same copy
        rows += [fresh_row(f"ours-none-prefill-{p}",
                           f"ours, the target alone (the draft not loaded), long prompts prefilled at {p}",
                           "ours_long", None, kv_cache=None, algorithm="none", long_prompt_precision=p, **ours),
                 fresh_row(f"ours-auto-prefill-{p}", f"ours, the default algorithm, long prompts prefilled at {p}",
                           "ours_long", f"ours-none-prefill-{p}", kv_cache=None, algorithm="auto",
                           long_prompt_precision=p, **ours)]
    genai = [] if args.no_genai else [("genai-none", "default", "its default CPU properties")]
    genai += [("genai-ours", "ours", "our CPU properties")] if args.genai_ours else []
    genai += [(f"genai-kv-{kv}", kv, f"its default CPU properties but a {kv} KV cache") for kv in args.genai_kv]
    if genai and importlib.util.find_spec("openvino_genai") is None:
        reason = "openvino_genai is not installed; pip install 'edge-specdec[bench]'"
        say(f"skipping {', '.join(name for name, _, _ in genai)}: {reason}")
        return rows, [{"setup": name, "reason": reason} for name, _, _ in genai]
    rows += [fresh_row(name, f"OpenVINO GenAI LLMPipeline, the target alone, {what}", "genai_long", None,
                       properties=properties, **common) for name, properties, what in genai]
    return rows, []


def main(args: argparse.Namespace) -> int:
    from ...bundle import load_bundle
    from ...errors import EdgeSpecdecError
    from ...runtime.settings import SpeculativeConfig
    from ..fresh_process import run_fresh
    from ..suite_runs import check_out, finish, run_suite, stderr_say
    from ..target_calls import calls_markdown

    lengths = sorted(dict.fromkeys(args.lengths))
    tasks = list(dict.fromkeys(args.tasks))
    if min(lengths) < 64 + QUESTION_ROOM or args.max_new_tokens < 2 or args.repeats < 1 or args.runs_per_process < 1:
        raise EdgeSpecdecError(f"--lengths must be at least {64 + QUESTION_ROOM} tokens, --max-new-tokens at least 2, "
                               f"--repeats and --runs-per-process at least 1.")
    if args.profile and (args.per_call or args.draft_windows):
        raise EdgeSpecdecError("--profile runs profiled runs instead of the timed rows: give it without --per-call "
                               "and --draft-windows.")
    for n in args.draft_windows:
        SpeculativeConfig(draft_window=n)  # a window no run could take is refused before any process starts
    out = Path(args.out) if args.out else None
    check_out(out)
    bundle = load_bundle(Path(args.bundle).resolve(), verify=False)
    context = bundle.manifest.get("target", {}).get("max_position_embeddings")
    if context and max(lengths) + args.max_new_tokens > context:
        raise EdgeSpecdecError(f"--lengths {max(lengths)} and --max-new-tokens {args.max_new_tokens} go past the "
                               f"target's context of {context} tokens: give shorter lengths.")
    stderr_say(f"cutting prompts of {', '.join(map(str, lengths))} tokens (a fresh process)")
    ids = run_fresh(f"{__name__}:prompt_ids", bundle=str(bundle.path), lengths=lengths, tasks=tasks)["ids"]
    cells = [Cell(f"{n} tokens, {task}", ids[f"{n}/{task}"]) for n in lengths for task in tasks]
    if args.profile:
        return profile_cells(bundle, cells, args.max_new_tokens, out)
    calls = {} if args.per_call else None  # row -> cell -> the timed runs' target calls
    rows, skipped = long_prompt_rows(args, str(bundle.path), stderr_say, calls)
    prompts = {c.key: len(c.value) for c in cells}
    suite = Suite("long-prompts", bundle, rows, cells, FIGURES + (PER_CALL_FIGURES if args.per_call else []),
                  headline="ttft_s", baseline="ours-none", method=METHOD, skipped=skipped, repeats=args.repeats,
                  progress_figures=5,
                  settings={"lengths": lengths, "tasks": tasks, "max_new_tokens": args.max_new_tokens,
                            "runs_per_process": args.runs_per_process, "per_call": args.per_call},
                  extra_markdown=(lambda report: calls_markdown(calls, prompts)) if args.per_call else None)
    report = run_suite(suite, out, args.command_line)
    if calls is not None:  # every call of every timed run, beside the report: [tokens, block, past, seconds]
        path = Path(report["files"]["json"]).with_name("target_calls.json")
        write_json(path, {"columns": ["tokens", "block", "past", "seconds"], "prompt_tokens": prompts,
                          "runs": calls}, indent=None)
        stderr_say(f"wrote {path}")
    return finish(report)


def profile_cells(bundle, cells: list[Cell], max_new_tokens: int, out: Optional[Path]) -> int:
    """--profile: for each cell, the target alone and the default algorithm, each in a fresh process
    (profile_long); the tables printed and written as profile.md and profile.json."""
    from ..fresh_process import run_fresh
    from ..suite_runs import default_out, stderr_say
    from ..target_calls import profile_markdown

    profiles = []
    for cell in cells:
        for algorithm in ("none", "auto"):
            stderr_say(f"profiling {cell.key}, {algorithm} (a fresh process, PERF_COUNT=YES)")
            got = run_fresh(f"{__name__}:profile_long", bundle=str(bundle.path), ids=cell.value,
                            max_new_tokens=max_new_tokens, algorithm=algorithm)
            profiles.append({"cell": cell.key, "algorithm": algorithm, "device": got["device"],
                             "threads": got["threads"], "calls": got["calls"]})
    text = profile_markdown(profiles)
    folder = out if out is not None else default_out(bundle, "long-prompts")
    write_json(folder / "profile.json", {"bundle": str(bundle.path), "max_new_tokens": max_new_tokens,
                                         "profiles": profiles})
    write_text(folder / "profile.md", text)
    print(text)
    stderr_say(f"wrote {folder / 'profile.md'}, {folder / 'profile.json'}")
    return 0


def write_json(path: Path, data, indent: Optional[int] = 1) -> None:
    import json

    write_text(path, json.dumps(data, indent=indent) + "\n")


def write_text(path: Path, text: str) -> None:
    """The file whole or not at all: written beside it, then moved into place."""
    from ...errors import EdgeSpecdecError

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        part = path.with_name(path.name + ".part")
        part.write_text(text, encoding="utf-8")
        part.replace(path)
    except OSError as exc:
        raise EdgeSpecdecError(f"cannot write {path}: {exc.strerror or exc}.") from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ...runtime.devices import KV_CACHES, LONG_PROMPT_PRECISIONS

    p.description = __doc__
    p.epilog = ("examples:\n  edge-specdec bench long-prompts bundles/qwen+smollm --lengths 4096 8192 "
                "--max-new-tokens 64 --repeats 3 --kv-caches\n"
                "  edge-specdec bench long-prompts bundles/qwen+smollm --lengths 1024 4096 8192 --kv-caches "
                "--no-genai --per-call    # the target's time per call, by call size and past\n"
                "  edge-specdec bench long-prompts bundles/qwen+smollm --lengths 4096 --tasks summarize "
                "--max-new-tokens 16 --profile    # where a call's time goes, by node type")
    p.add_argument("--lengths", type=int, nargs="+", default=[4096, 8192], metavar="N",
                   help="prompt lengths in tokens (default 4096 8192)")
    p.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS), metavar="TASK",
                   help="what each prompt asks of its document: summarize (summarize it), quote (quote a function "
                        "defined in it word for word: an answer copied from the prompt); default: both")
    p.add_argument("--max-new-tokens", type=int, default=64, metavar="N", help="tokens per run (default 64)")
    p.add_argument("--repeats", type=int, default=3, metavar="N",
                   help="fresh processes per row and cell, interleaved with the other rows' (default 3)")
    p.add_argument("--runs-per-process", type=int, default=1, metavar="N",
                   help="timed runs in each process, after one uncounted run (default 1)")
    p.add_argument("--kv-caches", nargs="*", default=["f32", "u8"], choices=KV_CACHES, metavar="TYPE",
                   help="a row of ours with the default algorithm at each of these KV cache types, beside the default "
                        "one, and for an exact type (f32, f16) the target alone on it as its reference (default: f32 "
                        "u8; none: just the flag)")
    p.add_argument("--draft-windows", nargs="+", type=int, default=[], metavar="N",
                   help="add a row of ours with the default algorithm whose draft reads a window of N tokens of the "
                        "prompt and output (--draft-window; 0: the whole of them), for each N")
    p.add_argument("--long-prompt-precisions", nargs="+", default=[],
                   choices=[p for p in LONG_PROMPT_PRECISIONS if p != "auto"], metavar="PRECISION",
                   help="add rows of ours, the target alone and the default algorithm, whose long prompts are "
                        "prefilled at PRECISION (--long-prompt-precision; the other rows take its default, auto), "
                        "for each one; off: on the target")
    p.add_argument("--per-call", action="store_true",
                   help="our rows' timed runs record every target call (its tokens, its block on the device, the "
                        "past it attends over, its time): the table gets the target's mean ms per 1-token step and "
                        "per verification block, the blocks' tokens and the past, report.md a table by call size, "
                        "and target_calls.json every call")
    p.add_argument("--profile", action="store_true",
                   help="instead of the timed rows: at each length and task, one run of the target alone and one of "
                        "the default algorithm with OpenVINO's PERF_COUNT=YES, each in a fresh process; prints the "
                        "target's per-node-type time per call (the prefill, each block size) and the threads the "
                        "CPU plugin reports for it (profile.md, profile.json); profiled calls are slower: read "
                        "shares, not timings")
    p.add_argument("--no-genai", action="store_true", help="leave out OpenVINO GenAI's row")
    p.add_argument("--genai-ours", action="store_true", help="add GenAI with our CPU properties")
    p.add_argument("--genai-kv", nargs="+", default=[], choices=("f16", "f32"), metavar="TYPE",
                   help="add GenAI with its default properties but these KV cache types (f16, f32)")
