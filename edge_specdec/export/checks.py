"""Checks that run before any conversion: can the installed optimum-intel and transformers export each source?

A model conversion takes minutes (110 s for a 1.5B target on a laptop), so an architecture that the installed
versions cannot export must be found before the first one starts, not when the second source's turn comes.

What decides support is optimum-intel's own registry, read from the installed packages:
- optimum's TasksManager holds, per model_type, the OpenVINO export configs registered by optimum-intel
  (optimum/exporters/openvino/model_configs.py, the @register_in_tasks_manager decorators). main_export()
  (optimum/exporters/openvino/__main__.py) refuses a model_type that is not in TasksManager._SUPPORTED_MODEL_TYPE,
  or that has no config for the task; edge-specdec always exports with the task "text-generation-with-past".
- Each export config class carries MIN_TRANSFORMERS_VERSION / MAX_TRANSFORMERS_VERSION. optimum-intel enforces
  them only once the model is loaded, in export() (optimum/exporters/openvino/convert.py): it raises ValueError
  when the installed transformers' base version is < MIN or > MAX. We apply the same rule up front.
On top of that, KNOWN_GOOD_TRANSFORMERS below records the transformers release to recommend for model types whose
range excludes the transformers the export extra installs (see its comments for where each range comes from).

A model that exports may still be one the runtime cannot decode exactly: runtime_problem() reads that from
config.json alone (recurrent layers, positions that switch with the length, attention-logit softcapping), for a
converted source, an OpenVINO IR folder and a bundle alike; docs/export.md#architectures-the-runtime-decodes.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Optional

from ..errors import ExportError, MissingDependencyError
from .sources import _HUB_ID
from .token_bytes import _walk

TASK = "text-generation-with-past"  # the task export_model() passes to optimum-intel's main_export()

# The transformers release to pin when a model type's range (from the registry) excludes the installed one.
# Ranges as read in optimum-intel 2.2.0, optimum/exporters/openvino/model_configs.py (class attributes, enforced
# by export() in optimum/exporters/openvino/convert.py); the pin is only used when it lies inside the range that
# the installed optimum-intel reports, so this table can never contradict the installed source.
KNOWN_GOOD_TRANSFORMERS: dict[str, tuple[str, str]] = {
    # GemmaOpenVINOConfig.MAX_TRANSFORMERS_VERSION = "5.0", inherited by Gemma2OpenVINOConfig and
    # Gemma3TextOpenVINOConfig. Tested: a Gemma-3-270M draft for Qwen2.5-Coder-1.5B exported with 4.57.6 (and
    # failed with 5.5.4).
    "gemma3_text": ("4.57.6", "tested with optimum-intel 2.2.0 (a Gemma-3-270M draft)"),
    # The same inherited cap (and GLMOpenVINOConfig.MAX_TRANSFORMERS_VERSION = "5.0"): not tested here; 4.57.6 is
    # the release optimum-intel 2.2.0 caps most other architectures at, rather than the untried 5.0.0.
    "gemma": ("4.57.6", "the release optimum-intel 2.2.0 caps most architectures at (untested here)"),
    "gemma2": ("4.57.6", "the release optimum-intel 2.2.0 caps most architectures at (untested here)"),
    "glm": ("4.57.6", "the release optimum-intel 2.2.0 caps most architectures at (untested here)"),
}


@dataclass(frozen=True)
class Architecture:
    """What a source says it is, read without loading or converting weights."""
    model_type: Optional[str]
    architectures: tuple[str, ...]
    origin: str                         # where it was read: "config.json", "GGUF header", ...
    config_dir: Optional[Path] = None   # a folder with config.json, for transformers' AutoConfig
    definitive: bool = True             # False for a GGUF header whose name may differ from transformers' model_type
    config: Optional[dict] = field(default=None, compare=False)  # config.json as read (None: a GGUF header)

    def describe(self) -> str:
        names = f" ({', '.join(self.architectures)})" if self.architectures else ""
        origin = f" (read from its {self.origin})" if self.origin != "config.json" else ""
        return f"{self.model_type}{names}{origin}"


@dataclass
class Problem:
    """One source that the installed versions cannot export, and the fix."""
    role: str
    given: str
    arch: Architecture
    reason: str
    fix: Optional[str] = None   # a pip command line
    why: list[str] = field(default_factory=list)
    runtime: bool = False       # the runtime cannot decode it exactly (no version fixes that), not a version problem

    def message(self) -> str:
        text = f"--{self.role} {self.given}: {self.arch.describe()} {self.reason}"
        if self.fix:
            text += f"\n  fix: {self.fix}"
        for line in self.why:
            text += f"\n  {line}"
        return text


def installed_version(dist: str) -> Optional[str]:
    """The installed version of a distribution, or None. The only place the checks learn versions from."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _base(version: str):
    from packaging.version import Version
    return Version(Version(version).base_version)


