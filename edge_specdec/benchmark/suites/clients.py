"""The clients suite, `edge-specdec bench clients [BUNDLE] --clients 1 2 4 8`: N requests at once, ours on one
batching engine against the same requests one after another and GenAI's continuous batching (concurrency.py,
client_*.py). `edge-specdec bench BUNDLE --clients ...` runs it too."""
from __future__ import annotations

import argparse

from ...cli.common import DRAFT_VOCAB_HELP, say
from ...runtime.devices import PRECISIONS
from ...runtime.session import ROLLBACK_METHODS
from ..concurrency import GENAI_CONFIDENCE

SUMMARY = ("several clients at once: ours batching on one engine, one after another, and GenAI's continuous "
           "batching; aggregate tokens/s, TTFT and TPOT per number of clients")


def main(args: argparse.Namespace) -> int:
    from ..client_report import render_clients_markdown
    from ..concurrency import run_clients_benchmark
    from .general import engine_config, spelled_command

    spelled = ["edge-specdec", "bench", "clients", args.bundle, "--clients", *map(str, args.clients),
               "--max-new-tokens", str(args.max_new_tokens), "--repeats", str(args.repeats), "--precision",
               args.precision]
    for flag, value in (("--setups", args.setups), ("--categories", args.categories)):
        spelled += [flag, *value] if value else []
    for flag, value in (("--prompts", args.prompts), ("--genai-draft", args.genai_draft), ("--genai-k", args.genai_k),
                        ("--out", args.out), ("--kv-rollback", args.kv_rollback), ("--draft-vocab", args.draft_vocab)):
        spelled += [flag, str(value)] if value is not None else []
    spelled += ["--no-genai"] if args.no_genai else []
    report = run_clients_benchmark(args.bundle, clients=args.clients, setups=args.setups,
                                   max_new_tokens=args.max_new_tokens, repeats=args.repeats,
                                   categories=args.categories, out=args.out, genai=not args.no_genai,
                                   genai_draft=args.genai_draft, genai_k=args.genai_k,
                                   engine_config=engine_config(args), prompts_file=args.prompts,
                                   command=spelled_command(args, spelled), progress=say)
    print(render_clients_markdown(report))
    if report["not_identical"]:
        say(f"edge-specdec: warning: output NOT identical to the target alone: {', '.join(report['not_identical'])} "
            f"(see report.md)")
    return 130 if report["settings"]["interrupted"] else 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = __doc__.split("\n\n")[0] + (
        " For each N, the same N distinct prompts through: ours-none-sequential and ours-spec-sequential (ours, "
        "the target alone / speculative, the N requests one after another), ours-none and ours-spec (N client "
        "threads at once, a session each on one Engine(batching=True)), genai-cb-none and genai-cb-sd (OpenVINO "
        "GenAI's ContinuousBatchingPipeline, the target alone / with a same-vocabulary draft). Writes report.json, "
        "report.md and clients.png.")
    p.epilog = ("example:\n  edge-specdec bench clients bundles/qwen+smollm --clients 1 2 4 8 --genai-draft "
                "bundles/qwen+qwen0.5b \\\n      --categories code_generation --max-new-tokens 64 --repeats 2")
    p.add_argument("--clients", type=int, nargs="+", default=[1, 2, 4, 8], metavar="N",
                   help="numbers of clients at once (default 1 2 4 8)")
    p.add_argument("--setups", nargs="+", metavar="NAME", help="rows to run: names or patterns such as 'ours-*' "
                   "(default: all; the references are always added)")
    p.add_argument("--max-new-tokens", type=int, default=64, metavar="N", help="tokens per request (default 64)")
    p.add_argument("--repeats", type=int, default=2, metavar="N",
                   help="timed rounds per number of clients and row, after one warm-up (default 2)")
    p.add_argument("--categories", nargs="+", metavar="CAT",
                   help="prompt categories (default: all; with --prompts, the file's)")
    p.add_argument("--prompts", metavar="FILE", help="your own prompts instead of the shipped set (see "
                   "`edge-specdec bench --help`)")
    p.add_argument("--no-genai", action="store_true", help="leave out the OpenVINO GenAI rows")
    p.add_argument("--genai-draft", metavar="BUNDLE",
                   help="a bundle of the same target whose draft shares the target's vocabulary: genai-cb-sd "
                        "drafts with it (for a bundle whose own draft has another vocabulary)")
    p.add_argument("--genai-k", type=int, metavar="K",
                   help=f"GenAI's draft length (num_assistant_tokens) in genai-cb-sd (default: its confidence stop, "
                        f"assistant_confidence_threshold {GENAI_CONFIDENCE})")
    p.add_argument("--precision", default="dq", choices=PRECISIONS, help="our CPU precision (default dq)")
    p.add_argument("--kv-rollback", choices=ROLLBACK_METHODS, help="our KV rollback (default: per device)")
    p.add_argument("--draft-vocab", type=int, metavar="N", help=DRAFT_VOCAB_HELP)
