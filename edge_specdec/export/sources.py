"""Where a model comes from: a local Hugging Face folder, an OpenVINO IR folder, a hub id of either, or a .gguf file.

resolve_source() turns any of them into a local folder (a Hugging Face folder with config, weights and
tokenizer.json, or an OpenVINO IR folder with openvino_model.xml/.bin), downloading or converting into a scratch
folder when needed, and says what it was given and what it is (source_kind).
"""
from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from ..errors import SourceError

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")
IR_MODEL_XML = "openvino_model.xml"
SOURCE_KIND_IR = "openvino-ir"
# What a hub repository of an OpenVINO IR holds that the bundle needs (not its other IRs or weights).
_IR_HUB_FILES = ["openvino_model.*", "openvino_tokenizer.*", "openvino_detokenizer.*", "*.json", "*.jinja", "*.txt",
                 "*.model"]


@dataclass(frozen=True)
class ResolvedSource:
    given: str      # what the user passed
    kind: str       # where it came from: "local", "hub" or "gguf"
    folder: Path    # a local Hugging Face folder, or an OpenVINO IR folder when source_kind is "openvino-ir"
    source_kind: str = "huggingface"  # what the folder holds: "huggingface", "gguf" or "openvino-ir"

    @property
    def is_ir(self) -> bool:
        return self.source_kind == SOURCE_KIND_IR

    def describe(self) -> dict[str, Any]:
        return {"given": self.given, "kind": self.kind}


def is_ir_folder(path: Path) -> bool:
    """A folder holding openvino_model.xml: an OpenVINO IR source (checked by ir_source.inspect_ir_folder)."""
    return path.is_dir() and (path / IR_MODEL_XML).is_file()


def is_ir_source(src: str) -> bool:
    """Whether a source as the user gave it is an OpenVINO IR: a local IR folder, or a hub id (not a local folder)
    of a repository with openvino_model.xml at its root. Asking the hub fetches that file alone (the one the checks
    read first anyway); a hub that does not answer leaves the source to the Hugging Face route, which says why."""
    path = Path(src).expanduser()
    if path.exists():
        return is_ir_folder(path)
    return is_hub_id(src) and _hub_ir_xml(src) is not None


def is_hub_id(src: str) -> bool:
    """Whether a source that is not a local path has the form of a hub id, ORG/NAME."""
    return _HUB_ID.match(src) is not None and not src.startswith((".", "/", "~"))


def hub_client(src: str, role: str):
    """The huggingface_hub module, or a SourceError naming the extra that brings it: an IR repository needs
    nothing more than the runtime and huggingface_hub (the hub extra), a model to convert the export extra."""
    try:
        import huggingface_hub
    except ImportError:
        raise SourceError(f"--{role} {src}: a hub id needs huggingface_hub, which is not installed: pip install "
                          "'edge-specdec[hub]' (enough for an OpenVINO IR repository such as "
                          "OpenVINO/Qwen2.5-1.5B-Instruct-int4-ov; a model to convert needs 'edge-specdec[export]'), "
                          "or download the model folder and pass its path.") from None
    return huggingface_hub


def _hub_ir_xml(repo_id: str) -> Optional[Path]:
    """openvino_model.xml of a hub repository (downloaded, or from the local hub cache), or None."""
    try:
        from huggingface_hub import hf_hub_download
        return Path(hf_hub_download(repo_id, IR_MODEL_XML))
    except Exception:  # no such file, an unknown repo, offline: not an IR repository to us
        return None


def resolve_source(src: str, scratch: Path, role: str, progress: Callable[[str], None]) -> ResolvedSource:
    path = Path(src).expanduser()
    if path.suffix.lower() == ".gguf":
        if not path.is_file():
            raise SourceError(f"--{role} {src}: no such .gguf file. Check the path.")
        return ResolvedSource(src, "gguf", _from_gguf(path, scratch / f"{role}-from-gguf", progress), "gguf")
    if is_ir_folder(path):
        return ResolvedSource(src, "local", path, SOURCE_KIND_IR)
    if path.is_dir():
        check_hf_folder(path, role)
        return ResolvedSource(src, "local", path)
    if path.exists():
        raise SourceError(f"--{role} {src}: a file, but not a .gguf file. Pass a Hugging Face model folder "
                          "(with config.json), an OpenVINO IR folder (with openvino_model.xml), a hub id such as "
                          "Qwen/Qwen2.5-Coder-1.5B-Instruct, or a .gguf file.")
    if is_hub_id(src):
        hub_client(src, role)
        if _hub_ir_xml(src) is not None:
            return ResolvedSource(src, "hub", _from_hub(src, role, progress, _IR_HUB_FILES), SOURCE_KIND_IR)
        return ResolvedSource(src, "hub", _from_hub(src, role, progress))
    raise SourceError(f"--{role} {src}: no such folder or file, and not a hub id of the form ORG/NAME. "
                      "Check the path, or pass a hub id such as Qwen/Qwen2.5-Coder-1.5B-Instruct.")


