"""Where the draft and the target run, and how each device is configured.

The product's design: the draft on an integrated GPU or the NPU, the target on the CPU or a discrete GPU, so that
the two models share no compute. `place()` asks for the devices the machine has (never waiting for a compile
error), honours explicit choices, falls back when allowed, and says in one line what runs where and why.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from ..errors import EdgeSpecdecError

DEVICE_CHOICES = "CPU, GPU, GPU.N, NPU or AUTO"
DEFAULT_CACHE_DIR = Path.home() / ".cache" / "edge-specdec" / "ov-cache"

# A model on the NPU runs under OpenVINO's NPU LLM pipeline (NPUW, see npu.py), compiled for static lengths:
# prompts of up to NPU_MAX_PROMPT tokens (GenAI's default), a context of that plus NPU_MIN_RESPONSE (drafting
# stops when a draft's is full; the target goes on alone), generate calls of one token for a draft (as in
# GenAI) and of a whole verification block for a target (k_max 12, the token before it and a re-fed one,
# rounded up to the multiple of 8 NPUW uses).
NPU_MAX_PROMPT = 1024
NPU_MIN_RESPONSE = 512
DRAFT_GENERATION_TOKENS = 1
TARGET_GENERATION_TOKENS = 16

# Activation precisions on the CPU. "dq": int8 dynamic quantization of the activations of int4/int8 weight
# matmuls (the plugin's default kernels, much faster on small CPUs). "f32": plain float32 arithmetic, closest to
# the original model. bf16 inference is not used: on AVX-512 BF16 CPUs it was not exact.
CPU_PRECISIONS = {
    "dq": {"INFERENCE_PRECISION_HINT": "f32"},
    "f32": {"INFERENCE_PRECISION_HINT": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": "0"},
}
# The precisions a long prompt's prefill may run at on a copy of the target of its own (session.py, "A long prompt's
# prefill in bf16"): bf16 arithmetic where the CPU has it (AMX, AVX-512 BF16; elsewhere OpenVINO computes f32 and the
# copy is not kept), and f32, exact like it but slower than dq (kept for CPUs without bf16: the same machinery).
PREFILL_PRECISIONS = {
    "bf16": {"INFERENCE_PRECISION_HINT": "bf16"},
    "f32": CPU_PRECISIONS["f32"],
}
# What a long prompt's prefill may be asked for (EngineConfig.long_prompt_precision): "auto" (the default) keeps a
# bf16 copy where it pays for its memory: a target of at least AUTO_PREFILL_BYTES of weights on a CPU with bf16
# arithmetic, an f16 KV cache, and the copy's prefill of a prompt of two of its calls timed once per machine and bundle
# at no more than AUTO_PREFILL_RATIO of the target's own (AMX, and AVX-512 BF16 alone, whose gain is smaller and grows
# with the prompt; a CPU where the copy gains less, or computes slower, keeps the memory);
# "off": the target prefills every prompt; or one of PREFILL_PRECISIONS, kept wherever it computes.
LONG_PROMPT_PRECISIONS = ("auto", "off", *PREFILL_PRECISIONS)
AUTO_PREFILL = "bf16"
AUTO_PREFILL_RATIO = 0.95
AUTO_PREFILL_BYTES = 256 * 2**20
# The KV cache's element type (KV_CACHE_PRECISION). The CPU's default is f16: half the bytes of f32 and exact as f32
# is (on the real 1.5B target: block-invariant on an empty cache and after 8192 tokens, the same after rollbacks;
# benchmarks/RESULTS.md, "The KV cache's precision"). bf16 is refused by the CPU plugin's paged attention on AVX2
# CPUs. u8 (the plugin's own default, keys quantized per channel over each block of tokens) is not block-invariant
# at either precision: chosen explicitly, it saves memory and the runs say they are exact only up to float noise.
KV_CACHES = ("f32", "f16", "u8")
PRECISIONS = tuple(CPU_PRECISIONS)


@dataclass(frozen=True)
class DeviceProfile:
    """What one kind of device needs from the runtime, in one place instead of string checks.

    rollback: the KV rollback its sessions use unless told otherwise (the NPU's NPUW pipeline owns a stateful
    cache and trims it by position ids). properties: what every model compiled there gets. precisions: the activation precisions it can be
    asked for, each with its properties, tried in order until the session passes the block-invariance check
    (empty: the device has no such setting, and its session compiles once). threads: whether
    INFERENCE_NUM_THREADS applies."""
    kind: str
    rollback: str
    properties: dict = field(default_factory=dict)
    precisions: dict = field(default_factory=dict)
    threads: bool = False
    kv_cache: str = ""  # the KV cache's element type unless one is asked for ("": the device's own, not settable)

    def precision_attempts(self, precision: str) -> list[str]:
        """The precisions to try for a request, the asked one first; [precision] where the device has none."""
        if not self.precisions:
            return [precision]
        return list(dict.fromkeys([precision, "f32"]))

    def precision_properties(self, precision: str, int4_group: Optional[int] = None,
                             kv_cache: Optional[str] = None) -> dict[str, str]:
        """The properties of a precision and a KV cache element type (None: the profile's). With "dq" on int4
        weights quantized in groups of g, the CPU quantizes the activations in groups of g too (its default is 32,
        slower on groups of 128)."""
        config = dict(self.precisions.get(precision, {}))
        if config and precision == "dq" and int4_group and int4_group > 0:
            config["DYNAMIC_QUANTIZATION_GROUP_SIZE"] = str(int4_group)
        if kv_cache or self.kv_cache:
            config["KV_CACHE_PRECISION"] = kv_cache or self.kv_cache
        return config


PROFILES = {
    "CPU": DeviceProfile("CPU", "paged", {"PERFORMANCE_HINT": "LATENCY"}, CPU_PRECISIONS, threads=True,
                         kv_cache="f16"),
    # an f16 KV cache: the GPU plugin may compress it to int8 per block, which rollbacks would not keep exact
    "GPU": DeviceProfile("GPU", "paged", {"PERFORMANCE_HINT": "LATENCY", "KV_CACHE_PRECISION": "f16"}, kv_cache="f16"),
    "NPU": DeviceProfile("NPU", "npuw"),
}


def profile(device: str) -> DeviceProfile:
    """The profile of a device name as OpenVINO spells it (CPU, GPU, GPU.1, NPU)."""
    kind = device.split(".")[0].upper()
    if kind not in PROFILES:
        raise DeviceError(f"unknown device {device!r}: use {DEVICE_CHOICES}.")
    return PROFILES[kind]


class DeviceError(EdgeSpecdecError):
    """A device was asked for that this machine does not have."""


@dataclass(frozen=True)
class DeviceInfo:
    name: str           # as OpenVINO spells it: CPU, GPU.0, GPU.1, NPU
    kind: str = ""      # for GPUs: "integrated" or "discrete"


@dataclass
class Placement:
    target: str
    draft: Optional[str]
    reasons: list[str] = field(default_factory=list)

    def describe(self) -> str:
        where = f"target on {self.target}" + (f", draft on {self.draft}" if self.draft else "")
        return where + (f" ({'; '.join(self.reasons)})" if self.reasons else "")


def list_devices(core) -> list[DeviceInfo]:
    """The devices OpenVINO sees, GPUs tagged integrated or discrete."""
    found = []
    for name in core.available_devices:
        kind = ""
        if name.startswith("GPU"):
            try:
                kind = "discrete" if "DISCRETE" in str(core.get_property(name, "DEVICE_TYPE")).upper() else "integrated"
            except RuntimeError:
                kind = "integrated"
        found.append(DeviceInfo(name, kind))
    return found


def _match(request: str, devices: list[DeviceInfo]) -> Optional[str]:
    """The present device a request names: "GPU" means the first GPU, "GPU.1" exactly that one."""
    names = [d.name for d in devices]
    if request in names:
        return request
    if request == "GPU":
        gpus = [n for n in names if n.startswith("GPU")]
        return gpus[0] if gpus else None
    if request == "GPU.0" and "GPU" in names:
        return "GPU"
    return None


def _automatic(role: str, devices: list[DeviceInfo], taken: Optional[str]) -> tuple[str, str]:
    """The design's choice for a role among the present devices, and why."""
    igpus = [d.name for d in devices if d.name.startswith("GPU") and d.kind != "discrete"]
    dgpus = [d.name for d in devices if d.name.startswith("GPU") and d.kind == "discrete"]
    npus = [d.name for d in devices if d.name.startswith("NPU")]
    if role == "target":
        if dgpus:
            return dgpus[0], "discrete GPU found"
        return "CPU", "no discrete GPU"
    for name, why in [(g, "integrated GPU found") for g in igpus] + [(n, "NPU found") for n in npus]:
        if name != taken:
            return name, why
    if dgpus and dgpus[0] != taken:
        return dgpus[0], "no iGPU or NPU, discrete GPU free"
    return "CPU", "no iGPU or NPU found, sharing the CPU"


def _validate(request: str) -> str:
    request = request.strip().upper()
    base = request.split(".")[0]
    if base not in ("CPU", "GPU", "NPU", "AUTO") or (request.count(".") and not request.split(".", 1)[1].isdigit()):
        raise DeviceError(f"unknown device {request!r}: use {DEVICE_CHOICES}.")
    return request


def place(devices: list[DeviceInfo], target: str = "AUTO", draft: Optional[str] = "AUTO",
          allow_fallback: bool = False) -> Placement:
    """Decide the devices. draft=None means the bundle has no draft model."""
    names = ", ".join(d.name for d in devices) or "none"
    placement = Placement("CPU", None)
    chosen: dict[str, str] = {}
    for role, request in (("target", target), ("draft", draft)):
        if request is None:
            continue
        request = _validate(request)
        if request == "AUTO":
            name, why = _automatic(role, devices, chosen.get("target"))
            placement.reasons.append(f"{role}: {why}")
        else:
            name = _match(request, devices)
            if name is None:
                if not allow_fallback:
                    raise DeviceError(f"{request} was asked for the {role}, but this machine has only: {names}. "
                                      f"Pick one of those, or pass --allow-fallback to fall back to the CPU.")
                name = "CPU"
                placement.reasons.append(f"{role}: {request} not found, fell back to CPU")
        chosen[role] = name
    placement.target = chosen["target"]
    placement.draft = chosen.get("draft")
    return placement


def draft_candidates(devices: list[DeviceInfo], target: str) -> list[str]:
    """The devices AUTO may put a draft on, in the design's order: integrated GPUs, NPUs, a discrete GPU the target
    leaves free, and the CPU."""
    igpus = [d.name for d in devices if d.name.startswith("GPU") and d.kind != "discrete"]
    npus = [d.name for d in devices if d.name.startswith("NPU")]
    dgpus = [d.name for d in devices if d.name.startswith("GPU") and d.kind == "discrete"]
    return [name for name in igpus + npus + dgpus if name != target] + ["CPU"]


def measure_draft_device(placement: Placement, devices: list[DeviceInfo], step_ms: Callable[[str], float],
                         plan) -> Placement:
    """AUTO's draft device, measured rather than assumed: a small draft can step slower on an NPU or iGPU than on
    the CPU (each call has a fixed cost there), and then speculation loses. Times one draft step on each
    candidate device (step_ms(device) -> milliseconds) and takes the fastest. The timings are kept in the
    measurement cache (per machine, OpenVINO version and bundle, see measurements.py), so that later processes
    decide without measuring; the placement line says which happened."""
    candidates = draft_candidates(devices, placement.target)
    if len(candidates) == 1:
        return placement
    name = "draft_device/" + ",".join(candidates)
    remembered = plan.known(name) is not None
    timings = plan.get(name, lambda: {device: round(step_ms(device), 2) for device in candidates})
    best = min(candidates, key=lambda device: timings[device])
    shown = ", ".join(f"{device} {timings[device]:.1f} ms" for device in candidates)
    how = "measured before on this machine" if remembered else "measured now"
    if best == "CPU":
        why = f"draft: kept on the CPU, where a step is fastest ({shown}; {how})"
    else:
        why = f"draft: {best}, where a step is fastest ({shown}; {how})"
    reasons = [r for r in placement.reasons if not r.startswith("draft:")] + [why]
    return Placement(placement.target, best, reasons)


def check_npu_weights(info: dict) -> None:
    """Refuse, before compiling, a model whose weights the NPU compiler does not take: asymmetric int4 has crashed
    it (openvinotoolkit/openvino#34450); OpenVINO's NPU guide asks for symmetric int4 or int8."""
    weights = info.get("weights") or {}
    if weights.get("format") == "int4" and not weights.get("sym"):
        raise DeviceError("the draft's weights are asymmetric int4, which the NPU compiler does not take: export the "
                          "draft with --draft-preset npu (symmetric int8), or put it on another device with "
                          "--draft-device CPU or GPU.")


def compile_config(device: str, cache_dir: Optional[Path], threads: Optional[int] = None) -> dict[str, Any]:
    """The OpenVINO properties for a model on a device (precision settings are added by the session)."""
    device_profile = profile(device)
    config: dict[str, Any] = dict(device_profile.properties)
    if threads and device_profile.threads:
        config["INFERENCE_NUM_THREADS"] = threads
    if cache_dir is not None:
        config["CACHE_DIR"] = str(cache_dir)
    return config


def resolve_cache_dir(cache_dir=None) -> Optional[Path]:
    """The compiled-model cache folder: the argument, else $EDGE_SPECDEC_CACHE_DIR, else the user cache; "off": none."""
    value = cache_dir if cache_dir is not None else os.environ.get("EDGE_SPECDEC_CACHE_DIR", DEFAULT_CACHE_DIR)
    if str(value).lower() in ("off", "none", ""):
        return None
    return Path(value).expanduser()
