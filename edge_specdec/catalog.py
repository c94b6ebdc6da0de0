"""The catalog of known-good pairs (edge_specdec/data/pairs.json, package data): `edge-specdec pairs` and
`edge-specdec export --pair`."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from .errors import EdgeSpecdecError

CATALOG = Path(__file__).resolve().parent / "data" / "pairs.json"


def load_catalog(path: Optional[Path] = None) -> dict[str, dict[str, Any]]:
    path = path or CATALOG
    if not path.exists():
        raise EdgeSpecdecError(f"the pair catalog {path} is missing: it ships inside the edge-specdec package "
                               f"(reinstall it), or pass --target and --draft yourself.")
    return json.loads(path.read_text(encoding="utf-8"))["pairs"]


def get_pair(name: str, path: Optional[Path] = None) -> dict[str, Any]:
    pairs = load_catalog(path)
    if name not in pairs:
        raise EdgeSpecdecError(f"unknown pair {name!r}: `edge-specdec pairs` lists the known ones "
                               f"({', '.join(sorted(pairs))}).")
    return pairs[name]


def describe_pairs(pairs: dict[str, dict[str, Any]]) -> str:
    lines = []
    for name, pair in pairs.items():
        measured = pair.get("measured")
        figures = (f"measured: {measured['summary']}" if measured else "not measured by us yet")
        lines += [f"{name}", f"    {pair['description']}",
                  f"    target {pair['target']} ({pair['target_weights']}), draft {pair['draft']} "
                  f"({pair['draft_weights']})",
                  f"    devices: target {pair['devices']['target']}; draft {pair['devices']['draft']}",
                  f"    run with --algorithm {pair['algorithm']} --num-assistant-tokens {pair['num_assistant_tokens']}"
                  f"; {figures}"]
    return "\n".join(lines)
