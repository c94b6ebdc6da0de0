"""Writing a benchmark's report: report.json, report.md and, with matplotlib, its chart."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from ..errors import EdgeSpecdecError


def pyplot():
    """matplotlib.pyplot drawing to files (the Agg backend: no display needed)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save_chart(fig, path: Path) -> None:
    """Write the figure to path as a PNG and free it."""
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    pyplot().close(fig)


def write_report_files(report: dict, out_dir: Path, render: Callable[[dict], str],
                       chart: Callable[[dict, Path], None], chart_name: str, plot: bool = True,
                       say: Callable[[str], None] = print) -> dict[str, str]:
    """report.json, report.md (render(report)) and, when plot and matplotlib is installed, chart_name (drawn by
    chart) in out_dir. Returns {"json", "markdown", "plot"}: the paths written."""
    files = {}
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / "report.json"
        path.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        files["json"] = str(path)
        path = out_dir / "report.md"
        path.write_text(render(report), encoding="utf-8")
        files["markdown"] = str(path)
    except OSError as exc:
        raise EdgeSpecdecError(f"cannot write the report to {out_dir}: {exc.strerror or exc}.") from None
    if plot:
        try:
            import matplotlib  # noqa: F401 - only to know whether it is there
        except ImportError:
            say(f"matplotlib is not installed (pip install 'edge-specdec[bench]'): no {chart_name}")
        else:
            path = out_dir / chart_name
            chart(report, path)
            files["plot"] = str(path)
    say("wrote " + ", ".join(files.values()))
    return files
