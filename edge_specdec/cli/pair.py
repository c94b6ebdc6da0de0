"""`edge-specdec pair`: which draft fits a target, predicted from simulated rounds (edge_specdec.pairing)."""
from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from .common import add_engine_options, say

SAMPLING_DEFAULTS = (0.8, 1.0, 0)  # --temperature, --top-p, --seed: pairing.Sampling's defaults

PAIR_EXAMPLES = """\
examples:
  edge-specdec pair ./qwen-1.5b ./qwen-0.5b ./smollm2-135m       # two drafts for one target
  edge-specdec pair ./qwen-1.5b ./drafts/                         # every model and .gguf file in drafts/
  edge-specdec pair ./qwen-1.5b ./drafts/ --top 3 --export bundles/best
  edge-specdec pair bundles/qwen ./smollm2.gguf --task chat --json > pair.json
  edge-specdec pair ./qwen-1.5b qwen-coder-1.5b+smollm2-135m     # a catalog pair's draft
  edge-specdec pair ./qwen-1.5b ./smollm2-135m --sampling --temperature 0.7   # for sampled decoding
  edge-specdec pair bundles/qwen ./qwen-0.5b --catalog-entry > entry.json      # the best, as a catalog entry

TARGET and each DRAFT: a Hugging Face folder, a .gguf file, an OpenVINO IR folder, a bundle (its target; as a
DRAFT its draft), a name from `edge-specdec pairs`, or a hub id; a folder that is none of these is scanned for
candidates. "no draft" (the target alone) and "free drafts only" (copies of text the request has seen, no
draft model) are always candidates.

How it decides:
1. the cheap look, nothing converted: each draft's vocabulary from tokenizer.json or the GGUF header (identical
   to the target's, or the share of strings both spell the same and of the target's text the draft spells),
   the algorithm `auto` runs with it (greedy and sampled), its weights, and whether the export admits it (a
   refused one gets one line: the reason and the fix);
2. the best --top drafts by that look are exported beside the target (the target is converted once);
3. the target's greedy answers to the prompts are computed once; each candidate then drafts against them in
   the runtime's own decode loop (its confidence stop, draft length, free drafts first, re-tokenizer), with a
   stand-in target that replays the answers, so its rounds and accepted tokens are those a greedy `run` gets
   (with its drafting decisions taken without the clock, which a stand-in target would bias);
4. each round is priced: the loop's own seconds between target calls (the draft, lookups, re-tokenization)
   plus the target's measured cost of a call of that many tokens, against the target alone priced the same
   way. Candidates within the noise of each other (the spread of their per-prompt ratios, as `run --compare`
   judges it, or the noise of the target's timed calls) are marked "tie".
--sampling predicts sampled decoding instead (auto's sampled algorithm: tli for a draft of another vocabulary,
standard for the same one): the target's answers are sampled once (seeded), and each drafted token's acceptance
is drawn from its exact law given the answer (min(1, q/p) for a token drawn from the draft's q; a match for a
copy or re-tokenized text), with the draft drafting along the answer in the real loop and the real verification.
Limits: rounds are priced one after the other (drafting while the target verifies, on two devices, is not modeled);
the drafting guard is left out (in a real run it falls back to the target alone where drafting loses).
More: edge-specdec docs pairing
"""


def _cmd_pair(args: argparse.Namespace) -> int:
    from ..pairing import PairSettings, find_pair, read_prompts
    from .common import engine_config

    config = engine_config(args)
    sampling = sampling_of(args, "pair")
    settings = PairSettings(top=args.top, task=args.task,
                            prompts=read_prompts(args.prompts) if args.prompts else None,
                            max_new_tokens=args.max_new_tokens, export=Path(args.export) if args.export else None,
                            export_candidate=args.export_candidate, force=args.force, look_only=args.look,
                            sampling=sampling, engine={f: getattr(config, f) for f in config.__dataclass_fields__})
    if args.catalog_entry and args.look:
        raise SystemExit("edge-specdec pair: --catalog-entry writes a simulated prediction, and --look simulates "
                         "nothing: drop one of them.")
    report = find_pair(args.target, args.drafts, settings, say=say)
    if not args.look:
        report["command"] = shlex.join(["edge-specdec", "pair", *sys.argv[2:]]) if sys.argv[1:2] == ["pair"] \
            else "edge-specdec pair " + shlex.join([args.target, *args.drafts])
    if args.catalog_entry:
        from ..pairing import catalog_entry

        print(json.dumps(catalog_entry(report, args.export_candidate), indent=2))
    else:
        print(json.dumps(report, indent=1) if args.json else describe(report))
    return 0


