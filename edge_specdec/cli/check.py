"""`edge-specdec check`: exactness, costs and the predicted speedup on this machine's devices (edge_specdec.check)."""
from __future__ import annotations

import argparse
import json

from ..demo import DEMO_BUNDLE
from .common import add_engine_options, engine_config
from .pair import add_sampling_options

CHECK_EXAMPLES = """\
examples:
  edge-specdec check                                   # the demo pair on this machine's devices (AUTO)
  edge-specdec check bundles/qwen --draft-device NPU --target-device CPU
  edge-specdec check bundles/qwen --draft-device GPU --json > check.json   # to report back
  edge-specdec check bundles/qwen --sampling --temperature 0.7             # + the sampled prediction

It proves, on the devices chosen: the target's block invariance (the basis of exactness), and for every
algorithm the bundle serves that greedy runs give the target alone's token ids and logprob bits on a few
prompts. The predicted speedup is measured as `run --compare` measures it: the default run (auto, its
drafting guard, the bundle's default settings, 128 tokens) against the target alone, time per output token
(no ratio when no round drafted; "no measurable difference" within the spread of the prompts' ratios); beside
it, the ideal the measured costs allow (a round of k drafted tokens costs k*d + t(k+1) and yields
(1 - a^(k+1)) / (1 - a) tokens, d being what a drafted token cost in the decode loop), and the draft length that
reaches it; and the prediction `edge-specdec pair` makes, from simulated rounds (the target's greedy answers
replayed to the default algorithm in the real decode loop, each round priced with the target's measured call
costs; `edge-specdec docs pairing`). With --sampling (or a bundle whose defaults sample) the same simulation
predicts sampled decoding too (auto's sampled algorithm: the target's answers sampled once, seeded, the draft's
acceptances drawn given them).
Exit status: 0 when everything is exact, 1 when a check fails or a device is absent.
"""


def report_line(line: str) -> None:
    """check's report goes to stdout, as it goes (it is the command's output, to keep or to send back)."""
    print(line, flush=True)


def _cmd_check(args: argparse.Namespace) -> int:
    from ..check import run_check
    from .pair import sampling_of

    report = run_check(args.bundle or str(DEMO_BUNDLE), engine_config(args), max_new_tokens=args.max_new_tokens,
                       sampling=sampling_of(args, "check"), say=(lambda _: None) if args.json else report_line)
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        report_line("check: " + ("passed: exact on these devices" if report["ok"] else
                                 "FAILED: the output is not exactly the target's on these devices (see above)"))
    return 0 if report["ok"] else 1


def add_parser(sub) -> None:
    """The `check` subcommand."""
    p = sub.add_parser("check", help="prove exactness and measure the costs on this machine's devices",
                       description="Check a bundle on the hardware at hand: exactness (block invariance, token ids "
                                   "and logprobs of every algorithm against the target alone), the draft's and "
                                   "the target's costs, the predicted speedup and draft length.",
                       epilog=CHECK_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bundle", metavar="BUNDLE", nargs="?", help=f"a bundle folder (default: the demo, {DEMO_BUNDLE})")
    add_engine_options(p)
    p.add_argument("--max-new-tokens", type=int, default=64, metavar="N",
                   help="tokens per exactness run (64: runs long enough to time the decode loop)")
    add_sampling_options(p)
    p.add_argument("--json", action="store_true", help="print the whole report as one JSON object")
    p.set_defaults(func=_cmd_check)
