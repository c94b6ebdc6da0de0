"""The measurement cache: what an engine measured about its models on this machine, remembered for later processes.

Opening a bundle measures a few things on the device: whether the target's blocks are bit-identical to single
steps at each precision (exactness, `probes.is_block_invariant`), whether fixed block sizes pay
(`probes.fixed_block_pays`) and which single step is cheapest (`probes.cheapest_step`). They depend on the
machine, the OpenVINO version, the bundle's files and the settings, and on nothing else, so they are stored
per such key beside the compiled-model cache, and a later process reads it instead of measuring again. With
the cache off, every process measures.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable, Optional

import openvino as ov

# 2: the batch-invariance probe covers calls that gather some of their rows; 3: the block-invariance probe runs
# after a long past too (probes.passes_block_invariance); 4: the CPU's KV cache is f16 unless another is asked for;
# 5: and after a real prefill of probes.REAL_PAST tokens; 6: exact sessions feed long blocks in pieces of at most
# session.LONGEST_BLOCK tokens, so earlier answers do not hold for them
PLAN_VERSION = 6


def machine_name(core: ov.Core) -> str:
    """The CPU model as OpenVINO names it (kernels are chosen by it), else the platform's word."""
    try:
        return str(core.get_property("CPU", "FULL_DEVICE_NAME"))
    except RuntimeError:
        return platform.processor() or platform.machine()


class MeasurementCache:
    """Measurements keyed by name ("target/invariant", "draft/fixed_block/4", ...), each taken once and, with a
    cache folder, written to one JSON file per machine, OpenVINO version, bundle and settings."""

    def __init__(self, cache_dir: Optional[Path], key: dict[str, Any]):
        digest = hashlib.sha256(json.dumps({"version": PLAN_VERSION, **key}, sort_keys=True).encode()).hexdigest()
        self.path = cache_dir / "plans" / f"{digest[:32]}.json" if cache_dir is not None else None
        self.values: dict[str, Any] = {}
        self._lock = threading.Lock()
        if self.path is not None and self.path.is_file():
            try:
                self.values = json.loads(self.path.read_text())
            except (OSError, ValueError):
                self.values = {}  # a damaged file is measured again

    @property
    def loaded(self) -> bool:
        """Whether anything came from an earlier process."""
        return bool(self.values)

    def get(self, name: str, measure: Callable[[], Any]) -> Any:
        """The value of `name`, measured now if no process on this machine measured it before."""
        with self._lock:
            if name not in self.values:
                self.values[name] = measure()
                self.save()
            return self.values[name]

    def put(self, name: str, value: Any, write: bool = True) -> None:
        """Keep `value` under `name` (a measurement the runs update, such as the drafting guard's); write the file
        out if it changed and `write` says so (False: this process only, until the next write)."""
        with self._lock:
            if self.values.get(name) != value:
                self.values[name] = value
                if write:
                    self.save()

    def save(self) -> None:
        """Write the file atomically (a temp file renamed over it); an unwritable cache only costs re-measuring."""
        if self.path is None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                json.dump(self.values, f, indent=1, sort_keys=True)
            os.replace(tmp, self.path)
        except OSError:
            pass
