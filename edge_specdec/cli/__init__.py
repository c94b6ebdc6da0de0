"""The `edge-specdec` command line: one module per subcommand (export, align, pairs, pair, info, run, chat, bench,
serve, check, docs)."""
from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from .. import __version__
from ..errors import EdgeSpecdecError
from . import align, bench, chat, check, docs, export, info, pair, pairs, run, serve


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="edge-specdec",
        description="Lossless speculative decoding on OpenVINO: a small draft model (of any vocabulary) proposes "
                    "tokens, the target verifies them, and the output is exactly the target's own.",
        epilog="Without a bundle, run, chat, serve, check and info use the demo pair that ships with edge-specdec. "
               "`edge-specdec COMMAND --help` for a command's options; `edge-specdec docs` for the documentation.")
    parser.add_argument("--version", action="version", version=f"edge-specdec {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in (export, align, pairs, pair, bench, info, run, chat, serve, check, docs):
        command.add_parser(sub)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except EdgeSpecdecError as exc:
        print(f"edge-specdec: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nedge-specdec: interrupted; nothing was left half-written.", file=sys.stderr)
        return 130