# ---------------------------------------------------------------------------------------------------------------
# Reading a source's architecture cheaply


def read_architecture(src: str, role: str) -> Optional[Architecture]:
    """The architecture of a source as given by the user, before it is downloaded or dequantized.

    A local folder: its config.json. A .gguf file: the general.architecture key of its header, mapped to the
    model_type transformers will give it. A hub id: its config.json alone (a small download), if the hub answers.
    None when it cannot be known yet (the checks then run on the resolved folder, still before any conversion).
    Problems with the source itself (missing files) are left to resolve_source(), which explains them."""
    path = Path(src).expanduser()
    if path.suffix.lower() == ".gguf":
        return _gguf_architecture(path) if path.is_file() else None
    if path.is_dir():
        return folder_architecture(path) if (path / "config.json").is_file() else None
    if path.exists() or not _HUB_ID.match(src) or src.startswith((".", "/", "~")):
        return None  # not a hub id: resolve_source() explains what is wrong with it
    return _hub_architecture(src)


def folder_architecture(folder: Path) -> Architecture:
    config = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
    return Architecture(config.get("model_type"), tuple(config.get("architectures") or ()), "config.json",
                        Path(folder), config=config)


def _hub_architecture(repo_id: str) -> Optional[Architecture]:
    try:
        from huggingface_hub import hf_hub_download
        return folder_architecture(Path(hf_hub_download(repo_id, "config.json")).parent)
    except Exception:  # offline, unknown repo, no huggingface_hub: resolve_source() says why, later
        return None


def gguf_model_type(architecture: str, name: str = "") -> str:
    """The model_type transformers gives a GGUF file's general.architecture.

    Mirrors load_gguf_checkpoint() in transformers/modeling_gguf_pytorch_utils.py (transformers 5.5): llama files
    named mistral load as mistral; qwen2moe/qwen3moe/minimax-m2 get underscores; gemma3 files hold only the text
    model and load as gemma3_text."""
    if "llama" in architecture and "mistral" in name.lower():
        return "mistral"
    renamed = {"qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe", "minimax-m2": "minimax_m2", "gemma3": "gemma3_text"}
    return renamed.get(architecture, architecture)


def _gguf_architecture(path: Path) -> Optional[Architecture]:
    try:
        from gguf import GGUFReader
        reader = GGUFReader(path)  # memory-mapped: reads the header and tensor table, not the weights
        fields = reader.fields

        def text(key: str) -> str:
            f = fields.get(key)
            return bytes(f.parts[f.data[0]]).decode("utf-8") if f is not None and f.data else ""
        arch = text("general.architecture")
        name = text("general.name")
    except Exception:  # no gguf package or an unreadable file: _from_gguf() reports it with its own words
        return None
    if not arch:
        return None
    return Architecture(gguf_model_type(arch, name), (), f"GGUF header (general.architecture = {arch})",
                        definitive=False)


# ---------------------------------------------------------------------------------------------------------------
# What the installed optimum-intel can export


def _tasks_manager():
    try:
        from optimum.exporters.tasks import TasksManager
        import optimum.exporters.openvino  # noqa: F401  - registers optimum-intel's OpenVINO export configs
    except ImportError as exc:
        raise MissingDependencyError(
            f"the export stage needs optimum-intel and transformers ({exc}). Install them with "
            "`pip install 'edge-specdec[export]'`.") from None
    return TasksManager


def supported_model_types() -> dict[str, tuple[Optional[str], Optional[str]]]:
    """Every model_type the installed optimum-intel exports for TASK, with its (MIN, MAX) transformers versions."""
    manager = _tasks_manager()
    out = {}
    for model_type, exporters in manager._SUPPORTED_MODEL_TYPE.items():
        constructor = exporters.get("openvino", {}).get(TASK)
        if constructor is not None:
            out[model_type] = _version_range(getattr(constructor, "func", constructor))
    return out


