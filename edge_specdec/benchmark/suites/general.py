"""The general suite, `edge-specdec bench [BUNDLE]`: the target alone, our algorithms and the peers side by side
on the shipped prompt categories (runner.py, report.py); with --clients, the clients suite (clients.py)."""
from __future__ import annotations

import argparse

from ...cli.common import DRAFT_VOCAB_HELP, say
from ...runtime.devices import PRECISIONS
from ...runtime.session import ROLLBACK_METHODS
from ..concurrency import GENAI_CONFIDENCE

SUMMARY = ("the default: every algorithm and peer on the shipped prompt categories, tokens/s and speedups "
           "(`edge-specdec bench [BUNDLE]`)")


def spelled_command(args: argparse.Namespace, spelled: list[str]) -> str:
    """The command for the report: as typed and, when it differs, with every option spelled out."""
    import shlex

    command, typed = shlex.join(spelled), args.command_line
    return typed if typed == command else f"{typed}\n# the same with every option spelled out:\n{command}"


def engine_config(args: argparse.Namespace):
    """The EngineConfig of bench's engine options (--precision, --kv-rollback, --draft-vocab)."""
    from ...runtime.settings import EngineConfig

    return EngineConfig(precision=args.precision, kv_rollback=args.kv_rollback,
                        **({} if args.draft_vocab is None else {"draft_vocab": args.draft_vocab}))


