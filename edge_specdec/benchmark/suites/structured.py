"""The structured suite: JSON-schema tasks (extraction, classification, function calls) under a grammar, the
constrained target alone against our default algorithm and OpenVINO GenAI's StructuredOutputConfig."""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from ..structured_tasks import TASKS, task_names
from ..suite_runs import Cell, Figure, Measured, Suite, SuiteRow

SUMMARY = "JSON-schema tasks under a grammar: the constrained target alone, our default and GenAI's structured output"

FIGURES = [Figure("tokens_per_s", "tok/s"),
           Figure("seconds", "s per task", ".2f", lower_is_better=True),
           Figure("tokens", "tokens", ".0f"),
           Figure("valid", "schema-valid", ".0f", total=True),
           Figure("grammar_tokens", "tokens forced by the grammar", ".0f", total=True)]

METHOD = ("Each task asks for JSON under a schema (an extraction, a classification into an enum, or a function call "
          "as {\"name\", \"arguments\"}), in the target's chat template, greedy; ours under "
          "`Constraint.json_schema`, GenAI under `StructuredOutputConfig(json_schema=...)` on the same rendered text. "
          "A time is the whole request, prefill included. Every answer is validated against its schema (with "
          "jsonschema, when installed); our default must write the constrained target alone's token ids.")


def schema_valid(schema: dict, text: str):
    """1 or 0: whether text is JSON that the schema accepts; None without jsonschema."""
    try:
        import jsonschema
    except ImportError:
        return None
    try:
        jsonschema.validate(json.loads(text), schema)
    except (ValueError, jsonschema.ValidationError):
        return 0
    return 1


def ours_runner(engine, algorithm: str, max_new_tokens: int):
    from ...runtime import GenerationConfig
    from ...runtime.constraint import Constraint
    from ..compare import forget_prompt

    session = engine.session()

    def run(c: Cell, repeat: int) -> Measured:
        schema, text = c.value
        config = GenerationConfig(max_new_tokens=max_new_tokens, constraint=Constraint.json_schema(schema))
        forget_prompt(session)  # each run prefills its whole prompt, as GenAI's does
        start = time.perf_counter()
        result = session.generate(engine.chat_prompt([{"role": "user", "content": text}]), config,
                                  algorithm=algorithm)
        seconds = time.perf_counter() - start
        return Measured({"tokens_per_s": len(result.token_ids) / seconds, "seconds": seconds,
                         "tokens": len(result.token_ids), "valid": schema_valid(schema, result.text),
                         "grammar_tokens": result.stats.grammar_tokens_accepted}, list(result.token_ids))
    return run


def genai_runner(og, engine, max_new_tokens: int, draft_folder=None):
    extra = {"draft_model": og.draft_model(str(draft_folder), "CPU")} if draft_folder else {}
    pipe = og.LLMPipeline(str(engine.bundle.target.folder), "CPU", **extra)

    def run(c: Cell, repeat: int) -> Measured:
        schema, text = c.value
        config = og.GenerationConfig()
        config.max_new_tokens = max_new_tokens
        config.structured_output_config = og.StructuredOutputConfig(json_schema=json.dumps(schema))
        config.apply_chat_template = False  # the same rendered prompt as ours
        if draft_folder:
            config.num_assistant_tokens = 5
        start = time.perf_counter()
        answer = str(pipe.generate(engine.chat_template.render([{"role": "user", "content": text}]), config))
        seconds = time.perf_counter() - start
        tokens = len(engine.tokenizer.encode(answer))
        return Measured({"tokens_per_s": tokens / seconds, "seconds": seconds, "tokens": tokens,
                         "valid": schema_valid(schema, answer)})
    return run