def _version_range(config: Any) -> tuple[Optional[str], Optional[str]]:
    """(MIN, MAX) transformers versions of an export config class or instance, as strings (None: unbounded)."""
    def text(value: Any) -> Optional[str]:
        if value is None:
            return None
        return getattr(value, "base_version", None) or str(value)
    return (text(getattr(config, "MIN_TRANSFORMERS_VERSION", None)),
            text(getattr(config, "MAX_TRANSFORMERS_VERSION", None)))


def _export_config_range(constructor: Any, arch: Architecture) -> tuple[Optional[str], Optional[str]]:
    """The range of the export config optimum-intel would build for this very model.

    Some configs change their bounds in __init__ from the model's config (e.g. LlamaOpenVINOConfig for Eagle3 VLM
    drafts sets MAX_TRANSFORMERS_VERSION = "4.57.6"), so build it from the source's config when transformers can
    read that; otherwise fall back to the class attributes."""
    if arch.config_dir is not None:
        try:
            from transformers import AutoConfig
            return _version_range(constructor(AutoConfig.from_pretrained(arch.config_dir)))
        except Exception:
            pass
    return _version_range(getattr(constructor, "func", constructor))


def _optimum_intel_transformers_spec():
    """The transformers versions the installed optimum-intel itself declares (its package requirements)."""
    from packaging.requirements import Requirement
    try:
        for line in metadata.requires("optimum-intel") or []:
            req = Requirement(line)
            if req.name == "transformers" and req.marker is None:
                return req.specifier
    except (metadata.PackageNotFoundError, ValueError):
        pass
    return None


def _pin(version: str) -> str:
    """A requirement for one release: "5.0" -> "==5.0.0", optimum-intel's "5.10.99" (any 5.10.x) -> "==5.10.*"."""
    parts = version.split(".")
    if len(parts) == 3 and parts[2] == "99":
        return f"=={parts[0]}.{parts[1]}.*"
    while len(parts) < 3:
        parts.append("0")
    return "==" + ".".join(parts)


def _in_range(version: str, lo: Optional[str], hi: Optional[str]) -> bool:
    v = _base(version)
    return not ((lo is not None and v < _base(lo)) or (hi is not None and v > _base(hi)))


def _version_fix(model_type: str, lo: Optional[str], hi: Optional[str]) -> tuple[Optional[str], list[str]]:
    """The pip command that puts transformers inside [lo, hi], and notes; (None, notes) when none can.

    A release is proposed only if the installed optimum-intel's own requirement on transformers allows it too."""
    oi = installed_version("optimum-intel")
    spec = _optimum_intel_transformers_spec()

    def allowed(release: str) -> bool:
        return spec is None or spec.contains(release.replace("*", "0"), prereleases=True)

    other_release = (f"{model_type} needs another optimum-intel release, which edge-specdec has not been "
                     "tested with.")
    if lo is not None and hi is not None and _base(lo) > _base(hi):
        return None, [f"optimum-intel {oi} allows no transformers release for {model_type} (it asks for >= {lo} "
                      f"and <= {hi}), so no transformers version fixes it: {other_release}"]
    known = KNOWN_GOOD_TRANSFORMERS.get(model_type)
    if known and _in_range(known[0], lo, hi) and allowed(known[0]):
        return f'pip install "transformers=={known[0]}"', [f"transformers {known[0]}: {known[1]}."]
    if hi is not None:
        pin = _pin(hi)
        if allowed(pin[2:]):
            return f'pip install "transformers{pin}"', [f"transformers {pin[2:]}: the newest release optimum-intel "
                                                        f"{oi} allows for {model_type}."]
    elif lo is not None and allowed(_pin(lo)[2:]):
        return f'pip install "transformers>={lo}"', []
    return None, [f"optimum-intel {oi} itself requires transformers {spec}, which excludes the versions "
                  f"{model_type} needs: {other_release}"]


