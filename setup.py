"""The build step pyproject.toml cannot declare: the documentation pages (docs/*.md, and the pages outside docs/
that edge_specdec/cli/docs.py's PAGES_OUTSIDE_DOCS names, each kept once in git) are copied into the wheel as
package data, edge_specdec/data/docs, where `edge-specdec docs TOPIC` reads them from an installed wheel.
Everything else about the package is in pyproject.toml."""
import ast
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
DOCS = ROOT / "docs"


def pages_outside_docs() -> dict:
    """docs.py's PAGES_OUTSIDE_DOCS (topic -> path in the source tree), read without importing the package."""
    tree = ast.parse((ROOT / "edge_specdec" / "cli" / "docs.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "PAGES_OUTSIDE_DOCS":
            return ast.literal_eval(node.value)
    raise LookupError("edge_specdec/cli/docs.py defines no PAGES_OUTSIDE_DOCS")


class BuildPyWithDocs(build_py):
    """build_py, then the pages into the built package's data/docs (an sdist carries them through MANIFEST.in)."""

    def run(self):
        super().run()
        if self.editable_mode:  # an editable install reads the pages from the checkout itself
            return
        pages = {page.name: page for page in sorted(DOCS.glob("*.md"))}
        if not pages:
            raise FileNotFoundError(f"no documentation pages in {DOCS}: the wheel would ship without its docs")
        for topic, rel in pages_outside_docs().items():
            if not (ROOT / rel).is_file():
                raise FileNotFoundError(f"{rel} is missing: the wheel would ship without `edge-specdec docs {topic}`")
            pages[f"{topic}.md"] = ROOT / rel
        target = Path(self.build_lib) / "edge_specdec" / "data" / "docs"
        target.mkdir(parents=True, exist_ok=True)
        for name, page in pages.items():
            shutil.copyfile(page, target / name)


setup(cmdclass={"build_py": BuildPyWithDocs})