def check_hf_folder(folder: Path, role: str) -> None:
    if not (folder / "config.json").is_file():
        raise SourceError(f"--{role} {folder}: no config.json there, so it is not a Hugging Face model folder. "
                          "Pass the folder that holds config.json, the weights and tokenizer.json.")
    if not any(folder.glob("*.safetensors")) and not any(folder.glob("pytorch_model*.bin")):
        raise SourceError(f"--{role} {folder}: no weights (*.safetensors or pytorch_model*.bin) in the folder. "
                          "Download the complete model folder.")
    if not (folder / "tokenizer.json").is_file():
        raise SourceError(f"--{role} {folder}: no tokenizer.json (a Hugging Face fast tokenizer) in the folder. "
                          "Load the tokenizer with transformers and save_pretrained() it into the folder.")


def _from_hub(repo_id: str, role: str, progress: Callable[[str], None],
              ir_files: Optional[list[str]] = None) -> Path:
    """The hub repository's files the export needs (ir_files: the patterns of an IR repository's), downloaded."""
    hub = hub_client(repo_id, role)
    progress(f"downloading {repo_id} from the Hugging Face hub")
    try:
        folder = Path(hub.snapshot_download(repo_id, allow_patterns=ir_files or [
            "*.json", "*.safetensors", "*.jinja", "*.model", "*.txt", "tokenizer*"]))
    except Exception as exc:  # network errors, unknown repos, gated repos: all end here
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SourceError(f"--{role} {repo_id}: could not download it from the Hugging Face hub ({reason}). "
                          "If this machine is offline, download the model folder on a machine that is online "
                          "and pass its local path instead.") from None
    if ir_files is None:
        check_hf_folder(folder, role)
    return folder


def _from_gguf(path: Path, out: Path, progress: Callable[[str], None]) -> Path:
    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError:  # pragma: no cover
        raise SourceError("reading .gguf files needs transformers and gguf: pip install 'edge-specdec[export]'.")
    progress(f"reading {path.name} (GGUF weights are dequantized to float before export)")
    try:
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name)
        tokenizer = _gguf_tokenizer(path, AutoTokenizer)
    except Exception as exc:
        raise SourceError(f"{path}: transformers could not read this GGUF file ({exc}). transformers reads GGUF "
                          "files of the common architectures (llama, qwen2, mistral, ...); for others, export from "
                          "the original Hugging Face folder instead.") from None
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    del model
    check_hf_folder(out, "gguf")
    return out


def _gguf_tokenizer(path: Path, auto_tokenizer):
    """The file's tokenizer rebuilt from its own tokenizer.ggml.* fields where gguf_tokenizer knows its kind:
    transformers' reader ignores the pre-tokenizer the file names (Llama 3, DeepSeek Coder and StarCoder files
    then tokenize differently from the model). Other kinds: transformers' reader."""
    from .gguf_tokenizer import can_rebuild, gguf_tokenizer_fields, tokenizer_from_gguf

    fields = gguf_tokenizer_fields(path)
    if can_rebuild(fields):
        return tokenizer_from_gguf(path, fields)
    return auto_tokenizer.from_pretrained(path.parent, gguf_file=path.name)


def count_parameters(folder: Path) -> int:
    """Parameters in a Hugging Face folder, read from the safetensors headers without loading weights.

    Falls back to the weight files' size in bytes / 2 for PyTorch .bin weights (a rough figure)."""
    total = 0
    for st in folder.glob("*.safetensors"):
        with open(st, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
        for name, meta in header.items():
            if name != "__metadata__":
                n = 1
                for dim in meta["shape"]:
                    n *= dim
                total += n
    if total == 0:
        total = sum(p.stat().st_size for p in folder.glob("pytorch_model*.bin")) // 2
    return total


def read_config(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "config.json").read_text(encoding="utf-8"))


def optional_json(path: Path) -> Optional[dict[str, Any]]:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
