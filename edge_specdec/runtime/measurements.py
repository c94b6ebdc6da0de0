"""The measurement cache: what an engine measured about its models on this machine, remembered for later processes.

Opening a bundle measures a few things on the device: whether the target's blocks are bit-identical to single
steps at each precision (exactness, `probes.passes_block_invariance`), whether the tokens after a long prompt may go
as one-token sequences (`probes.passes_sequences_layout`), whether a long prompt's bf16 prefill copy keeps its
bits across call sizes (`probes.passes_prefill_calls`) and, for the default's choice, how fast it prefills against the
target (`probes.prefill_copy_ratio`), and the longest call that keeps the bits of
short calls (`probes.longest_exact_call`, the pieces a long prompt is fed in), whether fixed block sizes pay
(`probes.fixed_block_pays`), which single step is cheapest (`probes.cheapest_step`), and what the drafting guard
learned. They depend on the machine (the instruction sets the CPU plugin picks its kernels by, and the threads it
runs on), the OpenVINO version, the bundle's files, the settings and the way an exact session forms its calls, so
they are stored per such key beside the compiled-model cache, and a later process reads them instead of measuring
again. With the cache off, every process measures.

A cache file is data from disk, so nothing in it is trusted as it stands: each entry must have a name this module
knows, a value of the shape and range its measurement gives, and a seal (a digest of the file's key, the name and
the value) that only this module writes. An entry that fails any of these is dropped, as if never measured, and
measured again when it is next needed; the first such file in a process is named once on stderr. A verdict of
exactness counts as a pass only when it is the JSON value `true`.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import re
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable, Optional

import openvino as ov

# 7: entries are sealed and checked, the key names the instruction sets, the threads and the call layout
PLAN_VERSION = 7

# The CPU flags OpenVINO's CPU plugin chooses kernels by (its ISA levels: SSE4.2, AVX, AVX2, AVX-512 with its
# VNNI, BF16 and FP16 extensions, AMX): two hosts that differ in one of them may round differently.
KERNEL_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512bw", "avx512vl", "avx512dq",
                "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8", "amx_fp16")


def machine_name(core: ov.Core) -> str:
    """The CPU model as OpenVINO names it, else the platform's word."""
    try:
        return str(core.get_property("CPU", "FULL_DEVICE_NAME"))
    except RuntimeError:
        return platform.processor() or platform.machine()


def kernel_flags() -> list[str]:
    """The instruction-set flags of this CPU that pick the plugin's kernels (Linux reads /proc/cpuinfo; elsewhere
    the platform's processor string stands for them)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return [platform.processor() or platform.machine()]
    return [flag for flag in KERNEL_FLAGS if flag in flags]


def available_cores() -> int:
    """The cores this process may run on: what the CPU plugin's threads default to, and so its kernels' split."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def machine_key(core: ov.Core) -> dict[str, Any]:
    """What the measurements depend on of this machine: the CPU's name, its kernel flags (a VM's name may be the
    same for AVX2, AVX-512 and AMX hosts) and the cores the plugin's threads spread over."""
    return {"cpu": machine_name(core), "flags": kernel_flags(), "cores": available_cores()}


# --- what a valid entry looks like, by name --------------------------------------------------------------------

def _is_bool(value: Any) -> bool:
    return type(value) is bool


def _is_number(value: Any, low: float = 0.0) -> bool:
    return type(value) in (int, float) and math.isfinite(value) and value >= low


def _is_rate(value: Any) -> bool:
    """A drafting guard's decayed [tokens, seconds]."""
    return type(value) is list and len(value) == 2 and all(_is_number(v) for v in value)


def _is_guard(value: Any) -> bool:
    """A drafting guard's verdict (DraftingGuard.learned)."""
    return (type(value) is dict and set(value) - {"left", "lost"} == {"mode", "interval", "drafting", "alone"}
            and _is_bool(value["mode"]) and type(value["interval"]) is int and 1 <= value["interval"] <= 4096
            and (type(value.get("left", 0)) is int and 0 <= value.get("left", 0) <= 4096)
            and (type(value.get("lost", 0)) is int and 0 <= value.get("lost", 0) <= 64)
            and _is_rate(value["drafting"]) and _is_rate(value["alone"]))


def _is_device_timings(name: str, value: Any) -> bool:
    """The draft's step in milliseconds on each candidate device the name lists."""
    devices = name.split("/", 1)[1].split(",")
    return type(value) is dict and sorted(value) == sorted(devices) and all(_is_number(v) for v in value.values())


def _is_precision_verdicts(value: Any) -> bool:
    """Block invariance per precision name (devices.PRECISIONS)."""
    return type(value) is dict and all(re.fullmatch(r"[a-z0-9]{1,8}", k) and _is_bool(v) for k, v in value.items())


def _is_precision_calls(value: Any) -> bool:
    """The longest exact call per precision name (probes.longest_exact_call: a size of 8 to a few hundred tokens)."""
    return type(value) is dict and all(re.fullmatch(r"[a-z0-9]{1,8}", k) and type(v) is int and 2 <= v <= 4096
                                       for k, v in value.items())


def _is_prefill_verdicts(value: Any) -> bool:
    """The long-prompt prefill copy's verdict per precision name: the longest call its probe passed with (8 to a few
    thousand tokens), or false."""
    return type(value) is dict and all(re.fullmatch(r"[a-z0-9]{1,8}", k) and
                                       (v is False or (type(v) is int and 8 <= v <= 4096)) for k, v in value.items())


