"""A `pair` report as an entry of the pair catalog (edge_specdec/data/pairs.json, catalog.py).

The report of a run that simulated (not `--look`) carries what an entry needs: the target and the draft as given,
their weight formats, where the models ran, the prediction, the machine (its CPU, cores and load) and the date;
the command line that made it is added by the `pair` command. The entry's one measured run says that its figure
is a prediction from simulated rounds with costs measured on that machine, not a timed run.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Optional

from ..errors import EdgeSpecdecError
from ..runtime.algorithms import DRAFT_TOKENS

METHOD = "edge-specdec pair: simulated rounds in the runtime's decode loop, priced with the target's call costs " \
         "measured on the machine"


def catalog_entry(report: dict[str, Any], name: Optional[str] = None,
                  command: Optional[str] = None) -> dict[str, dict[str, Any]]:
    """{pair name: entry} for a candidate of the report: `name`, else the best simulated candidate with a draft
    model. command: the command line that made the report (else the report's own `command`)."""
    command = command or report.get("command")
    if report.get("look_only") or "machine" not in report:
        raise EdgeSpecdecError("a catalog entry needs simulated rounds: run `edge-specdec pair` without --look.")
    if not command:
        raise EdgeSpecdecError("a catalog entry names the command that measured it: pass command= (the `pair` "
                               "command line adds its own).")
    rows = [row for row in report["candidates"] if row.get("prediction") and row["source"]]
    if name is not None:
        rows = [row for row in report["candidates"] if row["name"] == name]
        if not rows or not rows[0].get("prediction") or not rows[0]["source"]:
            raise EdgeSpecdecError(f"{name!r} is not a simulated candidate with a draft model, so it makes no "
                                   "pair: name one of the drafts the report simulated.")
    if not rows:
        raise EdgeSpecdecError("no draft model was simulated, so there is no pair to write: give a DRAFT (and "
                               "--top 1 or more).")
    row = rows[0]  # the report lists the candidates best first
    p, machine = row["prediction"], report["machine"]
    sampled = report.get("sampling") is not None
    algorithm = row["algorithm"]["sampled" if sampled else "greedy"]
    acceptance = f"; acceptance {p['acceptance']:.2f}" if p.get("acceptance") is not None else ""
    summary = (f"predicted {p['speedup']:.2f}x the target alone per output token by simulated rounds "
               f"({algorithm}, {report['decoding']}; {report['prompts']} {report['task']} prompts, "
               f"{report['max_new_tokens']} tokens{acceptance}), not a timed run")
    placement = row.get("placement") or {}
    entry = {
        "description": f"{row['relation']} vocabulary; found by `edge-specdec pair` on {report['task']} prompts",
        "target": report["target"], "draft": row["source"],
        "target_weights": report.get("target_weights"), "draft_weights": row.get("draft_weights"),
        "devices": {"target": placement.get("target") or "AUTO", "draft": placement.get("draft") or "AUTO"},
        "algorithm": algorithm, "num_assistant_tokens": DRAFT_TOKENS,
        "measured": [{"summary": summary, "machine": describe_machine(machine), "date": machine["date"],
                      "command": command, "method": METHOD}]}
    return {f"{_short(report['target'])}+{_short(row['source'])}": entry}


def describe_machine(machine: dict[str, Any]) -> str:
    """benchmark.machine.machine_info() in one line: the CPU, the cores this process could use, the load."""
    cores = machine.get("cores_usable") or machine.get("cores")
    load = machine.get("load_average_at_start")
    return (f"{machine.get('cpu', '?')}, {cores} of {machine.get('cores')} cores"
            + (f"; load average {load[0]} at the start" if load else "")
            + f"; openvino {machine.get('openvino', '?')}")


def _short(source: str) -> str:
    """A source's short name for the pair's name: the last part of a path or hub id, lower case, no suffix."""
    name = Path(source.rstrip("/")).name or source
    return re.sub(r"[^\w.-]+", "-", re.sub(r"\.gguf$", "", name, flags=re.I)).lower()
