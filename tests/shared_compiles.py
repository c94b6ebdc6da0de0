"""One compile per worker process of each tiny model, device and set of properties (see conftest's
_compile_each_model_once)."""
from __future__ import annotations

import hashlib
import os
import re
import tempfile
import threading
from pathlib import Path

import openvino as ov

# What the digest leaves out of a serialized graph: a node's friendly name that OpenVINO made up (its type and a
# counter of every node this process created), and the names of the nodes a compile fused into each node (runtime
# info that compile_model adds to the graph it was given, for profiling). Two reads of one IR through the same graph
# surgery differ in these alone.
AUTO_NAME = re.compile(rb'(<layer id="\d+" name=")[A-Za-z0-9]+_\d+(?=")')
FUSED_NAMES = re.compile(rb'<attribute name="fused_names" version="\d+" value="[^"]*" />')
SCRATCH = "/dev/shm" if os.path.isdir("/dev/shm") else None  # where a graph is serialized to be hashed (memory)
# Larger models compile for real: the tiny models and the demo pair are far below it, and a real model's weights
# (the opt-in real_models tests) would be serialized and hashed at every compile.
SHARED_MAX_BYTES = 64 * 2**20
# A worker keeps at most this many compiled models, the least recently handed out dropped first: a few MB each for
# the tiny models, so that the whole suite's many bundles and settings do not pile up in memory.
SHARED_MAX_MODELS = 256
REAL_COMPILE = ov.Core.compile_model  # as this module is first imported (by conftest.py, before any patch)


class CompiledModels:
    """Stands in for ov.Core.compile_model: a model compiled once for the same graph, device and properties is
    handed out again. The key is the graph's own serialized bytes (every node, shape, constant and the runtime info
    the IR writes), so a copy that differs in anything (another static shape, a cut output layer, a patched graph)
    compiles on its own; a model given by path is keyed by its files' bytes. Core-level properties are
    not part of the key: the runtime sets none. A compile with a CACHE_DIR property (OpenVINO's compiled-model
    cache, which it writes and reads), one with arguments this does not know and one of a model with more than
    max_bytes of weights always compile for real."""

    def __init__(self, real_compile=REAL_COMPILE, max_bytes: int = SHARED_MAX_BYTES,
                 max_models: int = SHARED_MAX_MODELS):
        self.real_compile, self.max_bytes, self.max_models = real_compile, max_bytes, max_models
        self.compiled: dict[tuple, ov.CompiledModel] = {}
        self.locks: dict[tuple, threading.Lock] = {}
        self.lock = threading.Lock()
        self.enabled = True  # False while a test that compiles for real runs (see conftest)

    def digest(self, model) -> str:
        """The model's identity: the sha256 of its IR as serialized (an ov.Model), or of its files (a path)."""
        if isinstance(model, ov.Model):
            with tempfile.TemporaryDirectory(prefix="graph-digest-", dir=SCRATCH) as folder:
                xml, weights = Path(folder) / "model.xml", Path(folder) / "model.bin"
                ov.serialize(model, str(xml), str(weights))
                graph = FUSED_NAMES.sub(b"", AUTO_NAME.sub(rb"\1", xml.read_bytes()))
                return hashlib.sha256(graph + weights.read_bytes()).hexdigest()
        path = Path(model)  # an IR file that OpenVINO reads itself: its bytes, and those of its weights
        return hashlib.sha256(b"".join(p.read_bytes() for p in (path, path.with_suffix(".bin")) if p.exists())
                              ).hexdigest()

    def __call__(self, core, model, device_name=None, config=None, *args, **kwargs):
        if (not self.enabled or args or kwargs or device_name is None or "CACHE_DIR" in (config or {})
                or not isinstance(model, (ov.Model, str, Path)) or weight_bytes(model) > self.max_bytes):
            return self.real_compile(core, model, device_name, config, *args, **kwargs)
        key = (self.digest(model), device_name, tuple(sorted((name, repr(value))
                                                              for name, value in (config or {}).items())))
        with self.lock:
            lock = self.locks.setdefault(key, threading.Lock())
        with lock:  # one compile per key; other keys (a draft beside its target) compile at the same time
            with self.lock:
                found = self.compiled.pop(key, None)
            if found is None:
                found = self.real_compile(core, model, device_name, config)
            with self.lock:
                self.compiled[key] = found  # the most recently handed out last
                while len(self.compiled) > self.max_models:
                    oldest = next(iter(self.compiled))
                    del self.compiled[oldest]
                    self.locks.pop(oldest, None)
            return found


def weight_bytes(model) -> int:
    """The bytes of a model's constants (an ov.Model), or of its weights file (a path)."""
    if isinstance(model, ov.Model):
        return sum(op.get_byte_size() for op in model.get_ordered_ops() if op.get_type_name() == "Constant")
    weights = Path(model).with_suffix(".bin")
    return weights.stat().st_size if weights.exists() else 0
