"""A named suite's report: its figures per row and per cell (report.json), report.md and SUITE.png, the headline
figure of every row; written the same way for every suite (report_files.py)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional

from .machine import machine_section
from .markdown import cell, problems_section, row_problems, table
from .report_files import pyplot, save_chart, write_report_files
from .stats import first_difference, median, rounded, spread, worst_median
from .suite_runs import Suite, SuiteRow

DEFINITIONS = """\
- every figure is the median over the row's timed runs (every cell and repeat), a count ("total") their sum; a
  run without such a figure does not count.
- vs BASELINE: the median, over (cell, repeat), of the row's headline figure / the baseline row's on the same cell
  in the same repeat (the two ran back to back).
- weakest cell: the cell whose ratios to the baseline (one per repeat) have the worst median, and that median: the
  row's floor. One slow run on a busy machine moves a median of two, so judge a floor with --repeats 3 or more.
- identical: the row's output (token ids) equals that of its reference row on the same cell and repeat; under
  greedy decoding a lossless decoder never changes it.
- each row had one uncounted warm-up run first; then, for each repeat and cell, every row ran back to back, the
  order rotated from one cell to the next, so that drift in machine speed hits all rows alike.
"""


def _identity(row: SuiteRow, rows: dict[str, SuiteRow]) -> tuple[Optional[bool], list[dict], int]:
    """(identical, mismatches, runs compared) of a row against its reference row, run by run."""
    reference = rows.get(row.reference) if row.reference else None
    if reference is None or reference is row:
        return None, [], 0
    mismatches, compared = [], 0
    for (key, repeat), m in sorted(row.measured.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        ref = reference.measured.get((key, repeat))
        if ref is None or m.output is None or ref.output is None:
            continue
        compared += 1
        if m.output != ref.output:
            d = first_difference(m.output, ref.output)
            mismatches.append({"prompt": key, "repeat": repeat, "first_difference": d, "length": len(m.output),
                               "reference_length": len(ref.output), "got": repr(m.output[d:d + 8]),
                               "reference": repr(ref.output[d:d + 8])})
    return (not mismatches if compared else None), mismatches, compared


def _ratios(row: SuiteRow, baseline: Optional[SuiteRow], key: str) -> dict[str, list[float]]:
    """Per cell, the row's figure over the baseline's in each repeat (the two ran back to back)."""
    if baseline is None or baseline is row:
        return {}
    ratios: dict[str, list[float]] = {}
    for (cell, repeat), m in row.measured.items():
        ref = baseline.measured.get((cell, repeat))
        mine, theirs = m.figures.get(key), ref.figures.get(key) if ref else None
        if mine is not None and theirs:
            ratios.setdefault(cell, []).append(mine / theirs)
    return ratios


def _total(values) -> Optional[float]:
    values = [v for v in values if v is not None]
    return float(sum(values)) if values else None


def summarize_row(row: SuiteRow, suite: Suite, rows: dict[str, SuiteRow]) -> dict[str, Any]:
    runs = list(row.measured.values())
    identical, mismatches, compared = _identity(row, rows)
    figures = {f.key: _total(m.figures.get(f.key) for m in runs) if f.total else median(m.figures.get(f.key)
                                                                                      for m in runs)
               for f in suite.figures}
    headline = [m.figures[suite.headline] for m in runs if m.figures.get(suite.headline) is not None]

    def per_cell_of(figure: str) -> dict:
        return {c.key: median(m.figures.get(figure) for (key, _), m in row.measured.items() if key == c.key)
                for c in suite.cells}
    per_cell = per_cell_of(suite.headline)
    failures = [{**f, "prompt": f["cell"]} for f in row.failures]
    ratios = _ratios(row, rows.get(suite.baseline or ""), suite.headline)
    weakest = worst_median(ratios, next(f.lower_is_better for f in suite.figures if f.key == suite.headline))
    return {"setup": row.name, "description": row.description, "reference": row.reference, "runs": len(runs),
            "failed_runs": len(row.failures), "failures": failures[:20], "figures": figures,
            "headline_spread": spread(headline),
            "ratio_to_baseline": median(ratio for values in ratios.values() for ratio in values),
            "weakest_cell": dict(zip(("cell", "ratio"), weakest)) if weakest else None,
            "per_cell": per_cell, **({"per_cell_figures": {f: per_cell_of(f) for f in suite.cell_figures}}
                                     if suite.cell_figures else {}),
            "identical": identical, "identity_checked_runs": compared,
            "mismatches": mismatches[:20], "mismatched_runs": len(mismatches)}


def build_suite_report(suite: Suite, machine: dict, command: Optional[str], interrupted: bool) -> dict[str, Any]:
    by_name = {r.name: r for r in suite.rows}
    rows = [summarize_row(r, suite, by_name) for r in suite.rows]
    references = {r.reference for r in suite.rows}
    for row in rows:
        row["is_reference"] = row["setup"] in references
    b = suite.bundle
    bundle = {"path": str(b.path), "relation": b.vocabulary["relation"]}
    for side in ("target", "draft"):
        info = b.manifest.get(side)
        if info:
            bundle[side] = {"source": (info.get("source") or {}).get("given"),
                            "weights": (info.get("weights") or {}).get("format")}
    report = {"tool": f"edge-specdec bench {suite.name}", "suite": suite.name, "command": command,
              "settings": {**suite.settings, "bundle": str(b.path), "repeats": suite.repeats,
                           "interrupted": interrupted},
              "machine": machine, "bundle": bundle, "method": suite.method, "headline": suite.headline,
              "baseline": suite.baseline,
              "figures": [{"key": f.key, "title": f.title + (" (total)" if f.total else ""), "format": f.spec,
                           "lower_is_better": f.lower_is_better} for f in suite.figures],
              "cells": [c.key for c in suite.cells], "setups": rows, "skipped": suite.skipped, "notes": suite.notes,
              "not_identical": [r["setup"] for r in rows if r["identical"] is False]}
    return rounded(report, 4)


def _weakest(row: dict) -> str:
    weakest = row.get("weakest_cell")
    return f"{weakest['ratio']:.2f}x ({weakest['cell']})" if weakest else "-"


def _identity_cell(row: dict) -> str:
    if row["identical"] is None:
        return "reference" if row["is_reference"] else "not compared"
    if row["identical"]:
        return f"yes ({row['identity_checked_runs']} runs)"
    return f"**NO** ({row['mismatched_runs']} of {row['identity_checked_runs']} runs)"


def _headline(report: dict) -> dict:
    return next(f for f in report["figures"] if f["key"] == report["headline"])


def render_suite_markdown(report: dict) -> str:
    s, b = report["settings"], report["bundle"]
    rows, figures, head = report["setups"], report["figures"], _headline(report)
    lines = [f"# edge-specdec bench {report['suite']}: {Path(s['bundle']).name}", ""]
    if report.get("command"):
        lines += ["```", report["command"], "```", ""]
    sides = "; ".join(f"{side} {b[side]['source']} ({b[side]['weights']})" for side in ("target", "draft") if side in b)
    shown = {k: v for k, v in s.items() if k not in ("bundle", "repeats", "interrupted") and v is not None}
    lines += [f"Bundle `{s['bundle']}`: {sides}; vocabulary {b['relation']}; {s['repeats']} repeat(s); "
              + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in shown.items()) + ".", "", report["method"], ""]
    if s.get("interrupted"):
        lines += ["**Interrupted**: the figures cover only the runs done before Ctrl-C.", ""]
    vs = f"{head['title']} vs {report['baseline']}" if report["baseline"] else None
    lines += ["## Figures", ""]
    lines += table(["row", "runs", *(f["title"] for f in figures), *([vs, "weakest cell"] if vs else []),
                    "identical to its reference"],
                   [[r["setup"], str(r["runs"]) + (f" ({r['failed_runs']} failed)" if r["failed_runs"] else ""),
                     *(cell(r["figures"][f["key"]], f["format"]) for f in figures),
                     *(["baseline" if r["setup"] == report["baseline"] else cell(r["ratio_to_baseline"], ".2f", "x"),
                        _weakest(r)] if vs else []), _identity_cell(r)] for r in rows])
    lines += ["", f"## {head['title']} per cell", ""]
    lines += table(["cell", *(r["setup"] for r in rows)],
                   [[c, *(cell(r["per_cell"][c], head["format"]) for r in rows)] for c in report["cells"]])
    if report.get("extra_markdown"):
        lines += ["", report["extra_markdown"].rstrip("\n")]
    lines += problems_section([line for r in rows for line in row_problems(r, r["setup"])], report)
    lines += ["", "## Rows", ""] + [f"- `{r['setup']}`: {r['description']}"
                                    + (f" (output checked against `{r['reference']}`)"
                                       if r["reference"] and r["reference"] != r["setup"] else "") for r in rows]
    lines += ["", "## Definitions", "", DEFINITIONS.replace("BASELINE", report["baseline"] or "the baseline").rstrip()]
    lines += machine_section(report["machine"])
    return "\n".join(lines)


def plot_headline(report: dict, path: Path) -> None:
    """One bar per row: its headline figure (median), the baseline row's drawn as a dashed line."""
    plt = pyplot()
    head = _headline(report)
    rows = [r for r in report["setups"] if r["figures"][head["key"]] is not None]
    fig, ax = plt.subplots(figsize=(max(5.0, 1.2 * len(rows) + 2), 4.5))
    colors = plt.get_cmap("tab10")
    ax.bar(range(len(rows)), [r["figures"][head["key"]] for r in rows],
           color=[colors(i % 10) for i in range(len(rows))])
    base = next((r for r in rows if r["setup"] == report["baseline"]), None)
    if base is not None:
        ax.axhline(base["figures"][head["key"]], color="black", linewidth=1, linestyle="--")
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([r["setup"] for r in rows], rotation=20, ha="right")
    ax.set_ylabel(head["title"] + (" (lower is better)" if head["lower_is_better"] else ""))
    ax.set_title(f"{report['suite']}: {Path(report['settings']['bundle']).name}")
    save_chart(fig, path)


def write_suite_report(report: dict, out_dir: Path, plot: bool = True,
                       say: Callable[[str], None] = print) -> dict[str, str]:
    """report.json, report.md and, with matplotlib, SUITE.png in out_dir."""
    return write_report_files(report, out_dir, render_suite_markdown, plot_headline, f"{report['suite']}.png", plot,
                              say)