def check_architecture(arch: Architecture, role: str, given: str,
                       supported: Optional[dict[str, tuple[Optional[str], Optional[str]]]] = None) -> Optional[Problem]:
    """None if the installed optimum-intel and transformers can export this architecture, else the Problem."""
    manager = _tasks_manager()
    transformers_v = installed_version("transformers") or "(not installed)"
    oi = installed_version("optimum-intel") or "(not installed)"
    model_type = arch.model_type
    if not model_type:
        return Problem(role, given, arch, f"has no model_type in its {arch.origin}, so optimum-intel cannot tell "
                       "which architecture to export.",
                       why=["Add the model_type of its architecture to config.json (e.g. \"llama\")."])
    if arch.config is not None:  # first: no transformers release would make such a model usable
        refusal = runtime_problem(arch.config)
        if refusal is not None:
            return Problem(role, given, arch, refusal, runtime=True)
    registry = manager._SUPPORTED_MODEL_TYPE  # the membership test main_export() itself makes
    constructors = registry.get(model_type, {}).get("openvino", {})
    if TASK not in constructors:
        if not arch.definitive:
            return None  # a GGUF name that may not be transformers' model_type: checked again once resolved
        if constructors:
            reason = (f"is exported by optimum-intel {oi} only for the tasks {', '.join(sorted(constructors))}, "
                      f"not for {TASK} (a text decoder with a KV cache), which edge-specdec needs.")
        else:
            reason = (f"is not an architecture that optimum-intel {oi} can export to OpenVINO (no OpenVINO export "
                      f"config for the model type {model_type!r}).")
        return Problem(role, given, arch, reason,
                       why=["Choose a model of a supported architecture; docs/export.md lists them "
                            "(`python -m edge_specdec.export.checks` prints the installed list)."])
    lo, hi = _export_config_range(constructors[TASK], arch)
    problem = None
    if transformers_v == "(not installed)" or not _in_range(transformers_v, lo, hi):
        bounds = " and ".join(b for b in (f">= {lo}" if lo else "", f"<= {hi}" if hi else "") if b)
        fix, why = _version_fix(model_type, lo, hi)
        problem = Problem(role, given, arch,
                          f"cannot be exported with the installed versions: optimum-intel {oi} exports "
                          f"{model_type} only with transformers {bounds}, and transformers {transformers_v} is "
                          "installed.", fix, why)
        problem.why.append(f"(optimum-intel's rule: {type_name(constructors[TASK])}.MIN/MAX_TRANSFORMERS_VERSION, "
                           "enforced by export() in optimum/exporters/openvino/convert.py after the model is "
                           "loaded.)")
        return problem
    try:
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    except ImportError:  # pragma: no cover - transformers is checked above
        CONFIG_MAPPING_NAMES = {}
    if CONFIG_MAPPING_NAMES and model_type not in CONFIG_MAPPING_NAMES and arch.definitive:
        fix, why = _version_fix(model_type, lo, hi)
        return Problem(role, given, arch, f"is not known to the installed transformers {transformers_v}, so it "
                       "cannot load the model.", fix, why)
    return None


def type_name(constructor: Any) -> str:
    return getattr(getattr(constructor, "func", constructor), "__name__", str(constructor))


def raise_problems(problems: list[Problem], written_nothing: bool = True) -> None:
    """One ExportError listing every source that cannot be exported, with its fix: a source the runtime cannot
    decode exactly on a line of its own, then those the installed versions cannot export."""
    if not problems:
        return
    last = "Nothing was converted or written." if written_nothing else "Nothing was converted."
    lines = [p.message() for p in problems if p.runtime]
    versions = [p for p in problems if not p.runtime]
    if versions:
        if any(p.fix for p in versions):
            last = "Run the command, then the export again. " + last
        text = "\n".join(p.message() for p in versions)
        lines.append(f"the installed optimum-intel {installed_version('optimum-intel')} / transformers "
                     f"{installed_version('transformers')} cannot export "
                     f"{'this source' if len(versions) == 1 else 'these sources'}:\n{text}")
    raise ExportError("\n".join(lines) + (" " if not versions and len(lines) == 1 else "\n") + last)


def check_sources(sources: dict[str, Optional[str]], say: Callable[[str], None]) -> dict[str, Architecture]:
    """Check every source whose architecture can be read without downloading or converting weights.

    Raises one ExportError naming every bad source; returns the architectures that were checked (by role)."""
    archs = {role: read_architecture(given, role) for role, given in sources.items() if given}
    archs = {role: arch for role, arch in archs.items() if arch is not None}
    checked: dict[str, Architecture] = {}
    problems = []
    if archs:  # sources that cannot be read are left to resolve_source(), which explains what is wrong
        say("reading optimum-intel's registry of OpenVINO exports (imports optimum-intel, torch and transformers)")
        _tasks_manager()
    for role, arch in archs.items():
        say(f"[{role}] checking {arch.describe()} against optimum-intel "
            f"{installed_version('optimum-intel')} and transformers {installed_version('transformers')}")
        problem = check_architecture(arch, role, sources[role])
        if problem is not None:
            problems.append(problem)
        elif arch.definitive:
            checked[role] = arch
    raise_problems(problems)
    return checked


