"""The start-up suite: each run a fresh process that loads the bundle and answers one prompt, as a one-shot user
waits for it: load time, time to the first token, tokens/s, peak memory and the process's wall time; ours through
the Python API and through `edge-specdec run`, against OpenVINO GenAI's LLMPipeline."""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import time
from pathlib import Path
from typing import Any, Optional

from ..suite_runs import Cell, Figure, Measured, Suite, SuiteRow

SUMMARY = ("fresh processes, as a one-shot user starts them: load, first token, tokens/s and peak memory, ours (API "
           "and `edge-specdec run`) against GenAI")

FIGURES = [Figure("first_token_s", "first token s from the start", ".2f", lower_is_better=True),
           Figure("load_s", "load s", ".2f", lower_is_better=True),
           Figure("request_first_token_s", "first token s from the request", ".2f", lower_is_better=True),
           Figure("tokens_per_s", "tok/s"),
           Figure("peak_rss_mib", "peak RSS MiB", ".0f", lower_is_better=True),
           Figure("process_wall_s", "process wall s", ".2f", lower_is_better=True)]

METHOD = ("Every run is a new Python process (fresh_process.py) that loads the bundle and generates --max-new-tokens "
          "tokens (EOS ignored, greedy) from a code prompt in the target's chat template; OpenVINO's compiled-model "
          "caches are warm after the uncounted first round. First token from the start: from the process's first "
          "line to its first token (imports, load and the request's prefill); from the request: after the load. "
          "Peak RSS: the process's own (VmHWM). Process wall: the parent's clock from starting the process to its "
          "exit, what a one-shot user waits. Our rows must write `run-none`'s token ids.")


def _first_token_clock(first: list):
    """A streamer that notes when the first piece came, and never asks to stop (GenAI stops on True)."""
    def note(_piece) -> bool:
        if not first:
            first.append(time.perf_counter())
        return False
    return note


def ours_api(started: float, bundle: str, messages: list, max_new_tokens: int, algorithm: str,
             warm_up: bool = True) -> dict:
    """In the fresh process: Pipeline(bundle) and one request, timed from the process's first line."""
    from ...runtime import GenerationConfig, Pipeline

    pipe = Pipeline(bundle, **({} if warm_up else {"warm_up": False}))
    load = time.perf_counter() - started
    prompt = pipe.chat_prompt(messages) if pipe.chat_template is not None else messages[-1]["content"]
    config = GenerationConfig(max_new_tokens=max_new_tokens, ignore_eos=True,
                              repetition_penalty=pipe.default_config.repetition_penalty)
    first: list[float] = []
    result = pipe.generate(prompt, config, algorithm=algorithm, on_text=_first_token_clock(first))
    return {"load_s": load, "first_token_s": first[0] - started, "request_first_token_s": first[0] - started - load,
            "tokens_per_s": result.stats.tokens_per_s, "token_ids": list(result.token_ids)}


def ours_cli(started: float, bundle: str, messages: list, max_new_tokens: int, algorithm: str, chat: bool) -> dict:
    """In the fresh process: `edge-specdec run ... --json` as a user types it, its stdout read back."""
    from ...cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["run", bundle, *(["--chat"] if chat else []), "--prompt", messages[-1]["content"],
                     "--max-new-tokens", str(max_new_tokens), "--ignore-eos", "--algorithm", algorithm, "--json"])
    end = time.perf_counter() - started
    if code:
        raise RuntimeError(f"edge-specdec run exited with {code}")
    report = json.loads(out.getvalue())
    stats = report["stats"]
    return {"load_s": report["load_seconds"], "first_token_s": end - stats["seconds"] + stats["first_token_seconds"],
            "request_first_token_s": stats["first_token_seconds"], "tokens_per_s": stats["tokens_per_s"],
            "token_ids": report["token_ids"]}


def genai(started: float, target: str, draft: Optional[str], prompt: str, max_new_tokens: int) -> dict:
    """In the fresh process: OpenVINO GenAI's LLMPipeline (with draft: speculative, K=3), one request."""
    import openvino_genai as og

    cache = os.path.join(os.path.expanduser("~"), ".cache", "edge-specdec", "genai-cache")
    extra = {"draft_model": og.draft_model(draft, "CPU", CACHE_DIR=cache)} if draft else {}
    pipe = og.LLMPipeline(target, "CPU", CACHE_DIR=cache, **extra)
    load = time.perf_counter() - started
    config = og.GenerationConfig(max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens)
    config.apply_chat_template = False  # the prompt is rendered already, as ours is
    if draft:
        config.num_assistant_tokens = 3
    first: list[float] = []
    start = time.perf_counter()
    pipe.generate(prompt, config, _first_token_clock(first))
    end = time.perf_counter()
    return {"load_s": load, "first_token_s": first[0] - started, "request_first_token_s": first[0] - started - load,
            "tokens_per_s": max_new_tokens / (end - start)}


def fresh_row(name: str, description: str, function: str, reference: Optional[str] = "run-none",
              **kwargs: Any) -> SuiteRow:
    """A row whose every run is one of this module's functions in a fresh process: GenAI's on the cell's rendered
    prompt, ours on its messages."""
    from ..fresh_process import run_fresh

    def run(c: Cell, repeat: int) -> Measured:
        extra = {"prompt": c.value["text"]} if function == "genai" else {"messages": c.value["messages"]}
        got = run_fresh(f"{__name__}:{function}", **kwargs, **extra)
        return Measured({f.key: got.get(f.key) for f in FIGURES}, got.get("token_ids"))
    return SuiteRow(name, description, run, reference=reference)


