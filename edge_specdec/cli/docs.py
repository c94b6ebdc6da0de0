"""`edge-specdec docs [TOPIC]`: the project's documentation, printed from the installed package.

The pages are docs/*.md and the pages kept elsewhere in the source tree that PAGES_OUTSIDE_DOCS names (the
measurements, the demo pair). A wheel carries them all in edge_specdec/data/docs, copied there when the wheel is
built (setup.py's build step); a source checkout or an editable install reads them where they are. git holds one
copy of each.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from ..errors import EdgeSpecdecError

PACKAGE = Path(__file__).resolve().parent.parent
PACKAGED_DOCS = PACKAGE / "data" / "docs"  # written by setup.py's build step, in a wheel only
CHECKOUT = PACKAGE.parent  # a source checkout, or an editable install of one
SOURCE_DOCS = CHECKOUT / "docs"
# topic -> a page outside docs/, relative to the checkout; a wheel carries it as data/docs/TOPIC.md. setup.py reads
# this literal, so the build and this command name the same pages.
PAGES_OUTSIDE_DOCS = {"RESULTS": "benchmarks/RESULTS.md", "demo": "models/demo/README.md"}


def topics() -> dict[str, Path]:
    """Topic name (the page's file name without .md) -> the page: the packaged copies, else the checkout's pages
    (empty: neither)."""
    if PACKAGED_DOCS.is_dir() and any(PACKAGED_DOCS.glob("*.md")):
        return {page.stem: page for page in sorted(PACKAGED_DOCS.glob("*.md"))}
    pages = {page.stem: page for page in sorted(SOURCE_DOCS.glob("*.md"))} if SOURCE_DOCS.is_dir() else {}
    return {**pages, **{topic: CHECKOUT / rel for topic, rel in PAGES_OUTSIDE_DOCS.items()
                        if pages and (CHECKOUT / rel).is_file()}}


def title(page: Path) -> str:
    """A page's first heading, without the '# '."""
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    return page.stem


def listing() -> str:
    pages = topics()
    width = max(map(len, pages), default=0)
    return "\n".join([f"  {name:<{width}}  {title(page)}" for name, page in pages.items()]
                     + ["", "edge-specdec docs TOPIC prints one (a page's links to NAME.md are `edge-specdec docs "
                            "NAME`); the documentation ships with the package."])


def _cmd_docs(args: argparse.Namespace) -> int:
    pages = topics()
    if not pages:
        raise EdgeSpecdecError("this installation has no documentation pages: install edge-specdec from its wheel, "
                               "or from a source checkout (pip install -e .), whose pages `edge-specdec docs` reads.")
    if args.topic is None:
        print("topics:\n" + listing())
        return 0
    by_name = {name.lower(): page for name, page in pages.items()}  # `docs results` finds RESULTS
    page = by_name.get(args.topic.removesuffix(".md").lower())
    if page is None:
        raise EdgeSpecdecError(f"no topic {args.topic!r}; the topics are: {', '.join(pages)}.")
    print(page.read_text(encoding="utf-8"), end="")
    return 0


def add_parser(sub) -> None:
    """The `docs` subcommand."""
    p = sub.add_parser("docs", help="print the documentation (usage, serving, export, align, ...)",
                       description="Print a page of edge-specdec's documentation, as installed with the package "
                                   "(Markdown). Without a topic, list the topics.",
                       epilog="examples:\n  edge-specdec docs\n  edge-specdec docs serving | less\n"
                              "  edge-specdec docs usage > usage.md",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("topic", metavar="TOPIC", nargs="?", help="a page: usage, serving, export, align, ...")
    p.set_defaults(func=_cmd_docs)