# ---------------------------------------------------------------------------------------------------------------
# What the runtime can decode exactly, read from config.json alone (no transformers: IR folders and bundles too).
#
# The runtime keeps a model's past as a paged KV cache and rolls a rejected draft back by shortening its past
# length (runtime/session.py), and it verifies a block of tokens in one call whose logits must be the bits of single
# steps. So it can decode a model only if every layer's state is a KV cache (one entry per position), and if a
# position's arithmetic does not depend on how many tokens the call holds.

# Layer kinds that keep a KV cache, as transformers names them in layer_types (layers_block_type, block_types).
# sliding_attention is kept: OpenVINO's paged-attention transformation carries each layer's window into its
# PagedAttention op (tests/test_architectures.py compares windowed Mistral, Qwen2, Phi-3 and StarCoder2 with
# transformers).
ATTENTION_LAYERS = frozenset({"attention", "full_attention", "sliding_attention"})
STATELESS_LAYERS = frozenset({"mlp", "moe"})  # Nemotron-H's feed-forward blocks: no state at all
LAYER_KIND_KEYS = ("layer_types", "layers_block_type", "block_types")
# Model types with recurrent layers (state-space/Mamba, gated-delta or lightning linear attention, short
# convolutions, RWKV and xLSTM cells), as transformers' configs give them when config.json does not list its layers;
# the value says what to use instead. A config.json that lists only attention layers is admitted (Granite 4 micro is
# a granitemoehybrid of attention layers alone).
RECURRENT_MODEL_TYPES = {
    **dict.fromkeys(("qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"),
                    "a Qwen3 model (qwen3, qwen3_moe), whose layers are all attention"),
    **dict.fromkeys(("lfm2", "lfm2_moe"), "a model with attention layers only"),
    "granitemoehybrid": "a Granite model with attention layers only (Granite 3, or Granite 4 micro)",
    **dict.fromkeys(("mamba", "mamba2", "falcon_mamba", "falcon_h1", "jamba", "bamba", "zamba", "zamba2",
                     "nemotron_h", "recurrent_gemma", "rwkv", "xlstm", "minimax", "olmo_hybrid"),
                    "a model with attention layers only"),
}
# rope types whose frequencies transformers recomputes from the sequence length inside the forward pass
# (modeling_rope_utils.dynamic_rope_update). longrope ("su" in older Phi-3 configs) switches from its short factors
# to its long ones once a call's last position passes original_max_position_embeddings, and optimum-intel exports
# that switch into the graph (its _longrope_forward: max(position_ids) + 1 > original_max), so a verified block that
# crosses it computes other logits than single steps would, and the keys already cached keep the short factors.
# "dynamic" NTK is not here: it changes nothing up to max_position_embeddings, which the runtime's context never
# passes, and the export traces that static form. yarn, linear, llama3 and proportional are static.
SWITCHING_ROPE = ("longrope", "su")


