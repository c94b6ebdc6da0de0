"""The export stage: a (target, draft) pair of models -> one self-contained OpenVINO bundle.

    from edge_specdec.export import export_bundle, WeightSettings
    export_bundle("Qwen/Qwen2.5-Coder-1.5B-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct", "bundles/qwen-smol",
                  target_weights=WeightSettings("int4"), draft_weights=WeightSettings("int8"))

A source is a Hugging Face model (a folder, a hub id or a .gguf file), converted and compressed here, or an OpenVINO
IR folder (or a hub id of one) whose model goes into the bundle as it is (ir_source.py). Converting needs the export
extra (optimum-intel, nncf, torch, transformers): pip install 'edge-specdec[export]'; IR sources alone need none of
it, and their export imports neither torch nor transformers (a hub id of an IR repository needs huggingface_hub alone:
pip install 'edge-specdec[hub]').
"""
from __future__ import annotations

import dataclasses
import json
import os
import platform
import shutil
import tempfile
import time
import uuid
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Optional

from .. import __version__
from ..bundle import FORMAT_NAME, MANIFEST_FILE, MANIFEST_VERSION, VOCAB_MAP_FILE, file_records, read_manifest
from ..errors import BundleError, EdgeSpecdecError, ExportError
from ..vocab_map import NO_TOKEN, VocabMap, build_vocab_map
from .checks import check_architecture, check_sources, folder_architecture, raise_problems
from .convert import PARITY_STRINGS, WeightSettings, export_model, export_tokenizer, quiet_libraries
from .ir_source import IRModel, check_ir_weights, copy_ir_model, inspect_ir_folder, ir_tokenizer
from .sources import (ResolvedSource, count_parameters, hub_client, is_hub_id, is_ir_source, optional_json,
                      resolve_source)
from .token_bytes import TokenTable, token_table

__all__ = ["export_bundle", "check_export", "WeightSettings"]

_TOOLS = ("openvino", "openvino-tokenizers", "optimum-intel", "optimum", "nncf", "transformers", "torch",
          "tokenizers", "numpy")


DEFAULT_WEIGHTS = {"target": WeightSettings("int4"), "draft": WeightSettings("int8")}


def export_bundle(target: str, draft: Optional[str], out: str | Path, *,
                  target_weights: Optional[WeightSettings] = None,
                  draft_weights: Optional[WeightSettings] = None,
                  force: bool = False, allow_larger_draft: bool = False,
                  generation_defaults: Optional[dict[str, Any]] = None,
                  progress: Optional[Callable[[str], None]] = None) -> Path:
    """Export target (and draft, unless None) into the bundle folder `out`; return its path.

    generation_defaults: GenerationConfig fields (name -> value) recorded in the manifest as the bundle's defaults,
    which a request's unset fields then take (`edge-specdec info` shows them). None records none: a Hugging Face
    generation_config.json is not inherited, since its sampling settings would silently change every greedy run.

    Weights: None takes the default (int4 target, int8 draft) for a model that is converted here; an OpenVINO IR
    source keeps its own weights, and weight settings given for it must match them.
    Every check runs before the first model conversion (see check_export): a source that the installed
    optimum-intel / transformers cannot export, an IR folder that is not a stateful LLM, or a tokenizer that
    openvino-tokenizers cannot reproduce, fails in seconds, not after the other source's conversion. The bundle is
    written into a temporary folder beside `out` and renamed into place only when complete, so a failed or
    interrupted export leaves no half bundle and never damages an existing one.
    """
    say = _with_elapsed(progress)
    out = Path(out).expanduser().absolute()
    _check_output(out, force)
    generation_defaults = check_generation_defaults(generation_defaults or {})
    sources = {"target": target, "draft": draft}
    given = {"target": target_weights, "draft": draft_weights}
    settings, irs, checked, quiet = _check_before_writing(sources, given, say)

    token = uuid.uuid4().hex[:8]
    partial = out.parent / f".{out.name}.partial-{token}"
    scratch = out.parent / f".{out.name}.scratch-{token}"
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        partial.mkdir()
        scratch.mkdir()
        with quiet():
            resolved, params = _resolve_and_check(sources, checked, partial, scratch, allow_larger_draft, say,
                                                  irs, given)
            entries, tables = {}, {}
            for role in resolved:
                src = resolved[role]
                tables[role] = token_table(src.folder)
                if src.is_ir:  # the model as it is: no conversion, no compression
                    say(f"[{role}] copying the OpenVINO IR {src.given} as it is, weights {irs[role].weight_format} "
                        f"({params[role] / 1e6:.1f}M parameters)")
                    copy_ir_model(src.folder, partial / role)
                    entries[role] = _model_entry(src, partial / role, None, irs[role].weights, params[role],
                                                 tables[role])
                    continue
                say(f"[{role}] converting {src.given} to OpenVINO IR, weights {settings[role].format} "
                    f"({params[role] / 1e6:.1f}M parameters)")
                role_scratch = scratch / role
                role_scratch.mkdir()
                stats = export_model(src.folder, partial / role, settings[role], role_scratch, say)
                shutil.rmtree(role_scratch, ignore_errors=True)
                entries[role] = _model_entry(src, partial / role, settings[role], stats, params[role], tables[role])
        say("computing the vocabulary map")
        vocabulary = _write_vocab_map(partial, entries, tables)
        manifest = {
            "format": FORMAT_NAME,
            "manifest_version": MANIFEST_VERSION,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "tool_versions": _tool_versions(),
            "platform": {"python": platform.python_version(), "machine": platform.machine()},
            "target": entries["target"],
            "draft": entries.get("draft"),
            "vocabulary": vocabulary,
            **({"generation_defaults": generation_defaults} if generation_defaults else {}),
        }
        say("hashing files")
        manifest["files"] = file_records(partial)
        (partial / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n",
                                             encoding="utf-8")
        _move_into_place(partial, out)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    say(f"bundle written to {out}")
    return out