def describe(report: dict) -> str:
    """The report as a table and a verdict, for the terminal."""
    lines = [f"target {report['target']}: {report['prompts']} {report['task']} prompts, "
             f"{report['max_new_tokens']} tokens each, {report['decoding']}", ""]
    width = max([len("candidate")] + [len(row["name"]) for row in report["candidates"]])
    lines.append(f"{'':4} {'candidate':{width}} {'predicted':>10} {'acceptance':>10} {'weights':>9}  "
                 "auto greedy/sampled")
    for row in report["candidates"]:
        p = row.get("prediction")
        place = ("=" if row["tie"] else "") + str(row["place"]) if row["place"] else "-"
        speed = f"{p['speedup']:.2f}x" if p and p["speedup"] else "-"
        acceptance = f"{p['acceptance']:.2f}" if p and p["acceptance"] is not None else "-"
        size = size_text(row["weights_bytes"]) if row["weights_bytes"] else "-"
        algo = f"{row['algorithm'].get('greedy', '-')}/{row['algorithm'].get('sampled', '-')}"
        lines.append(f"{place:4} {row['name']:{width}} {speed:>10} {acceptance:>10} {size:>9}  {algo}")
        if row["relation"] == "heterogeneous" and row["vocabulary"]:
            v = row["vocabulary"]
            lines.append(f"{'':9}another vocabulary: {v['shared_share']:.0%} of the strings spelled the same, "
                         f"{v['text_share']:.0%} of the target's text")
        if row["refused"]:
            lines.append(f"{'':9}not usable: {row['refused']}")
        elif row["why_not_simulated"]:
            lines.append(f"{'':9}not simulated: {row['why_not_simulated']}")
        if row["tie"]:
            lines.append(f"{'':9}tie: within the measured noise of its neighbour")
        if p and p["speedup"] and p["speedup"] < 1 and row["source"]:
            lines.append(f"{'':9}slower than the target alone: `run`'s drafting guard would run the target alone")
    best = report["best"]
    if best is not None:
        lines += ["", f"best: {best}" + (" (tied: see =)" if any(r["tie"] and r["place"] == 1
                                                                for r in report["candidates"]) else "")]
        lines.append(f"sampling: {report['sampled']}")
    if report["look_only"]:
        drafts = ", ".join(report["simulated_drafts"]) or "none (--top 0)"
        lines += ["", f"the cheap look alone (--look): nothing converted or run. Without --look the drafts "
                      f"simulated would be: {drafts}; with no draft and free drafts only beside them."]
    if report.get("exported"):
        lines.append(f"exported: {report['exported']}")
    return "\n".join(lines)


def size_text(n: int) -> str:
    """Bytes in the largest unit that keeps a whole number in front: 812 KiB, 94 MiB, 1.2 GiB."""
    if n >= 2**30:
        return f"{n / 2**30:.1f} GiB"
    return f"{n / 2**20:.0f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


def add_sampling_options(p) -> None:
    """--sampling and its settings (pair's and check's)."""
    p.add_argument("--sampling", action="store_true",
                   help="predict sampled decoding (auto's sampled algorithm) from simulated rounds: the target's "
                        "answers are sampled once, seeded, and the draft's acceptances drawn given them")
    p.add_argument("--temperature", type=float, default=SAMPLING_DEFAULTS[0], metavar="T",
                   help=f"with --sampling: the temperature (default {SAMPLING_DEFAULTS[0]:g})")
    p.add_argument("--top-p", type=float, default=SAMPLING_DEFAULTS[1], metavar="P",
                   help=f"with --sampling: nucleus sampling mass (default {SAMPLING_DEFAULTS[1]:g}, off)")
    p.add_argument("--seed", type=int, default=SAMPLING_DEFAULTS[2], metavar="N",
                   help="with --sampling: the first prompt's answer's seed; the next prompts take the next ones "
                        f"(default {SAMPLING_DEFAULTS[2]})")


def sampling_of(args: argparse.Namespace, command: str):
    """The pairing.Sampling that --sampling asks for (None without it); its settings without it are refused."""
    from ..pairing import Sampling

    if args.sampling:
        return Sampling(args.temperature, args.top_p, args.seed)
    if (args.temperature, args.top_p, args.seed) != SAMPLING_DEFAULTS:
        raise SystemExit(f"edge-specdec {command}: --temperature, --top-p and --seed set the sampled decoding that "
                         "--sampling predicts: add --sampling.")
    return None


def add_parser(sub) -> None:
    """The `pair` subcommand."""
    p = sub.add_parser("pair", help="which draft fits a target: a ranking from simulated rounds",
                       description="Rank drafts for a target by the speedup predicted from simulated rounds: "
                                   "the target's greedy answers computed once, each draft replayed against them "
                                   "in the real decode loop, each round priced with costs measured here.",
                       epilog=PAIR_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target", metavar="TARGET", help="the model whose output you want")
    p.add_argument("drafts", metavar="DRAFT", nargs="*", help="draft candidates, or folders of them")
    p.add_argument("--top", type=int, default=2, metavar="N",
                   help="export and simulate the best N drafts by the cheap look (default 2; 0: only the "
                        "candidates without a draft model)")
    p.add_argument("--task", default="code", choices=("code", "chat", "text"),
                   help="the built-in prompts' kind (default code; chat renders them with the target's template)")
    p.add_argument("--prompts", metavar="FILE",
                   help="your prompts instead: one per line (\\n for a newline inside one), or a JSON list")
    p.add_argument("--max-new-tokens", type=int, default=64, metavar="N", help="tokens per answer (default 64)")
    p.add_argument("--look", action="store_true",
                   help="the cheap look alone: vocabularies, auto's algorithms, weights and admission, nothing "
                        "converted or run (seconds, even for large models)")
    p.add_argument("--export", metavar="OUT", help="write the best candidate's bundle to OUT")
    p.add_argument("--export-candidate", metavar="NAME", help="with --export: this candidate's bundle instead")
    p.add_argument("--force", action="store_true", help="with --export: replace a bundle already at OUT")
    add_sampling_options(p)
    p.add_argument("--json", action="store_true", help="print the report as one JSON object (with what a catalog "
                                                       "entry needs: the machine, the date, the weights, the command)")
    p.add_argument("--catalog-entry", action="store_true",
                   help="print the best simulated draft (or --export-candidate's) as an entry for the pair catalog "
                        "(edge_specdec/data/pairs.json): its prediction, machine, date and this command")
    add_engine_options(p)
    p.set_defaults(func=_cmd_pair)
