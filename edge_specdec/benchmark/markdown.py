"""The pieces of Markdown both benchmarks' report.md are built from: a figure in a cell, a table, the section of
problems, the line on a --prompts file."""
from __future__ import annotations


def cell(value, spec: str = ".2f", suffix: str = "") -> str:
    """A figure for a table cell: formatted with spec, then suffix; "-" for None."""
    return "-" if value is None else f"{value:{spec}}{suffix}"


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table's lines."""
    return (["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
            + ["| " + " | ".join(r) + " |" for r in rows])


def problems_section(problems: list[str], report: dict) -> list[str]:
    """The section "Failures, mismatches, skipped rows, notes": problems (a line each), then the report's skipped
    rows and notes; nothing when there is none of them."""
    problems = (problems + [f"- skipped: {x['setup']}: {x['reason']}" for x in report["skipped"]]
                + [f"- note: {note}" for note in report["notes"]])
    return ["", "## Failures, mismatches, skipped rows, notes", "", *problems] if problems else []


def row_problems(row: dict, label: str) -> list[str]:
    """A row's mismatches and failures, a line each, for problems_section; label names the row."""
    lines = []
    for mm in row["mismatches"]:
        lengths = f" (lengths {mm['length']} vs {mm['reference_length']})" if "length" in mm else ""
        lines.append(f"- NOT identical: {label} on {mm['prompt']} (repeat {mm['repeat'] + 1}): first difference "
                     f"at token {mm['first_difference']}: {mm['got']} vs {mm['reference']}{lengths}")
    for fail in row["failures"]:
        on = f" on {fail['prompt']}" if "prompt" in fail else ""
        lines.append(f"- failed: {label}{on} (repeat {fail['repeat'] + 1}): {fail['error']}")
    return lines


def prompt_source_lines(settings: dict) -> list[str]:
    """The report's line on a --prompts file (its path, sha256 and size), followed by a blank line; none for the
    shipped prompt set."""
    source = settings.get("prompts_file")
    if not source:
        return []
    return [f"Prompts from `{source['path']}` (--prompts; sha256 {source['sha256']}): {source['prompts']} "
            f"prompt{'' if source['prompts'] == 1 else 's'} in "
            + ", ".join(f"{category} ({n})" for category, n in source["categories"].items()) + ".", ""]
