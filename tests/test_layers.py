"""The runtime's layers (docs/architecture.md) as import contracts: `lint-imports` checks pyproject.toml's
[tool.importlinter] contracts on the package and finds them kept, and finds each broken on a copy of the package
with one import added that the layers refuse."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"  # import-linter, from the test extra


def lint_imports(root: Path, *contracts: str) -> tuple[int, str]:
    """Run lint-imports with root's pyproject.toml on root's own edge_specdec (not an installed copy): its exit code
    and its output on one line (it wraps long lines)."""
    assert LINT_IMPORTS.exists(), f"{LINT_IMPORTS} is missing: pip install -e '.[test]' installs import-linter"
    options = [f"--contract={c}" for c in contracts]
    run = subprocess.run([str(LINT_IMPORTS), "--no-cache", "--no-logo", *options], cwd=root, capture_output=True,
                         text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(root)})
    return run.returncode, " ".join((run.stdout + run.stderr).split())


def test_the_package_keeps_its_import_contracts():
    code, output = lint_imports(ROOT)
    assert code == 0 and "0 broken" in output, output


# file of the package -> a line added to it, the contract that must then break, what its report must name
BREAKS = {
    "upward import": ("runtime/constraint.py", "from .chat import ChatTemplate", "runtime-layers",
                      "edge_specdec.runtime.constraint -> edge_specdec.runtime.chat"),
    "upward import under TYPE_CHECKING": ("runtime/sampling.py",
                                          "import typing\nif typing.TYPE_CHECKING:\n    from .generate import Result",
                                          "runtime-layers", "edge_specdec.runtime.sampling -> "
                                                            "edge_specdec.runtime.generate"),
    "engine imported by a part of it": ("runtime/conversation.py", "from .pipeline import Engine", "runtime-layers",
                                        "edge_specdec.runtime.conversation -> edge_specdec.runtime.pipeline"),
    "cycle within a layer": ("runtime/drafters.py", "from .suffix import DraftPool", "runtime-acyclic",
                             "No cycles are allowed in edge_specdec.runtime"),
    "module in no layer": ("runtime/helpers.py", "import math", "runtime-layers", "edge_specdec.runtime.helpers"),
    "runtime imports the server": ("runtime/text.py", "from ..serve import protocol", "runtime-alone",
                                   "edge_specdec.runtime.text -> edge_specdec.serve.protocol"),
    "runtime imports torch": ("runtime/session.py", "import torch", "runtime-alone",
                              "edge_specdec.runtime.session -> torch"),
    "bundle imports the runtime": ("bundle.py", "from .runtime import Engine", "package-base",
                                   "edge_specdec.bundle -> edge_specdec.runtime"),
}


@pytest.mark.parametrize("case", BREAKS)
def test_an_import_the_layers_refuse_breaks_its_contract(tmp_path, case):
    path, line, contract, named = BREAKS[case]
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    shutil.copytree(ROOT / "edge_specdec", tmp_path / "edge_specdec", ignore=python_sources_only)
    module = tmp_path / "edge_specdec" / path
    module.write_text((module.read_text() if module.exists() else "") + f"\n{line}\n")
    code, output = lint_imports(tmp_path, contract)
    assert code == 1 and "1 broken" in output and named in output, output


def python_sources_only(folder: str, names: list[str]) -> list[str]:
    """shutil.copytree's ignore: all but folders and .py files (the package's data and pages stay behind)."""
    return [n for n in names if not n.endswith(".py") and not (Path(folder) / n).is_dir()
            or n == "__pycache__"]
