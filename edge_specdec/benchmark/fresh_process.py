"""One run of a row in a fresh Python process: for the suites whose figures belong to a process of their own (start-up
time, peak memory). The parent names a function as "module:name" and its keyword arguments; the child calls
name(started=T0, **kwargs), T0 its clock at the first line it ran, and hands back the dict it returns, with the
process's peak resident memory (VmHWM: its own, not the parent's) and, measured by the parent, its wall time to
its exit."""
from __future__ import annotations

import importlib
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# the child's first line reads the clock, before any import of ours
CHILD = "import time; T0 = time.perf_counter(); from edge_specdec.benchmark.fresh_process import child; child(T0)"
RESULT = "RESULT "
PACKAGE_ROOT = Path(__file__).resolve().parent.parent.parent  # the folder holding edge_specdec


def run_fresh(function: str, timeout: float = 1800, **kwargs: Any) -> dict[str, Any]:
    """function(started=T0, **kwargs) in a new process of this Python, importing this copy of edge_specdec; its
    dict with "peak_rss_mib" and "process_wall_s". A child that fails raises RuntimeError with its last error."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PACKAGE_ROOT), env.get("PYTHONPATH")) if p)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", CHILD, function], input=json.dumps(kwargs), capture_output=True,
                          text=True, env=env, timeout=timeout)
    wall = time.perf_counter() - start
    line = next((s for s in reversed(proc.stdout.splitlines()) if s.startswith(RESULT)), None)
    if proc.returncode or line is None:
        last = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}, no result"])[-1]
        raise RuntimeError(f"the fresh process failed: {last}")
    return {**json.loads(line[len(RESULT):]), "process_wall_s": wall}


def peak_rss_mib() -> float:
    """This process's peak resident memory since its start (VmHWM; ru_maxrss where /proc is absent)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(started: float) -> None:
    """The child's side: call the function named on the command line with the arguments on stdin; print its
    result as one line the parent looks for."""
    module, name = sys.argv[1].split(":")
    result = getattr(importlib.import_module(module), name)(started=started, **json.loads(sys.stdin.read()))
    result["peak_rss_mib"] = peak_rss_mib()
    print(RESULT + json.dumps(result), flush=True)
