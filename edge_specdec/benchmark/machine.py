"""The machine a benchmark ran on: what report.json records of it, and the paragraph each report.md ends with."""
from __future__ import annotations

import datetime as _dt
import os
import platform
import sys
from pathlib import Path
from typing import Any

# the libraries whose versions the paragraph names, when the run recorded them
VERSIONS = ("openvino", "openvino_genai", "transformers", "torch", "edge_specdec")


def machine_info() -> dict[str, Any]:
    """The CPU, its cores, the platform, the versions of what is loaded (call it after loading the engines) and
    the load average now."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import openvino

    info = {"cpu": cpu, "cores": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "openvino": openvino.__version__,
            "date": _dt.datetime.now(_dt.timezone.utc).astimezone().isoformat(timespec="seconds")}
    try:
        info["cores_usable"] = len(os.sched_getaffinity(0))
    except AttributeError:
        pass
    try:
        info["load_average_at_start"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        pass
    from .. import __version__
    info["edge_specdec"] = __version__
    for name, module in (("openvino_genai", "openvino_genai"), ("transformers", "transformers"), ("torch", "torch")):
        if module in sys.modules:
            info[name] = getattr(sys.modules[module], "__version__", "?")
    return info


def note_load_at_end(info: dict[str, Any]) -> None:
    """Record the load average at the end of the timed runs beside the one at the start."""
    try:
        info["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        pass


def machine_section(m: dict[str, Any]) -> list[str]:
    """report.md's closing "## Machine" section: the CPU, the software and the load average at both ends."""
    versions = ", ".join(f"{k} {m[k]}" for k in VERSIONS if k in m)
    load = ""
    if "load_average_at_start" in m:
        load = (f"; load average {'/'.join(map(str, m['load_average_at_start']))} at the start"
                + (f", {'/'.join(map(str, m['load_average_at_end']))} at the end"
                   if "load_average_at_end" in m else ""))
    return ["", "## Machine", "",
            f"{m['cpu']}, {m['cores']} cores" + (f" ({m['cores_usable']} usable)" if "cores_usable" in m else "")
            + f"; {m['platform']}; Python {m['python']}; {versions}; {m['date']}{load}.", ""]
