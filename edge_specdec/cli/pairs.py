"""`edge-specdec pairs`: the catalog of known-good pairs."""
from __future__ import annotations

import argparse
import json


def _cmd_pairs(args: argparse.Namespace) -> int:
    from ..catalog import describe_pairs, load_catalog

    pairs = load_catalog()
    print(json.dumps(pairs, indent=2) if args.json else describe_pairs(pairs))
    return 0


def add_parser(sub) -> None:
    """The `pairs` subcommand."""
    p = sub.add_parser("pairs", help="list known-good (target, draft) pairs for export --pair",
                       description="The catalog of known-good pairs (edge_specdec/data/pairs.json): sources, "
                                   "recommended weight formats and devices, and what we measured.",
                       epilog="example:\n  edge-specdec pairs\n  edge-specdec export --pair qwen-coder-1.5b+smollm2-135m"
                              "\n\nTo rank your own candidate drafts for a target: edge-specdec pair --help",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="print the catalog as JSON")
    p.set_defaults(func=_cmd_pairs)