def check_generation_defaults(defaults: dict[str, Any]) -> dict[str, Any]:
    """The defaults as given, once GenerationConfig accepts them: known field names, values it validates, and
    JSON-ready (a manifest holds them); an ExportError names the one it refuses."""
    from ..runtime.sampling import GenerationConfig

    names = {f.name for f in dataclasses.fields(GenerationConfig)} - {"constraint", "eos_token_ids"}
    for name, value in defaults.items():
        if name not in names:
            raise ExportError(f"--generation-default {name}: no such setting; choose from {', '.join(sorted(names))}.")
        try:
            json.dumps(value)
        except TypeError:
            raise ExportError(f"--generation-default {name}: {value!r} cannot be written to the manifest.") from None
    try:
        GenerationConfig(**defaults).validate()
    except EdgeSpecdecError as exc:
        raise ExportError(f"--generation-default: {exc}") from None
    return dict(defaults)


def check_export(target: str, draft: Optional[str], out: Optional[str | Path] = None, *,
                 target_weights: Optional[WeightSettings] = None,
                 draft_weights: Optional[WeightSettings] = None,
                 force: bool = False, allow_larger_draft: bool = False,
                 progress: Optional[Callable[[str], None]] = None) -> dict[str, dict[str, Any]]:
    """Run every check export_bundle() runs before converting a model, and convert nothing; return a summary.

    Checks: the --out folder (if given) and the weight settings; each source's architecture against the installed
    optimum-intel and transformers, or an IR folder's state, inputs and tokenizer; the larger-draft guard; each
    tokenizer converted by openvino-tokenizers and compared with the Hugging Face tokenizer. Work files (a
    dequantized .gguf, the trial tokenizer IRs) go to a temporary folder that is removed; nothing is written beside
    `out`. Raises ExportError on the first failure.
    """
    say = _with_elapsed(progress)
    if out is not None:
        _check_output(Path(out).expanduser().absolute(), force)
    sources = {"target": target, "draft": draft}
    given = {"target": target_weights, "draft": draft_weights}
    settings, irs, checked, quiet = _check_before_writing(sources, given, say)
    with tempfile.TemporaryDirectory(prefix="edge-specdec-check-") as tmp:
        partial, scratch = Path(tmp) / "bundle", Path(tmp) / "scratch"
        partial.mkdir()
        scratch.mkdir()
        with quiet():
            resolved, params = _resolve_and_check(sources, checked, partial, scratch, allow_larger_draft, say,
                                                  irs, given)
    say("all checks passed: the export would now convert the models"
        if any(value is not None for value in settings.values()) else
        "all checks passed: the export would now copy the models")
    summary = {}
    for role, src in resolved.items():
        config = optional_json(src.folder / "config.json") or {}
        summary[role] = {
            "source": src.describe(), "source_kind": src.source_kind, "model_type": config.get("model_type"),
            "architectures": list(config.get("architectures") or []), "num_parameters": params[role],
            "weights": irs[role].weight_format if src.is_ir else settings[role].format,
            "tokenizer": (f"converted by openvino-tokenizers, same ids as Hugging Face on {len(PARITY_STRINGS)} "
                          "strings") if not src.is_ir else irs[role].tokenizer_how}
    return summary


