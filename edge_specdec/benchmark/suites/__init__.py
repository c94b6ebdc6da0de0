"""The named suites of `edge-specdec bench`: each one a workload users care about, measured side by side.

    edge-specdec bench [BUNDLE] [options]                 the general suite: every algorithm and peer, per category
    edge-specdec bench SUITE [BUNDLE] [options]           a named suite; `edge-specdec bench SUITE --help`

Without BUNDLE a suite runs on the demo pair that ships with edge-specdec. Every suite times its rows interleaved
(interleave.py), checks every output against the target alone's, and writes report.json, report.md and a chart
(report_files.py); the suites built on suite_runs.py share its rows, statistics and report (suite_report.py).

Adding a suite is one new module here and one line in SUITES below. The module, suites/NAME.py, holds:

    SUMMARY = "..."                    # its line in `edge-specdec bench --help`
    def add_arguments(parser): ...     # its options; BUNDLE and --out are there already
    def main(args) -> int: ...         # run it and return the exit code

main gets args.bundle (the demo's folder when none was given), args.out, args.command_line (the command as typed,
for the report) and the suite's own options. It usually builds a suite_runs.Suite (its rows, cells, figures,
headline figure and baseline row), hands it to suite_runs.run_suite and returns suite_runs.finish(report):
conversation.py is an example whose rows keep state from cell to cell, structured.py one of prompts as cells,
and startup.py one whose rows run each in a fresh process (fresh_process.py). Load models and import the peers
(openvino_genai) inside main, not at the top of the module: `edge-specdec bench --help` imports every suite, and
the runtime never imports the benchmark package. A suite's test runs it on the demo with a few tokens
(tests/test_bench_suites.py); the help test finds it in SUITES by itself.
"""
from __future__ import annotations

import argparse
import importlib
from types import ModuleType

# name -> module in this package; the first one is the default suite (`edge-specdec bench BUNDLE`)
SUITES = {
    "general": "general",
    "conversation": "conversation",
    "structured": "structured",
    "startup": "startup",
    "long-prompts": "long_prompts",
    "clients": "clients",
    "workloads": "workloads",
}
DEFAULT_SUITE = next(iter(SUITES))


def load_suite(name: str) -> ModuleType:
    return importlib.import_module(f".{SUITES[name]}", __name__)


def suites_help() -> str:
    """The list of suites, a line each, for `edge-specdec bench --help`."""
    import textwrap

    width = max(map(len, SUITES))
    return "\n".join(textwrap.fill(load_suite(name).SUMMARY, 116, initial_indent=f"  {name:<{width}}  ",
                                    subsequent_indent=" " * (width + 4)) for name in SUITES)


def suite_parser(name: str) -> argparse.ArgumentParser:
    """The parser of one suite: BUNDLE (default the demo pair), --out, and the suite's own options."""
    from ...demo import DEMO_BUNDLE

    default = name == DEFAULT_SUITE
    parser = argparse.ArgumentParser(prog="edge-specdec bench" + ("" if default else f" {name}"),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bundle", metavar="BUNDLE", nargs="?", default=str(DEMO_BUNDLE),
                        help="a bundle folder written by `edge-specdec export` (default: the demo pair that ships "
                             "with edge-specdec)")
    parser.add_argument("--out", metavar="DIR", help="where to write report.json, report.md and the chart (default "
                        f"bench-results/<bundle name>{'' if default else '-' + name})")
    load_suite(name).add_arguments(parser)
    parser.description = _wrapped(parser.description or "")
    return parser


def _wrapped(text: str) -> str:
    """Paragraphs wrapped to 116 columns; indented lines (lists, commands) as they are."""
    import textwrap

    return "\n".join(line if line.startswith(" ") else textwrap.fill(line, 116) for line in text.split("\n"))