def _is_prefill_ratios(value: Any) -> bool:
    """The long-prompt prefill copy's time per precision name as a share of the target's own prefill
    (probes.prefill_copy_ratio)."""
    return type(value) is dict and all(re.fullmatch(r"[a-z0-9]{1,8}", k) and _is_number(v) and 0 < v < 100
                                       for k, v in value.items())


# name pattern -> is the value one that measurement gives? (cheapest_step gives the least block, 1 or 2, or one
# more; a fixed block is at most a long draft's k + 1)
VALID: list[tuple[str, Callable[[str, Any], bool]]] = [
    (r"target/invariant", lambda name, v: _is_precision_verdicts(v)),
    (r"target/sequences", lambda name, v: _is_precision_verdicts(v)),
    (r"target/prefill", lambda name, v: _is_prefill_verdicts(v)),
    (r"target/prefill_ratio", lambda name, v: _is_prefill_ratios(v)),
    (r"target/longest_block", lambda name, v: _is_precision_calls(v)),
    (r"target/batch_invariant", lambda name, v: _is_bool(v)),
    (r"target/static_invariant/\d{1,2}(,\d{1,2})*", lambda name, v: _is_bool(v)),
    (r"(target|draft)/fixed_block/\d{1,2}", lambda name, v: _is_bool(v)),
    (r"(target|draft)/step", lambda name, v: type(v) is int and 1 <= v <= 3),
    (r"draft_device/[A-Z0-9.,]+", _is_device_timings),
    (r"guard/[\w./=+-]{1,200}", lambda name, v: _is_guard(v)),
]


# names of measurements no longer taken (a later version measures them otherwise, under another name), as patterns:
# dropped from a file quietly, since nothing in it is wrong. A drafting guard's verdict after a long prompt is kept
# per length now (pipeline.guard_key), not for every long prompt at once.
RETIRED = (r"target/prefill_time", r"guard/[\w./=+-]{1,200}/long-prompt")


def is_retired(name: str) -> bool:
    """Whether `name` is a retired measurement's (RETIRED)."""
    return any(re.fullmatch(pattern, name) for pattern in RETIRED)


def is_valid(name: str, value: Any) -> bool:
    """Whether `value` is one the measurement called `name` gives (a retired name gives none)."""
    return not is_retired(name) and any(re.fullmatch(pattern, name) and check(name, value) for pattern, check in VALID)


_warned: set[str] = set()  # files already named on stderr by this process


class MeasurementCache:
    """Measurements keyed by name ("target/invariant", "draft/fixed_block/4", ...), each taken once and, with a
    cache folder, written to one JSON file per machine, OpenVINO version, bundle and settings."""

    def __init__(self, cache_dir: Optional[Path], key: dict[str, Any]):
        self.digest = hashlib.sha256(json.dumps({"version": PLAN_VERSION, **key}, sort_keys=True).encode()).hexdigest()
        self.path = cache_dir / "plans" / f"{self.digest[:32]}.json" if cache_dir is not None else None
        self.values: dict[str, Any] = {}
        self._lock = threading.Lock()
        self.dropped: list[str] = []  # entries of the file that did not check out (measured again when needed)
        if self.path is not None and self.path.is_file():
            self._load()

    def _seal(self, name: str, value: Any) -> str:
        return hashlib.sha256(json.dumps([self.digest, name, value], sort_keys=True).encode()).hexdigest()[:24]

    def _load(self) -> None:
        """Read the file, keeping the entries that check out (see the module's docstring)."""
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            data = None  # unreadable or truncated: everything is measured again
        entries = data.get("entries") if type(data) is dict and data.get("version") == PLAN_VERSION else None
        if type(entries) is not dict:
            self.dropped = ["the whole file"]
            entries = {}
        for name, entry in entries.items():
            ok = (type(entry) is dict and set(entry) == {"value", "seal"} and is_valid(name, entry["value"])
                  and entry["seal"] == self._seal(name, entry["value"]))
            if ok:
                self.values[name] = entry["value"]
            elif not is_retired(name):
                self.dropped.append(name)
        if self.dropped:
            self._say_dropped()
        if self.dropped or len(self.values) < len(entries):
            self.save()  # the file heals: what was dropped is gone from it until measured again

    def _say_dropped(self) -> None:
        if str(self.path) in _warned:
            return
        _warned.add(str(self.path))
        names = ", ".join(self.dropped[:6]) + (f" and {len(self.dropped) - 6} more" if len(self.dropped) > 6 else "")
        print(f"edge-specdec: the measurement cache {self.path} had entries that do not check out ({names}); "
              f"ignored, and measured again when needed.", file=sys.stderr)

    @property
    def loaded(self) -> bool:
        """Whether anything came from an earlier process."""
        return bool(self.values)

    def known(self, name: str) -> Any:
        """The value of `name` if it was measured (in this process, or in an earlier one), else None."""
        with self._lock:
            return self.values.get(name)

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
        """Write the file atomically (a temp file renamed over it; removed if anything fails): an unwritable cache
        only costs measuring again. A value no measurement should give stays in this process only."""
        if self.path is None:
            return
        data = {"version": PLAN_VERSION,
                "entries": {name: {"value": value, "seal": self._seal(name, value)}
                            for name, value in self.values.items() if is_valid(name, value)}}
        tmp = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                json.dump(data, f, indent=1, sort_keys=True)
            os.replace(tmp, self.path)
        except (OSError, TypeError, ValueError):
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