def _check_before_writing(sources: dict[str, Optional[str]], given: dict[str, Optional[WeightSettings]],
                          say: Callable[[str], None]):
    """The checks that write nothing at all: each local IR folder (a stateful LLM, its inputs, its tokenizer, the
    weight options given for it), the weight settings of the models converted here, and their architectures against
    the installed optimum-intel (config.json and GGUF headers only). Returns the settings per role (None for an IR),
    the inspected IRs, the checked architectures, and the quiet_libraries() context for the rest of the export: it
    leaves transformers unimported when every source is an IR."""
    ir_roles = _ir_roles(sources)
    irs = _inspect_local_irs(sources, ir_roles, given, say)
    settings = _weight_settings(sources, ir_roles, given)

    def quiet():
        return quiet_libraries(transformers_too=len(ir_roles) < len(settings))
    with quiet():
        checked = check_sources(_converted(sources, ir_roles), say)
    return settings, irs, checked, quiet


def _ir_roles(sources: dict[str, Optional[str]]) -> set[str]:
    """The roles whose source is an OpenVINO IR (a local IR folder, or a hub id of one). A hub id without
    huggingface_hub installed is refused here, naming the extra that brings it."""
    for role, src in sources.items():
        if src and not Path(src).expanduser().exists() and is_hub_id(src):
            hub_client(src, role)
    return {role for role, src in sources.items() if src and is_ir_source(src)}


def _converted(sources: dict[str, Optional[str]], ir_roles: set[str]) -> dict[str, Optional[str]]:
    """The sources that are converted with optimum-intel: all but the IR ones."""
    return {role: (None if role in ir_roles else src) for role, src in sources.items()}


def _inspect_local_irs(sources: dict[str, Optional[str]], ir_roles: set[str],
                       given: dict[str, Optional[WeightSettings]], say: Callable[[str], None]) -> dict[str, IRModel]:
    """Check every local IR folder (a stateful LLM with the runtime's inputs and a tokenizer) and the weight options
    given for it, before anything is written; a hub IR is checked once downloaded (_resolve_and_check)."""
    irs = {}
    for role in sorted(ir_roles, key=("target", "draft").index):
        folder = Path(sources[role]).expanduser()
        if folder.is_dir():
            say(f"[{role}] checking the OpenVINO IR in {sources[role]}: state, inputs, tokenizer, weights")
            irs[role] = inspect_ir_folder(folder, role, sources[role])
            check_ir_weights(given[role], irs[role], role, sources[role])
    return irs


def _weight_settings(sources: dict[str, Optional[str]], ir_roles: set[str],
                     given: dict[str, Optional[WeightSettings]]) -> dict[str, Optional[WeightSettings]]:
    """Per role: the validated settings of a model converted here (the given ones, else the default); None for an IR
    source, which keeps its weights."""
    return {role: None if role in ir_roles else (given[role] or DEFAULT_WEIGHTS[role]).validate(role)
            for role, src in sources.items() if src}


