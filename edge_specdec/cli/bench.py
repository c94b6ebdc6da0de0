"""`edge-specdec bench [SUITE] [BUNDLE] [options]`: the named benchmark suites (edge_specdec/benchmark/suites)."""
from __future__ import annotations

import argparse
import shlex


def _cmd_bench(args: argparse.Namespace) -> int:
    """The first word names the suite when it is one (else the default suite); that suite's parser reads the rest."""
    from ..benchmark.suites import DEFAULT_SUITE, SUITES, load_suite, suite_parser

    words = list(args.words)
    name = words.pop(0) if words and words[0] in SUITES else DEFAULT_SUITE
    suite_args = suite_parser(name).parse_args(words)
    suite_args.command_line = shlex.join(["edge-specdec", "bench", *args.words])
    return load_suite(name).main(suite_args)


def add_parser(sub) -> None:
    """The `bench` subcommand: its words go to the suite's own parser (`edge-specdec bench --help` lists the
    suites)."""
    from ..benchmark.suites import SUITES

    p = sub.add_parser("bench", add_help=False, prefix_chars="\0",
                       help=f"benchmark a bundle side by side, in a named suite ({', '.join(SUITES)}); "
                            f"`edge-specdec bench --help`")
    p.add_argument("words", nargs=argparse.REMAINDER)
    p.set_defaults(func=_cmd_bench)