def genai_rows(args, engine, say) -> tuple[list[SuiteRow], list[dict]]:
    """GenAI's rows: LLMPipeline with structured output, and with a same-vocabulary draft (the bundle's own, or
    --genai-draft's); skipped with the reason when openvino_genai is not installed."""
    from ..genai_draft import load_genai_draft
    from ..suite_runs import genai_or_reason

    if args.no_genai:
        load_genai_draft(engine.bundle, args.genai_draft, False)  # refuses --genai-draft with --no-genai
        return [], []
    other = load_genai_draft(engine.bundle, args.genai_draft, True)
    draft = other.draft.folder if other is not None else (
        engine.bundle.draft.folder if engine.bundle.vocabulary["relation"] == "identical" else None)
    og, reason = genai_or_reason()
    names = ["genai"] + (["genai-sd"] if draft else [])
    if og is None:
        say(f"skipping {', '.join(names)}: {reason}")
        return [], [{"setup": name, "reason": reason} for name in names]
    rows = [SuiteRow("genai", "OpenVINO GenAI LLMPipeline with StructuredOutputConfig (JSON schema), its default "
                     "CPU properties", genai_runner(og, engine, args.max_new_tokens))]
    if draft:
        rows.append(SuiteRow("genai-sd", f"the same with GenAI's speculative decoding, K=5, drafting with {draft}",
                             genai_runner(og, engine, args.max_new_tokens, draft)))
    return rows, []


def main(args: argparse.Namespace) -> int:
    from ...errors import EdgeSpecdecError
    from ...runtime import Engine
    from ..suite_runs import check_out, finish, run_suite, stderr_say

    if not 1 <= args.limit <= len(TASKS) or args.max_new_tokens < 1 or args.repeats < 1:
        raise EdgeSpecdecError(f"--limit takes 1 to {len(TASKS)}; --max-new-tokens and --repeats at least 1.")
    out = Path(args.out) if args.out else None
    check_out(out)
    engine = Engine(args.bundle, draft_pool_tokens=0)  # no draft pool: no run copies an earlier run's answer
    engine.compile_static_copies()  # timed as a server runs once its copies serve, not while they compile
    if engine.chat_template is None:
        raise EdgeSpecdecError(f"{args.bundle}: the target has no chat template, which the structured tasks are "
                               f"written for; try the general suite.")
    rows = [SuiteRow("ours-none", "ours, the constrained target alone", ours_runner(engine, "none",
                                                                                    args.max_new_tokens)),
            SuiteRow("ours-auto", f"ours, the constrained default algorithm ({engine.resolve_algorithm('auto')})",
                     ours_runner(engine, "auto", args.max_new_tokens), reference="ours-none")]
    peers, skipped = genai_rows(args, engine, stderr_say)
    cells = [Cell(name, task) for name, task in zip(task_names(), TASKS)][:args.limit]
    suite = Suite("structured", engine.bundle, rows + peers, cells, FIGURES, headline="tokens_per_s",
                  baseline="ours-none", method=METHOD, repeats=args.repeats, warm_ups=cells[:1], skipped=skipped,
                  settings={"tasks": len(cells), "max_new_tokens": args.max_new_tokens})
    return finish(run_suite(suite, out, args.command_line))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = __doc__
    p.epilog = ("example:\n  edge-specdec bench structured bundles/qwen+smollm --genai-draft bundles/qwen+qwen0.5b\n"
                "the tasks: edge_specdec/benchmark/structured_tasks.py")
    p.add_argument("--limit", type=int, default=len(TASKS), metavar="N",
                   help=f"the first N tasks (default: all {len(TASKS)})")
    p.add_argument("--max-new-tokens", type=int, default=96, metavar="N", help="tokens per answer at most (default 96)")
    p.add_argument("--repeats", type=int, default=1, metavar="N", help="timed runs per task and row (default 1)")
    p.add_argument("--no-genai", action="store_true", help="leave out OpenVINO GenAI's rows")
    p.add_argument("--genai-draft", metavar="BUNDLE",
                   help="a bundle of the same target whose draft shares its vocabulary: adds genai-sd, GenAI's "
                        "speculative decoding with that draft (a same-vocabulary bundle gets it with its own)")
