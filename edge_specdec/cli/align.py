"""`edge-specdec align`: fine-tune a bundle's draft on its target's text, into a new bundle (the export stage)."""
from __future__ import annotations

import argparse

from .common import say

ALIGN_EXAMPLES = """\
examples:
  # an hour on this machine: the target writes training text, the draft learns it, a new bundle is written
  edge-specdec align bundles/qwen-smol --out bundles/qwen-smol-aligned --minutes 60

  # your own prompts (one per line, or JSON lines {"text": ..., "category": ...}), at most 50,000 tokens of text
  edge-specdec align bundles/qwen-smol --out bundles/qwen-smol-aligned --prompts my_prompts.jsonl --tokens 50000

  # stop after generating the text, continue later (or after Ctrl-C) where it stopped
  edge-specdec align bundles/qwen-smol --out bundles/qwen-smol-aligned --stop-after generate
  edge-specdec align bundles/qwen-smol --out bundles/qwen-smol-aligned --resume

How it works (more: edge-specdec docs align):
  1. baseline  acceptance and tokens per target pass of the bundle as it is, on the benchmark's prompts
               (held out: align never trains on them)
  2. plan      measures how fast the draft trains here, keeps time back for the last stages
  3. generate  the bundle's target writes greedy answers to the training prompts (the package's set of about
               500 prompts in seven categories, or --prompts), in its chat template, several at once
  4. train     the draft, from its original Hugging Face weights (--draft-source, else the path the bundle's
               manifest records), learns that text in its own tokens as the runtime shows it to the draft;
               a tenth of the prompts held out for early stopping
  5. export    the trained draft in the bundle's draft weight format
  6. evaluate  the new bundle, measured as in step 1
  7. write     the new bundle to --out: the target's files hard-linked from BUNDLE, not copied; its manifest
               records the data, the training and the figures before and after
--minutes is the budget of all of it, resumes included: generation stops once the time left only covers
one pass of training over what it has, and training stops at its deadline. Progress goes to stderr. The work (text,
checkpoints) lives in a hidden folder beside --out (or --work) until the bundle is written; --out never
holds half a bundle. Needs the export extra: pip install 'edge-specdec[export]'.
"""


def _cmd_align(args: argparse.Namespace) -> int:
    from ..export.align import AlignSettings, TrainSettings, align_bundle

    train = TrainSettings(epochs=args.epochs, train_layers=args.train_layers, learning_rate=args.learning_rate,
                          batch_tokens=args.batch_tokens, precision=args.train_precision,
                          soft_weight=args.soft_weight)
    settings = AlignSettings(prompts=args.prompts, tokens=args.tokens, minutes=args.minutes,
                             max_new_tokens=args.max_new_tokens, streams=args.streams,
                             eval_prompts=args.eval_prompts, eval_tokens=args.eval_tokens, train=train)
    try:
        written = align_bundle(args.bundle, args.out, settings, draft_source=args.draft_source, work=args.work,
                               resume=args.resume, force=args.force, keep_work=args.keep_work,
                               stop_after=args.stop_after, progress=None if args.quiet else say)
    except KeyboardInterrupt:
        say("align: stopped; the work so far is kept: run the same command with --resume to continue.")
        raise
    if written is not None:
        print(written)
    return 0


def add_parser(sub) -> None:
    """The `align` subcommand."""
    p = sub.add_parser("align", help="fine-tune a bundle's draft on its target's text, into a new bundle",
                       description="Make a bundle's draft guess its target better: the target writes answers to "
                                   "a set of prompts, the draft is fine-tuned on that text (sequence-level "
                                   "distillation), exported again in the bundle's weight format, and written "
                                   "with the same target into a new bundle. The output stays exactly the "
                                   "target's; only the speed changes.",
                       epilog=ALIGN_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bundle", metavar="BUNDLE", help="the bundle whose draft to align (it is not changed)")
    p.add_argument("--out", metavar="DIR", required=True, help="the aligned bundle to write")
    p.add_argument("--prompts", metavar="FILE",
                   help="training prompts: one per line, JSON lines {\"text\", \"category\", \"id\"}, or the "
                        "shape of the benchmark's prompts.json (default: the package's align set)")
    p.add_argument("--tokens", type=int, metavar="N", help="at most N target tokens of training text "
                   "(default: as many as --minutes allows)")
    p.add_argument("--minutes", type=float, default=60.0, metavar="M",
                   help="time budget of the whole align, resumes included (default 60)")
    p.add_argument("--resume", action="store_true", help="continue an align that stopped, at the stage it reached")
    p.add_argument("--work", metavar="DIR", help="the work folder (default: .OUT.align-work beside --out)")
    p.add_argument("--draft-source", metavar="PATH",
                   help="the draft's original Hugging Face folder (default: the source the bundle's manifest "
                        "records)")
    p.add_argument("--force", action="store_true", help="replace an existing bundle at --out")
    p.add_argument("--keep-work", action="store_true", help="keep the work folder after the bundle is written")
    p.add_argument("--stop-after", metavar="STAGE",
                   help="stop after this stage (baseline, plan, generate, train, export, evaluate); --resume "
                        "continues")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    g = p.add_argument_group("generation")
    g.add_argument("--max-new-tokens", type=int, default=256, metavar="N",
                   help="target tokens per answer (default 256)")
    g.add_argument("--streams", type=int, default=16, metavar="N",
                   help="answers generated at once, their steps batched into one target call (default 16)")
    t = p.add_argument_group("training")
    t.add_argument("--epochs", type=float, default=3.0, metavar="E",
                   help="the most passes over the text (default 3): generation keeps time for one pass, and "
                        "training goes on until the budget's deadline, E passes or early stopping")
    t.add_argument("--train-layers", type=int, metavar="N",
                   help="train only the top N decoder layers and the final norm (default: the whole model, "
                        "which learned more per minute on the real pair)")
    t.add_argument("--learning-rate", type=float, default=1e-4, metavar="LR", help="peak learning rate (1e-4)")
    t.add_argument("--soft-weight", type=float, default=0.0, metavar="W",
                   help="where the draft's token is the target's own (same start, same bytes), train on (1 - W) of "
                        "that token and W of the target's distribution over its most likely tokens the draft's "
                        "vocabulary shares (0: the tokens only). Generation records that distribution only when W "
                        "> 0, so give it from the start")
    t.add_argument("--batch-tokens", type=int, default=2048, metavar="N", help="tokens per optimizer step (2048)")
    t.add_argument("--train-precision", choices=("fp32", "bf16"),
                   help="training arithmetic: fp32, or bf16 autocast (float32 weights); default: the faster here, "
                        "measured (bf16 where the CPU computes bfloat16 natively)")
    e = p.add_argument_group("evaluation (before and after)")
    e.add_argument("--eval-prompts", type=int, metavar="N",
                   help="held-out prompts to measure (default: all of the benchmark's)")
    e.add_argument("--eval-tokens", type=int, default=128, metavar="N", help="tokens per held-out prompt (128)")
    p.set_defaults(func=_cmd_align)
