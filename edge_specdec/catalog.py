"""The catalog of known-good pairs (edge_specdec/data/pairs.json, package data): `edge-specdec pairs` and
`edge-specdec export --pair`.

Each pair names its target and draft sources, their weight formats, the devices and the algorithm to run. A pair
measured here carries its runs (`measured`): each run's summary, the machine, the date, the command that measured
it and where its figures are told. A pair not measured here has `measured` null and says so (`unmeasured`: what
is known instead, such as a draft published for that target). `edge-specdec pair ... --catalog-entry` prints a
measured entry for its best candidate (pairing.catalog_entry).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from .errors import EdgeSpecdecError

CATALOG = Path(__file__).resolve().parent / "data" / "pairs.json"
PAIR_FIELDS = ("description", "target", "draft", "target_weights", "draft_weights", "devices", "algorithm",
               "num_assistant_tokens", "measured")
RUN_FIELDS = ("summary", "machine", "date", "command")  # each measured run's; `report` is optional


def load_catalog(path: Optional[Path] = None) -> dict[str, dict[str, Any]]:
    path = path or CATALOG
    if not path.exists():
        raise EdgeSpecdecError(f"the pair catalog {path} is missing: it ships inside the edge-specdec package "
                               f"(reinstall it), or pass --target and --draft yourself.")
    pairs = json.loads(path.read_text(encoding="utf-8"))["pairs"]
    for name, pair in pairs.items():
        problem = entry_problem(pair)
        if problem:
            raise EdgeSpecdecError(f"the pair catalog {path}: {name!r} {problem}; fix the entry (pairs.json's "
                                   f"_comment describes the fields).")
    return pairs


def entry_problem(pair: dict[str, Any]) -> Optional[str]:
    """What is wrong with a catalog entry, in a few words (None: nothing): a missing field, a measured run without
    its machine, date or command, or an unmeasured pair that does not say so."""
    missing = [f for f in PAIR_FIELDS if f not in pair]
    if missing:
        return f"has no {', '.join(missing)}"
    measured = pair["measured"]
    if measured is None:
        return None if pair.get("unmeasured") else "is not measured (measured: null) but has no `unmeasured` note"
    if not isinstance(measured, list) or not measured:
        return "has `measured` that is not a list of runs"
    for run in measured:
        lacking = [f for f in RUN_FIELDS if not isinstance(run, dict) or not run.get(f)]
        if lacking:
            return f"has a measured run without its {', '.join(lacking)}"
    return None


def get_pair(name: str, path: Optional[Path] = None) -> dict[str, Any]:
    pairs = load_catalog(path)
    if name not in pairs:
        raise EdgeSpecdecError(f"unknown pair {name!r}: `edge-specdec pairs` lists the known ones "
                               f"({', '.join(sorted(pairs))}).")
    return pairs[name]


def describe_pairs(pairs: dict[str, dict[str, Any]]) -> str:
    """The catalog for the terminal: each pair's sources, settings, and its measured runs (each with its machine,
    date and command) or that it is not measured here."""
    lines = []
    for name, pair in pairs.items():
        lines += [f"{name}", f"    {pair['description']}",
                  f"    target {pair['target']} ({pair['target_weights']}), draft {pair['draft']} "
                  f"({pair['draft_weights']})",
                  f"    devices: target {pair['devices']['target']}; draft {pair['devices']['draft']}",
                  f"    run with --algorithm {pair['algorithm']} --num-assistant-tokens {pair['num_assistant_tokens']}"]
        if pair["measured"] is None:
            lines.append(f"    not measured here: {_unmeasured(pair['unmeasured'])}")
            continue
        for run in pair["measured"]:
            lines += [f"    measured: {run['summary']}",
                      f"        machine: {run['machine']}; date: {run['date']}",
                      f"        command: {run['command']}"]
            if run.get("report"):
                lines.append(f"        report: {run['report']}")
    return "\n".join(lines)


def _unmeasured(note: str) -> str:
    """An `unmeasured` note without its leading "unmeasured here:" (the line already says it)."""
    prefix = "unmeasured here:"
    return note[len(prefix):].strip() if note.lower().startswith(prefix) else note
