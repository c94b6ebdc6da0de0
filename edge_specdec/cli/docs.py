"""`edge-specdec docs [TOPIC]`: the project's documentation (docs/*.md), printed from the installed package.

A wheel carries the pages in edge_specdec/data/docs, copied there from docs/ when the wheel is built (setup.py's
build step); a source checkout or an editable install reads docs/ itself. git holds one copy, in docs/.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Optional

from ..errors import EdgeSpecdecError

PACKAGE = Path(__file__).resolve().parent.parent
PACKAGED_DOCS = PACKAGE / "data" / "docs"  # written by setup.py's build step, in a wheel only
SOURCE_DOCS = PACKAGE.parent / "docs"  # a checkout, or an editable install of one
# Where the pages are online, for the wheel's metadata too (pyproject.toml's [project.urls] says the same).
DOCS_URL = "https://github.com/edge-specdec/edge-specdec/tree/main/docs"


def docs_folder() -> Optional[Path]:
    """The folder the pages are read from: the packaged copy, else the checkout's docs/ (None: neither)."""
    for folder in (PACKAGED_DOCS, SOURCE_DOCS):
        if folder.is_dir() and any(folder.glob("*.md")):
            return folder
    return None


def topics() -> dict[str, Path]:
    """Topic name (the page's file name without .md) -> the page."""
    folder = docs_folder()
    return {} if folder is None else {page.stem: page for page in sorted(folder.glob("*.md"))}


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
                            "NAME`);", f"online: {DOCS_URL}"])


def _cmd_docs(args: argparse.Namespace) -> int:
    pages = topics()
    if not pages:
        raise EdgeSpecdecError(f"this installation has no documentation pages; they are online at {DOCS_URL}")
    if args.topic is None:
        print("topics:\n" + listing())
        return 0
    name = args.topic.removesuffix(".md").lower()
    if name not in pages:
        raise EdgeSpecdecError(f"no topic {args.topic!r}; the topics are: {', '.join(pages)}.")
    print(pages[name].read_text(encoding="utf-8"), end="")
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