def main(args: argparse.Namespace) -> int:
    from ...errors import EdgeSpecdecError
    from .. import DEFAULT_KS, run_benchmark
    from ..report import render_markdown
    from . import clients

    if args.clients:
        # the options of this suite that mean nothing to the clients suite: refuse them rather than ignore them
        for flag, given in (("--ks", args.ks is not None), ("--hf", args.hf), ("--genai-ours", args.genai_ours),
                            ("--concurrent", args.concurrent), ("--other-draft", args.other_draft is not None),
                            ("--genai-confidences", args.genai_confidences is not None)):
            if given:
                raise EdgeSpecdecError(f"{flag} is an option of the rows benchmark, not of --clients, which has "
                                       f"rows of its own (see `edge-specdec bench clients --help`).")
        return clients.main(args)
    if args.genai_k is not None:
        raise EdgeSpecdecError("--genai-k is an option of the clients benchmark: add --clients, e.g. --clients 1 2 4 "
                               "8 (the rows benchmark has a genai-sd-kK row for each of --ks).")
    args.ks = args.ks or list(DEFAULT_KS)
    spelled = ["edge-specdec", "bench", args.bundle, "--max-new-tokens", str(args.max_new_tokens), "--repeats",
               str(args.repeats), "--ks", *map(str, args.ks), "--precision", args.precision]
    for flag, value in (("--setups", args.setups), ("--categories", args.categories)):
        spelled += [flag, *value] if value else []
    spelled += ["--prompts", args.prompts] if args.prompts else []
    spelled += ["--other-draft", args.other_draft, "--other-label", args.other_label] if args.other_draft else []
    spelled += ["--genai-draft", args.genai_draft] if args.genai_draft else []
    spelled += ["--genai-confidences", *map(str, args.genai_confidences)] if args.genai_confidences else []
    spelled += ["--out", args.out] if args.out else []
    spelled += ["--kv-rollback", args.kv_rollback] if args.kv_rollback else []
    spelled += ["--draft-vocab", str(args.draft_vocab)] if args.draft_vocab is not None else []
    spelled += [flag for flag, on in (("--hf", args.hf), ("--no-genai", args.no_genai),
                                      ("--genai-ours", args.genai_ours), ("--concurrent", args.concurrent)) if on]
    command = spelled_command(args, spelled)
    report = run_benchmark(args.bundle, setups=args.setups, max_new_tokens=args.max_new_tokens,
                           repeats=args.repeats, ks=args.ks, categories=args.categories, out=args.out,
                           genai=not args.no_genai, genai_ours=args.genai_ours, concurrent=args.concurrent,
                           hf=args.hf, engine=engine_config(args), prompts_file=args.prompts,
                           other_draft=args.other_draft,
                           other_label=args.other_label, genai_draft=args.genai_draft,
                           genai_confidences=args.genai_confidences or (), command=command, progress=say)
    print(render_markdown(report))
    if report["not_identical"]:
        say(f"edge-specdec: warning: output NOT identical to the same engine's target alone: "
             f"{', '.join(report['not_identical'])} (see report.md)")
    return 130 if report["settings"]["interrupted"] else 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The general suite's options, its description and its examples."""
    from . import suites_help

    p.usage = "edge-specdec bench [SUITE] [BUNDLE] [options]"
    p.description = ("suites (`edge-specdec bench SUITE [BUNDLE] ...`; `edge-specdec bench SUITE --help` for each "
                     "one's options; without BUNDLE, the demo pair that ships with edge-specdec; a bundle folder named "
                     "like a suite: ./NAME):\n"
                     + suites_help() + "\n\n"
                     "The general suite: the target alone, each of our algorithms that applies to the bundle (fixed "
                     "and adaptive draft lengths), prompt lookup, OpenVINO GenAI's own pipelines and (--hf) "
                     "transformers on the same prompts, interleaved in one run so that drift in machine speed hits "
                     "all alike. Every suite prints its report and writes report.json, report.md and a chart (needs "
                     "matplotlib: pip install 'edge-specdec[bench]') to --out. Progress goes to stderr, the Markdown "
                     "report to stdout.")
    p.epilog = """\
examples:
  edge-specdec bench bundles/qwen                                  # the default rows, all 7 prompt categories
  edge-specdec bench bundles/qwen --categories code_generation math --max-new-tokens 32 --repeats 1
  edge-specdec bench bundles/qwen --setups ours-none 'ours-standard-*' genai-sd-k3 --ks 2 3 4
  edge-specdec bench bundles/qwen+smollm --hf --out results/smollm   # + transformers UAG
  edge-specdec bench bundles/qwen --genai-ours --concurrent --precision f32
  edge-specdec bench bundles/qwen --prompts my_prompts.jsonl --categories support   # your own workload
  edge-specdec bench bundles/qwen+smollm-aligned --other-draft bundles/qwen+smollm --other-label stock
                                                     # an aligned draft beside the stock one, one run
  edge-specdec bench bundles/qwen+smollm --genai-draft bundles/qwen+qwen0.5b --genai-confidences 0.3 0.5 0.7
                                                     # GenAI's speculative rows drafting with a same-vocabulary
                                                     # draft of the same target, its threshold swept

setups (--setups takes names or shell patterns; the target alone of each engine is always added):
  ours-none                  our Pipeline, the target alone
  ours-ALG-kK                our speculative decoding, K fixed (each of --ks); ALG = standard (same
                             vocabulary), slem and tli (other vocabulary), suffix
  ours-ALG-schedule, ours-ALG-cost   the same with an adaptive draft length (--draft-policy of `run`)
  ours-ALG-conf              the runtime's default: up to 8 tokens, stopping under draft probability 0.7
  ours-ALG-conf-guard        the same with the drafting guard `auto` runs (the target alone while drafting loses)
  ours-concurrent-ALG-...    drafting during verification, from a Pipeline(concurrent=True)  (--concurrent)
  genai-none, genai-sd-kK    OpenVINO GenAI alone / speculative, its default CPU properties  (same vocabulary)
  genai-sd-conf              GenAI speculative with its assistant_confidence_threshold 0.7
  genai-sd-confC             the same with threshold C (--genai-confidences C [C ...] sweeps it)
                             a bundle whose draft has another vocabulary gets the GenAI rows with --genai-draft
  genai-ours-none, genai-ours-sd-kK   the same with our CPU properties (--precision)        (--genai-ours)
  hf-none, hf-assisted, hf-uag        transformers fp32 on the bundle's source folders            (--hf)

several clients at once (the clients suite: `edge-specdec bench clients`, or --clients N [N ...] here):
  edge-specdec bench clients bundles/qwen+smollm --clients 1 2 4 8 --genai-draft bundles/qwen+qwen0.5b \\
      --categories code_generation --max-new-tokens 64 --repeats 2 --out results/clients
  For each N, the same N distinct prompts through:
  ours-none-sequential, ours-spec-sequential   ours, target alone / speculative (auto), the N requests one
                             after another (each served alone: the identity reference and the baseline)
  ours-none, ours-spec       N client threads at once, a session each on one Engine(batching=True)
  genai-cb-none, genai-cb-sd OpenVINO GenAI's ContinuousBatchingPipeline, N requests at once, the target
                             alone / with a same-vocabulary draft: the bundle's own, or --genai-draft's for a
                             bundle whose draft has another vocabulary
  Reports aggregate tokens/s, per-client TTFT and TPOT, identity to the target alone, the ratios (ours-spec
  against one after another, against ours-none and against genai-cb-sd; TPOT against the same request alone)
  in report.md, report.json and clients.png.

prompt categories: code_generation, code_editing, chat, summarization, question_answering, math, translation
(edge_specdec/benchmark/prompts.json), in the target's chat template when it has one. Every row is greedy and
is checked against the target alone of its engine: the output must be identical.

your own prompts (--prompts FILE, for the rows and for --clients): the speedup depends on the workload, so
measure it on yours. FILE is one of
  plain text, one prompt per line (blank lines ignored), all in the category "custom":
      Write a SQL query that lists the ten customers with the largest orders in 2023.
      Summarize this support ticket in two sentences: my router drops Wi-Fi every evening ...
  JSON lines, one object per line: "text", and optionally "category" (default "custom") and "id" (default
  <category>-<n>); use it for prompts that span lines (write "\\n" in the text):
      {"text": "Refactor this function:\\n\\ndef f(x): ...", "category": "code", "id": "refactor-1"}
      {"text": "Summarize this support ticket: ...", "category": "support"}
  a .json file shaped like prompts.json: {"categories": {"support": [{"id": "t1", "text": "..."}]}}
--categories then chooses among the file's categories; the report records the file's path, its sha256 and
how many prompts it holds.
"""
    p.add_argument("--setups", nargs="+", metavar="NAME", help="rows to run: names or patterns such as 'ours-*' "
                   "(default: every row the bundle allows but the optional ones; --hf, --genai-ours and "
                   "--concurrent add theirs either way)")
    p.add_argument("--max-new-tokens", type=int, default=64, metavar="N", help="tokens per run (default 64)")
    p.add_argument("--repeats", type=int, default=2, metavar="N",
                   help="timed runs per prompt and row, after one warm-up (default 2)")
    p.add_argument("--ks", type=int, nargs="+", metavar="K",
                   help="fixed draft lengths (default 3 5); the adaptive rows start at the smallest")
    p.add_argument("--prompts", metavar="FILE",
                   help="your own prompts instead of the shipped set: one per line, or JSON lines "
                        '{"text": ..., "category": ..., "id": ...} (see below)')
    p.add_argument("--other-draft", metavar="BUNDLE",
                   help="a bundle with the same target: each of our rows that drafts with the draft model also "
                        "runs with its draft, as LABEL:ROW, interleaved in the same run")
    p.add_argument("--other-label", default="other", metavar="NAME",
                   help="the name of --other-draft's rows (default other; e.g. stock)")
    p.add_argument("--categories", nargs="+", metavar="CAT",
                   help="prompt categories (default: all; with --prompts, the file's)")
    p.add_argument("--hf", action="store_true",
                   help="add transformers rows (fp32, CPU) from the source folders in the bundle's manifest")
    p.add_argument("--no-genai", action="store_true", help="leave out the OpenVINO GenAI rows")
    p.add_argument("--genai-ours", action="store_true",
                   help="add GenAI rows with our CPU properties (--precision): the loop-against-loop comparison")
    p.add_argument("--concurrent", action="store_true",
                   help="add rows that draft while the target verifies (a second Pipeline, concurrent=True)")
    p.add_argument("--genai-draft", metavar="BUNDLE",
                   help="a bundle of the same target whose draft shares the target's vocabulary: GenAI's "
                        "speculative rows (genai-sd-*, genai-cb-sd with --clients) draft with its draft, so that a "
                        "bundle whose own draft has another vocabulary, which GenAI cannot use, still gets them")
    p.add_argument("--genai-confidences", type=float, nargs="+", metavar="C",
                   help="GenAI's assistant_confidence_threshold values, a genai-sd-confC row each, to find its "
                        "fastest setting (default 0.7: the row genai-sd-conf)")
    p.add_argument("--precision", default="dq", choices=PRECISIONS, help="our CPU precision (default dq)")
    p.add_argument("--kv-rollback", choices=ROLLBACK_METHODS, help="our KV rollback (default: per device)")
    p.add_argument("--draft-vocab", type=int, metavar="N", help=DRAFT_VOCAB_HELP)
    clients = p.add_argument_group("several clients at once (--clients)")
    clients.add_argument("--clients", type=int, nargs="+", metavar="N",
                         help="run the clients benchmark instead of the rows: for each N (e.g. 1 2 4 8), N "
                              "requests at once (ours with a session per client thread on one "
                              "Engine(batching=True), and GenAI's continuous batching) and the same N one after "
                              "another; --setups then takes the clients rows (ours-spec, genai-cb-*, ...); "
                              "default --out bench-results/<bundle name>-clients")
    clients.add_argument("--genai-k", type=int, metavar="K",
                         help=f"GenAI's draft length (num_assistant_tokens) in genai-cb-sd (default: its "
                              f"confidence stop, assistant_confidence_threshold {GENAI_CONFIDENCE}, its fastest "
                              f"setting on the real same-vocabulary pair)")