def _resolve_and_check(sources: dict[str, Optional[str]], checked: dict[str, Any], partial: Path, scratch: Path,
                       allow_larger_draft: bool, say: Callable[[str], None], irs: dict[str, IRModel],
                       given: dict[str, Optional[WeightSettings]]) -> tuple[dict[str, ResolvedSource], dict[str, int]]:
    """Resolve the sources to local folders and run every check that needs them, before any model conversion.

    - the architecture of a source not checked from its config.json before (a hub id whose config could not be
      fetched alone, a .gguf file once transformers has read it); an IR downloaded from the hub is inspected as a
      local one was (added to `irs`);
    - the draft is not the larger model (unless allowed);
    - each tokenizer is converted by openvino-tokenizers into partial/ROLE and compared with the Hugging Face
      tokenizer (seconds), so that a tokenizer openvino-tokenizers cannot reproduce stops the export before the
      minutes a model conversion takes; an IR folder's own converted tokenizer is taken once it agrees with its
      tokenizer.json. The tokenizer IRs are the bundle's.
    """
    resolved = {role: resolve_source(src, scratch, role, say) for role, src in sources.items() if src}
    for role, src in resolved.items():
        if src.is_ir and role not in irs:
            say(f"[{role}] checking the OpenVINO IR downloaded for {src.given}: state, inputs, tokenizer, weights")
            irs[role] = inspect_ir_folder(src.folder, role, src.given)
            check_ir_weights(given[role], irs[role], role, src.given)
    problems = []
    for role, src in resolved.items():
        if role not in checked and not src.is_ir:
            arch = folder_architecture(src.folder)
            say(f"[{role}] checking {arch.describe()} from its config.json")
            problem = check_architecture(arch, role, src.given)
            if problem is not None:
                problems.append(problem)
    raise_problems(problems, written_nothing=False)
    params = {role: irs[role].num_parameters if r.is_ir else count_parameters(r.folder) for role, r in resolved.items()}
    if "draft" in params and params["draft"] > params["target"] and not allow_larger_draft:
        raise ExportError(
            f"the draft ({params['draft'] / 1e6:.1f}M parameters) is larger than the target "
            f"({params['target'] / 1e6:.1f}M): did you swap --target and --draft? The target is the large model "
            "whose output you want; the draft is the small, fast one. Pass --allow-larger-draft to export anyway.")
    for role, src in resolved.items():
        (partial / role).mkdir(exist_ok=True)
        if src.is_ir:
            say(f"[{role}] checking the IR folder's converted tokenizer against its tokenizer.json")
            irs[role] = irs[role].with_tokenizer(ir_tokenizer(src.folder, partial / role, src.given, say))
            continue
        say(f"[{role}] converting the tokenizer with openvino-tokenizers and comparing it with Hugging Face's")
        export_tokenizer(src.folder, partial / role, src.given)
    return resolved, params


def _with_elapsed(progress: Optional[Callable[[str], None]]) -> Callable[[str], None]:
    """progress, each message prefixed with the seconds since the export began (None: no messages)."""
    start = time.monotonic()

    def say(message: str) -> None:
        if progress is not None:
            progress(f"[{time.monotonic() - start:6.1f}s] {message}")
    return say


def _check_output(out: Path, force: bool) -> None:
    if not out.exists():
        if out.parent.exists() and not os.access(out.parent, os.W_OK):
            raise ExportError(f"cannot write into {out.parent}: permission denied. Choose another --out.")
        return
    if not out.is_dir():
        raise ExportError(f"--out {out} is an existing file. Choose a folder path for the bundle.")
    is_empty = not any(out.iterdir())
    if is_empty:
        return
    try:
        read_manifest(out)
        is_bundle = True
    except BundleError:
        is_bundle = False
    if not is_bundle:
        raise ExportError(f"--out {out} is a folder with other content, not an edge-specdec bundle: refusing to "
                          "replace it, even with --force. Choose a new or empty folder.")
    if not force:
        raise ExportError(f"--out {out} already holds a bundle. Pass --force to replace it (the old bundle is kept "
                          "until the new one is complete), or choose another folder.")