def runtime_problem(config: dict[str, Any]) -> Optional[str]:
    """Why the runtime cannot decode a model with this config.json exactly, and what to use instead, in one line;
    None when it can."""
    model_type = config.get("model_type")
    kinds = next((config[key] for key in LAYER_KIND_KEYS if isinstance(config.get(key), list)), None)
    pattern = config.get("hybrid_override_pattern")  # Nemotron-H: M a Mamba layer, * attention, - MLP, E MoE
    if kinds is None and isinstance(pattern, str):
        kinds = [{"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}.get(c, c) for c in pattern]
    kinds = [str(k) for k in kinds] if kinds else None
    # attention of another pattern (Llama 4's chunked_attention): a KV cache, but a mask not proven kept
    unknown = sorted({k for k in kinds if "attention" in k and "linear" not in k} - ATTENTION_LAYERS) if kinds else []
    other = sorted(set(kinds) - ATTENTION_LAYERS - STATELESS_LAYERS - set(unknown)) if kinds else []
    if other or (model_type in RECURRENT_MODEL_TYPES and not kinds):
        instead = RECURRENT_MODEL_TYPES.get(model_type, "a model with attention layers only")
        count = sum(k in other for k in kinds) if kinds else 0
        layers = (f"{count} of its {len(kinds)} layers {'is' if count == 1 else 'are'} {', '.join(other)}"
                  if count else f"state-space or recurrent layers, as transformers builds a {model_type} model")
        return (f"has recurrent layers ({layers}): their state is overwritten token by token, so it cannot be rolled "
                "back to the accepted length as the runtime shortens a KV cache after a rejected draft token. "
                f"Use {instead}.")
    if unknown:
        return (f"has layers of another attention kind ({', '.join(unknown)}), whose mask the runtime's paged "
                "attention is not known to keep (it keeps full and sliding-window attention). Use a model whose "
                "layers are full_attention or sliding_attention.")
    for rope in _rope_specs(config):
        kind = rope.get("rope_type") or rope.get("type")
        original = rope.get("original_max_position_embeddings") or config.get("original_max_position_embeddings")
        context = config.get("max_position_embeddings")
        if kind in SWITCHING_ROPE and original and context and context > original:
            return (f"uses {kind} rope scaling, whose frequencies switch from its short factors to its long ones "
                    f"once a sequence passes {original} tokens (original_max_position_embeddings; the context is "
                    f"{context}): a verified block that crosses the switch would compute other logits than single "
                    "steps. Use a variant without longrope (Phi-3: a 4k model such as "
                    "microsoft/Phi-3-mini-4k-instruct) or another model.")
    softcap = config.get("attn_logit_softcapping")
    if softcap:
        return (f"caps its attention logits (attn_logit_softcapping = {softcap}), which OpenVINO's PagedAttention, "
                "the attention the runtime decodes and rolls back with, does not do: the output would not be the "
                "model's. Use a model without it (Gemma 3 instead of Gemma 2).")
    return None


def _rope_specs(config: dict[str, Any]) -> list[dict[str, Any]]:
    """The rope settings in config.json: rope_scaling (transformers 4) and rope_parameters (transformers 5), each
    either one setting or one per layer kind (Gemma 3: sliding_attention and full_attention)."""
    specs = []
    for key in ("rope_scaling", "rope_parameters"):
        value = config.get(key)
        if isinstance(value, dict):
            nested = [v for v in value.values() if isinstance(v, dict)]
            specs += nested if nested and not ("rope_type" in value or "type" in value) else [value]
    return specs


# ---------------------------------------------------------------------------------------------------------------
# Tokenizer hints: a tokenizer is checked by converting it (seconds) and comparing it with the Hugging Face one;
# these hints only explain a failure of that check by what is known to differ in openvino-tokenizers.


def tokenizer_hints(folder: Path) -> list[str]:
    """Parts of tokenizer.json known to be converted wrongly, or not at all, by openvino-tokenizers 2026.4."""
    path = Path(folder) / "tokenizer.json"
    try:
        spec = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    hints = []
    for node in _walk(spec.get("pre_tokenizer")):
        kind = node.get("type")
        if kind == "Metaspace" and node.get("split", True) and node.get("prepend_scheme") != "first":
            hints.append("its Metaspace pre-tokenizer has split=True: openvino-tokenizers splits runs of spaces "
                         "differently from Hugging Face (measured with openvino-tokenizers 2026.4)")
        if kind == "Metaspace" and node.get("prepend_scheme") == "first":
            hints.append("its Metaspace pre-tokenizer has prepend_scheme='first', which openvino-tokenizers 2026.4 "
                         "fails to convert")
        if kind in ("UnicodeScripts", "CharDelimiterSplit"):
            hints.append(f"its {kind} pre-tokenizer is not supported by openvino-tokenizers")
    return hints


def _print_supported() -> None:  # pragma: no cover - a helper for docs/export.md
    transformers_v = installed_version("transformers")
    print(f"optimum-intel {installed_version('optimum-intel')}, transformers {transformers_v}: "
          f"model types exported for {TASK}")
    for model_type, (lo, hi) in sorted(supported_model_types().items()):
        ok = transformers_v is not None and _in_range(transformers_v, lo, hi)
        fix = "" if ok else "  needs: " + (_version_fix(model_type, lo, hi)[0] or "another optimum-intel")
        if model_type in RECURRENT_MODEL_TYPES:
            fix = "  refused by the runtime: recurrent layers" + (" (unless all are attention)"
                                                                if model_type == "granitemoehybrid" else "")
        print(f"  {model_type:28} transformers >= {lo or '-':8} <= {hi or '-':10}{fix}")


if __name__ == "__main__":  # pragma: no cover
    _print_supported()
