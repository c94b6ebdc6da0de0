"""The `edge-specdec` command line: one module per subcommand (export, align, pairs, info, run, bench, serve, check)."""
from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from .. import __version__
from ..errors import EdgeSpecdecError
from . import align, bench, check, export, info, pairs, run, serve


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="edge-specdec",
        description="Lossless speculative decoding on OpenVINO: a small draft model (of any vocabulary) proposes "
                    "tokens, the target verifies them, and the output is exactly the target's own.")
    parser.add_argument("--version", action="version", version=f"edge-specdec {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in (export, align, pairs, bench, info, run, serve, check):
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
