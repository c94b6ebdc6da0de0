"""The build step pyproject.toml cannot declare: the documentation (docs/*.md, kept once in git, in docs/) is
copied into the wheel as package data, edge_specdec/data/docs, where `edge-specdec docs TOPIC` reads it from an
installed wheel. Everything else about the package is in pyproject.toml."""
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

DOCS = Path(__file__).resolve().parent / "docs"


class BuildPyWithDocs(build_py):
    """build_py, then docs/*.md into the built package's data/docs (an sdist carries docs/ through MANIFEST.in)."""

    def run(self):
        super().run()
        if self.editable_mode:  # an editable install reads docs/ from the checkout itself
            return
        pages = sorted(DOCS.glob("*.md"))
        if not pages:
            raise FileNotFoundError(f"no documentation pages in {DOCS}: the wheel would ship without its docs")
        target = Path(self.build_lib) / "edge_specdec" / "data" / "docs"
        target.mkdir(parents=True, exist_ok=True)
        for page in pages:
            shutil.copyfile(page, target / page.name)


setup(cmdclass={"build_py": BuildPyWithDocs})