def startup_rows(args, bundle, chat: bool, say) -> tuple[list[SuiteRow], list[dict]]:
    from ..genai_draft import load_genai_draft

    path, n = str(bundle.path), args.max_new_tokens
    rows = [fresh_row("ours", "ours, `Pipeline(bundle)` and one request (the default algorithm)", "ours_api",
                      bundle=path, max_new_tokens=n, algorithm="auto"),
            fresh_row("run-auto", "`edge-specdec run --algorithm auto --json`, as a user types it", "ours_cli",
                      bundle=path, max_new_tokens=n, algorithm="auto", chat=chat),
            fresh_row("run-none", "`edge-specdec run --algorithm none --json`: the target alone", "ours_cli",
                      reference=None, bundle=path, max_new_tokens=n, algorithm="none", chat=chat)]
    if args.no_warm_up:
        rows.insert(1, fresh_row("ours-no-warm-up", "ours with EngineConfig(warm_up=False): OpenVINO's preparation "
                                 "on the first request", "ours_api", bundle=path, max_new_tokens=n, algorithm="auto",
                                 warm_up=False))
    if args.no_genai:
        load_genai_draft(bundle, args.genai_draft, False)  # refuses --genai-draft with --no-genai
        return rows, []
    other = load_genai_draft(bundle, args.genai_draft, True)
    draft = other.draft if other is not None else bundle.draft if bundle.vocabulary["relation"] == "identical" else None
    names = ["genai-none"] + (["genai-sd"] if draft else [])
    import importlib.util

    if importlib.util.find_spec("openvino_genai") is None:
        reason = "openvino_genai is not installed; pip install 'edge-specdec[bench]'"
        say(f"skipping {', '.join(names)}: {reason}")
        return rows, [{"setup": name, "reason": reason} for name in names]
    target = str(bundle.target.folder)
    rows.append(fresh_row("genai-none", "OpenVINO GenAI LLMPipeline, the target alone", "genai", reference=None,
                          target=target, draft=None, max_new_tokens=n))
    if draft:
        rows.append(fresh_row("genai-sd", f"OpenVINO GenAI speculative, K=3, drafting with {draft.folder}", "genai",
                              reference=None, target=target, draft=str(draft.folder), max_new_tokens=n))
    return rows, []


def main(args: argparse.Namespace) -> int:
    from ...bundle import load_bundle
    from ...errors import EdgeSpecdecError
    from ...runtime.chat import ChatTemplate
    from ..prompt_set import load_prompt_set
    from ..suite_runs import check_out, finish, run_suite, stderr_say

    prompts = load_prompt_set()["code_generation"]
    if not 1 <= args.prompt_count <= len(prompts) or args.max_new_tokens < 1 or args.repeats < 1:
        raise EdgeSpecdecError(f"--prompt-count takes 1 to {len(prompts)}; --max-new-tokens and --repeats at least 1.")
    out = Path(args.out) if args.out else None
    check_out(out)
    bundle = load_bundle(os.path.abspath(args.bundle), verify=False)
    template = ChatTemplate.from_model_folder(bundle.target.folder)
    cells = []
    for item in prompts[:args.prompt_count]:
        messages = [{"role": "user", "content": item["text"]}]
        cells.append(Cell(item["id"], {"messages": messages,
                                       "text": template.render(messages) if template else item["text"]}))
    rows, skipped = startup_rows(args, bundle, template is not None, stderr_say)
    suite = Suite("startup", bundle, rows, cells, FIGURES, headline="first_token_s", baseline="run-none",
                  method=METHOD, repeats=args.repeats, warm_ups=cells[:1], skipped=skipped,
                  settings={"max_new_tokens": args.max_new_tokens, "prompts": len(cells)})
    return finish(run_suite(suite, out, args.command_line))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = __doc__
    p.epilog = ("examples:\n  edge-specdec bench startup bundles/qwen+smollm --genai-draft bundles/qwen+qwen0.5b "
                "--repeats 3\n  edge-specdec bench startup bundles/qwen+smollm --prompt-count 3 --max-new-tokens 128 "
                "--repeats 2   # one-shot runs: tokens/s")
    p.add_argument("--max-new-tokens", type=int, default=8, metavar="N", help="tokens per run (default 8)")
    p.add_argument("--prompt-count", type=int, default=1, metavar="N",
                   help="the first N code-generation prompts of the shipped set (default 1)")
    p.add_argument("--repeats", type=int, default=3, metavar="N",
                   help="timed runs per prompt and row, after one uncounted round (default 3)")
    p.add_argument("--no-warm-up", action="store_true",
                   help="add ours-no-warm-up: EngineConfig(warm_up=False), OpenVINO's preparation on the request")
    p.add_argument("--no-genai", action="store_true", help="leave out OpenVINO GenAI's rows")
    p.add_argument("--genai-draft", metavar="BUNDLE",
                   help="a bundle of the same target whose draft shares its vocabulary: adds genai-sd, GenAI's "
                        "speculative decoding with that draft (a same-vocabulary bundle gets it with its own)")
