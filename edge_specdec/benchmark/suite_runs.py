"""What a named suite of `edge-specdec bench` is made of: its rows, what one run of a row measures, the figures its
table shows, and the interleaved loop that times them (interleave.py, the loop of every benchmark here).

A suite builds its rows (SuiteRow: a name, a description, a run function and the row whose output it must
equal), its cells (what a run runs on: a prompt, a turn of a conversation, a prompt length) and its figures
(Figure: a key of Measured.figures, its column title and format), then hands them to run_suite, which runs them
interleaved, checks every output against its reference row, and writes report.json, report.md and a chart
(suite_report.py).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from .interleave import run_interleaved
from .machine import machine_info, note_load_at_end


@dataclass(frozen=True)
class Figure:
    """A column of a suite's table: the median of Measured.figures[key] over a row's timed runs (total: their
    sum, for counts such as valid answers)."""
    key: str
    title: str
    spec: str = ".2f"
    lower_is_better: bool = False
    total: bool = False


@dataclass
class Measured:
    """One run of a row: its figures (None where a run has no such figure) and its output (token ids or text),
    which is compared with the reference row's output of the same cell and repeat."""
    figures: dict[str, Optional[float]]
    output: Any = None


@dataclass(frozen=True)
class Cell:
    """What one run of every row runs on; key names it in the report."""
    key: str
    value: Any = None


@dataclass
class SuiteRow:
    """A row of a suite. run(cell, repeat) runs once (repeat -1: the uncounted warm-up) and returns Measured.
    reference: the row whose output this row's must equal, cell by cell (None: not compared, such as a peer
    whose text is laid out its own way)."""
    name: str
    description: str
    run: Callable[[Cell, int], Measured]
    reference: Optional[str] = None
    measured: dict = field(default_factory=dict)  # (cell key, repeat) -> Measured
    failures: list = field(default_factory=list)  # {"cell", "repeat", "error"}


@dataclass
class Suite:
    """Everything run_suite needs to time a suite and report it.
    headline: the figure the chart shows and each row's ratio to the baseline row is taken on."""
    name: str
    bundle: Any  # the loaded Bundle
    rows: list[SuiteRow]
    cells: list[Cell]
    figures: list[Figure]
    headline: str
    baseline: Optional[str]
    settings: dict[str, Any]
    method: str  # report.md's paragraph on how the suite measures
    repeats: int = 1
    warm_ups: Sequence[Cell] = ()
    skipped: list = field(default_factory=list)  # {"setup", "reason"}
    notes: list = field(default_factory=list)
    # more of report.md, made from the built report (a suite's own table), placed after the per-cell table
    extra_markdown: Optional[Callable[[dict], str]] = None
    # figures besides the headline whose median per cell each row keeps in the report (per_cell_figures)
    cell_figures: Sequence[str] = ()
    progress_figures: int = 3  # how many of `figures`, the first ones, each run's progress line shows


def stderr_say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _progress(suite: Suite) -> Callable[[Measured], str]:
    shown = suite.figures[:suite.progress_figures]

    def show(m: Measured) -> str:
        return "  ".join(f"{f.key} {m.figures[f.key]:{f.spec}}" for f in shown if m.figures.get(f.key) is not None)
    return show


def time_suite(suite: Suite, say: Callable[[str], None]) -> bool:
    """Every row on every cell, interleaved (interleave.py); False if interrupted (what ran is kept)."""
    def keep(row: SuiteRow, c: Cell, repeat: int, m: Measured) -> None:
        row.measured[(c.key, repeat)] = m

    def fail(row: SuiteRow, c: Cell, repeat: int, error: str) -> None:
        row.failures.append({"cell": c.key, "repeat": repeat, "error": error})
    width = max(len(c.key) for c in suite.cells)
    return run_interleaved(suite.rows, suite.cells, suite.repeats, say, name=lambda r: r.name,
                           label=lambda c: f"{c.key:<{width}} ", run=lambda r, c, rep: r.run(c, rep),
                           show=_progress(suite), keep=keep, fail=fail, warm_ups=list(suite.warm_ups))


def run_suite(suite: Suite, out: Optional[Path], command: Optional[str], say: Callable[[str], None] = stderr_say,
              plot: bool = True) -> dict[str, Any]:
    """Time the suite, then write report.json, report.md and SUITE.png (with matplotlib) into out (default
    bench-results/<bundle name>-<suite>). Returns the report with "files"."""
    from .suite_report import build_suite_report, write_suite_report

    if not suite.rows:
        raise_nothing_to_run(suite)
    say(f"bench {suite.name} on {suite.bundle.path}: {', '.join(r.name for r in suite.rows)}; "
        f"{len(suite.cells)} cells, {suite.repeats} repeat(s)")
    machine = machine_info()
    complete = time_suite(suite, say)
    note_load_at_end(machine)
    report = build_suite_report(suite, machine, command, interrupted=not complete)
    if suite.extra_markdown is not None:
        report["extra_markdown"] = suite.extra_markdown(report)
    out_dir = out if out is not None else default_out(suite.bundle, suite.name)
    report["files"] = write_suite_report(report, out_dir, plot=plot, say=say)
    return report


def default_out(bundle, suite_name: str) -> Path:
    return Path("bench-results") / f"{bundle.path.name}-{suite_name}"


def check_out(out: Optional[Path]) -> None:
    """Refuse an --out that is a file before anything runs."""
    from ..errors import EdgeSpecdecError

    if out is not None and out.exists() and not out.is_dir():
        raise EdgeSpecdecError(f"--out {out} is a file: give a folder for the report.")


def raise_nothing_to_run(suite: Suite) -> None:
    from ..errors import EdgeSpecdecError

    raise EdgeSpecdecError("nothing to run: every row chosen was skipped ("
                           + "; ".join(f"{x['setup']}: {x['reason']}" for x in suite.skipped) + ").")


def finish(report: dict[str, Any], say: Callable[[str], None] = stderr_say) -> int:
    """Print report.md, warn of any output that differs from its reference; the exit code (130: interrupted)."""
    from .suite_report import render_suite_markdown

    print(render_suite_markdown(report))
    if report["not_identical"]:
        say(f"edge-specdec: warning: output NOT identical to its reference row: {', '.join(report['not_identical'])} "
            f"(see report.md)")
    return 130 if report["settings"]["interrupted"] else 0


def genai_or_reason() -> tuple[Any, Optional[str]]:
    """openvino_genai, or None and why it is not there (its rows are then skipped with that reason)."""
    try:
        import openvino_genai
    except ImportError as exc:
        return None, f"openvino_genai is not importable ({exc}); pip install 'edge-specdec[bench]'"
    return openvino_genai, None