def _move_into_place(partial: Path, out: Path) -> None:
    old = None
    if out.exists():
        old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
        out.rename(old)
    try:
        partial.rename(out)
    except BaseException:
        if old is not None:
            old.rename(out)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _special_tokens(source: Path) -> dict[str, Any]:
    """BOS/EOS/PAD/UNK of one side, and every EOS id generation should stop at."""
    tcfg = optional_json(source / "tokenizer_config.json") or {}
    gcfg = optional_json(source / "generation_config.json") or {}
    mcfg = optional_json(source / "config.json") or {}  # an IR folder may come without one
    spec = json.loads((source / "tokenizer.json").read_text(encoding="utf-8"))
    by_content = {t["content"]: t["id"] for t in spec.get("added_tokens", [])}
    vocab = spec.get("model", {}).get("vocab")
    if isinstance(vocab, dict):
        by_content = {**vocab, **by_content}
    out: dict[str, Any] = {}
    for name in ("bos", "eos", "pad", "unk"):
        value = tcfg.get(f"{name}_token")
        if isinstance(value, dict):
            value = value.get("content")
        out[f"{name}_token"] = value
        out[f"{name}_token_id"] = by_content.get(value) if value is not None else None
    eos_ids = []
    for candidate in (out["eos_token_id"], gcfg.get("eos_token_id"), mcfg.get("eos_token_id")):
        for i in candidate if isinstance(candidate, list) else [candidate]:
            if isinstance(i, int) and i not in eos_ids:
                eos_ids.append(i)
    out["eos_token_ids"] = eos_ids
    return out


def _model_entry(src: ResolvedSource, folder: Path, settings: Optional[WeightSettings], stats: dict[str, Any],
                 params: int, table: TokenTable) -> dict[str, Any]:
    """The manifest's record of one side. settings: how the weights were compressed here, or None for an IR source,
    whose `stats` are then the whole weights record (the format read from the IR, NNCF's record, the element types)."""
    import openvino as ov

    config = optional_json(src.folder / "config.json") or {}
    model = ov.Core().read_model(folder / "openvino_model.xml")
    logits_size = model.output("logits").get_partial_shape()[2].get_length()
    return {
        "source": src.describe(),
        "source_kind": src.source_kind,
        "architecture": (config.get("architectures") or [config.get("model_type")])[0],
        "model_type": config.get("model_type"),
        "num_parameters": params,
        "max_position_embeddings": config.get("max_position_embeddings") or config.get("n_positions"),
        "weights": {**settings.to_manifest(), **stats} if settings is not None else dict(stats),
        "logits_size": logits_size,
        "tokenizer_size": len(table),
        "tokenizer_style": table.style,
        "special_tokens": _special_tokens(src.folder),
        "inputs": [i.get_any_name() for i in model.inputs],
        "size_bytes": sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()),
    }


def _write_vocab_map(partial: Path, entries: dict[str, Any], tables: dict[str, TokenTable]) -> dict[str, Any]:
    target = tables["target"]
    draft = tables.get("draft", target)
    t_entry = entries["target"]
    d_entry = entries.get("draft", t_entry)
    vmap = build_vocab_map(target.pieces, target.byte_fallback, t_entry["logits_size"],
                           t_entry["special_tokens"]["eos_token_id"],
                           draft.pieces, draft.byte_fallback, d_entry["logits_size"],
                           d_entry["special_tokens"]["eos_token_id"])
    vmap.save(partial / VOCAB_MAP_FILE)
    if "draft" not in tables:
        relation = "target-only"
    else:
        relation = "identical" if target.pieces == draft.pieces else "heterogeneous"
    return vocabulary_summary(vmap, relation)


def vocabulary_summary(vmap: VocabMap, relation: str) -> dict[str, Any]:
    t_text = vmap.target.has_text
    d_text = vmap.draft.has_text
    t_shared = int(((vmap.target_to_draft != NO_TOKEN) & t_text).sum())
    d_shared = int(((vmap.draft_to_target != NO_TOKEN) & d_text).sum())
    return {
        "relation": relation,
        "file": VOCAB_MAP_FILE,
        "target_text_tokens": int(t_text.sum()),
        "draft_text_tokens": int(d_text.sum()),
        "intersection": d_shared,
        "target_share": round(t_shared / max(1, int(t_text.sum())), 4),
        "draft_share": round(d_shared / max(1, int(d_text.sum())), 4),
    }


def _tool_versions() -> dict[str, str]:
    versions = {"edge-specdec": __version__}
    for name in _TOOLS:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return versions
