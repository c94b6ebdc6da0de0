"""The bundle: the folder that the export stage writes and the runtime reads.

Layout (paths relative to the bundle folder):
    manifest.json                  what is inside, with the sha256 and size of every other file
    vocab_map.npz                  token byte strings of both sides and the draft<->target token map
    target/openvino_model.xml|bin  the target as a stateful OpenVINO IR
    target/openvino_tokenizer.xml|bin, target/openvino_detokenizer.xml|bin
    target/config.json, tokenizer files (tokenizer.json, tokenizer_config.json, chat template ...)
    draft/...                      the same for the draft (absent in a target-only bundle)

Only the standard library is used here, so that the runtime can load a bundle without the export extra.
"""
from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from .bundle_manifest import check_manifest
from .errors import BundleError

FORMAT_NAME = "edge-specdec-bundle"
MANIFEST_VERSION = 1
MANIFEST_FILE = "manifest.json"
VOCAB_MAP_FILE = "vocab_map.npz"
ROLES = ("target", "draft")
MODEL_XML = "openvino_model.xml"
TOKENIZER_XML = "openvino_tokenizer.xml"
DETOKENIZER_XML = "openvino_detokenizer.xml"
REQUIRED_MODEL_FILES = (MODEL_XML, "openvino_model.bin", TOKENIZER_XML, "openvino_tokenizer.bin",
                        DETOKENIZER_XML, "openvino_detokenizer.bin")

_REEXPORT = "re-export it with `edge-specdec export ... --force`"
# what a checksum error adds for the person who accepts the risk (the CLI's flag, the Engine's argument)
_SKIP = "(--no-verify, or Engine(verify_checksums=False), loads it unchecked at your own risk)"


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            digest.update(block)
    return digest.hexdigest()


def file_records(folder: Path, exclude: tuple[str, ...] = (MANIFEST_FILE,)) -> dict[str, dict[str, Any]]:
    """sha256 and size of every file below folder, keyed by POSIX relative path."""
    records = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = path.relative_to(folder).as_posix()
        if rel not in exclude:
            records[rel] = {"sha256": sha256_file(path), "size": path.stat().st_size}
    return records


@dataclass(frozen=True)
class ModelEntry:
    """One side of a bundle (target or draft) as the manifest describes it."""
    role: str
    folder: Path
    info: dict[str, Any]

    @property
    def model_xml(self) -> Path:
        return self.folder / MODEL_XML

    @property
    def tokenizer_xml(self) -> Path:
        return self.folder / TOKENIZER_XML

    @property
    def detokenizer_xml(self) -> Path:
        return self.folder / DETOKENIZER_XML

    @property
    def special_tokens(self) -> dict[str, Any]:
        return self.info["special_tokens"]

    @property
    def eos_token_ids(self) -> list[int]:
        return list(self.info["special_tokens"]["eos_token_ids"])


@dataclass(frozen=True)
class Bundle:
    path: Path
    manifest: dict[str, Any]

    @property
    def target(self) -> ModelEntry:
        return ModelEntry("target", self.path / "target", self.manifest["target"])

    @property
    def draft(self) -> Optional[ModelEntry]:
        info = self.manifest.get("draft")
        return None if info is None else ModelEntry("draft", self.path / "draft", info)

    def without_draft(self) -> "Bundle":
        """This bundle with its target alone: what a run of the target alone needs to load (the draft's files stay
        where they are)."""
        return Bundle(self.path, {key: value for key, value in self.manifest.items() if key != "draft"})

    @property
    def vocabulary(self) -> dict[str, Any]:
        return self.manifest["vocabulary"]

    @property
    def generation_defaults(self) -> dict[str, Any]:
        """The GenerationConfig fields export recorded as this bundle's defaults (--generation-default), which a
        request's unset fields take; empty: GenerationConfig's own defaults."""
        return dict(self.manifest.get("generation_defaults") or {})

    @property
    def vocab_map_path(self) -> Path:
        return self.path / VOCAB_MAP_FILE

    def load_vocab_map(self):
        from .vocab_map import VocabMap
        return VocabMap.load(self.vocab_map_path)


def read_manifest(path: Path) -> dict[str, Any]:
    path = Path(path)
    if not path.exists():
        raise BundleError(f"no bundle at {path}: the folder does not exist. "
                          "Create one with `edge-specdec export --target SRC --draft SRC --out DIR`.")
    if not path.is_dir():
        raise BundleError(f"{path} is a file, not a bundle folder. Pass the folder that `edge-specdec export` wrote.")
    mpath = path / MANIFEST_FILE
    if not mpath.is_file():
        raise BundleError(f"{mpath} is missing, so {path} is not an edge-specdec bundle (or an export was "
                          f"interrupted). Pass the folder that `edge-specdec export` wrote, or {_REEXPORT}.")
    try:
        manifest = json.loads(mpath.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BundleError(f"{mpath} is not valid JSON ({exc}); {_REEXPORT}.") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
        raise BundleError(f"{mpath} is not an edge-specdec manifest (no \"format\": \"{FORMAT_NAME}\"); "
                          f"pass the folder that `edge-specdec export` wrote.")
    version = manifest.get("manifest_version")
    if version != MANIFEST_VERSION:
        if isinstance(version, int) and version > MANIFEST_VERSION:
            fix = "upgrade edge-specdec (`pip install -U edge-specdec`) or export the bundle again with this version"
        else:
            fix = _REEXPORT
        raise BundleError(f"{mpath} has manifest version {version!r}, but this edge-specdec reads version "
                          f"{MANIFEST_VERSION}: {fix}.")
    return manifest


def _check_files(path: Path, manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every file the manifest lists is there with its size (stat() calls only); returns the manifest's files."""
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        raise BundleError(f"{path / MANIFEST_FILE} lists no files; {_REEXPORT}.")
    for rel in files:
        if not (path / rel).is_file():
            raise BundleError(f"{path / rel} is missing from the bundle (the manifest lists it); {_REEXPORT}, "
                              "or copy the whole bundle folder again.")
    for rel, rec in files.items():
        size = (path / rel).stat().st_size
        if size != rec["size"]:
            if _looks_swapped(path, files):
                raise _swapped(path)
            raise BundleError(f"{path / rel} has {size} bytes but the manifest says {rec['size']}: "
                              f"the file is damaged or was replaced; {_REEXPORT}. {_rehash_hint(path)}")
    return files


def _rehash_hint(path: Path) -> str:
    """What a checksum or size error adds for a file edited on purpose."""
    return f"If you changed it on purpose (a chat template, say), `edge-specdec info {path} --rehash` records it."


def _swapped(path: Path) -> BundleError:
    return BundleError(f"{path}: the files in target/ and draft/ are swapped (each matches the other's checksums). "
                       "Rename the folders back, or export again with the larger model as --target.")


def _hash_files(path: Path, files: dict[str, dict[str, Any]], progress: Optional[Callable[[str], None]] = None,
                cancelled: Callable[[], bool] = lambda: False) -> None:
    """The sha256 of every file against the manifest's; the first mismatch raises, naming the file and the fix."""
    for rel in sorted(files, key=lambda r: files[r]["size"]):  # small files first: a swap shows in the XML
        if cancelled():
            return
        fpath, size = path / rel, files[rel]["size"]
        if progress and size > 50_000_000:
            progress(f"verifying {rel} ({size / 1e6:.0f} MB)")
        if sha256_file(fpath) != files[rel]["sha256"]:
            if rel.endswith("/" + MODEL_XML) and _looks_swapped(path, files):
                raise _swapped(path)
            raise BundleError(f"{fpath} does not match its sha256 in the manifest: the file is damaged or was "
                              f"changed after export; {_REEXPORT} {_SKIP}. {_rehash_hint(path)}")


class Verification:
    """The sha256 checks of a bundle's files, running in a thread of their own while the caller does other work
    (Engine: compiles the models; hashlib releases the GIL while it hashes, OpenVINO while it compiles).

    wait() returns once every file matched its checksum and raises the BundleError of the first that did not, so
    that a caller who waits before its first generation generates nothing from damaged or tampered weights.
    cancel(): stop at the next file (a caller that failed otherwise and will not wait)."""

    def __init__(self, path: Path, files: dict[str, dict[str, Any]],
                 progress: Optional[Callable[[str], None]] = None):
        self.path, self.seconds = path, 0.0
        self._error: Optional[BaseException] = None
        self._cancel = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(files, progress), name="verify-bundle", daemon=True)
        self._thread.start()

    def _run(self, files: dict[str, dict[str, Any]], progress: Optional[Callable[[str], None]]) -> None:
        start = time.perf_counter()
        try:
            _hash_files(self.path, files, progress, self._cancel.is_set)
        except BaseException as exc:  # handed to wait()
            self._error = exc
        self.seconds = time.perf_counter() - start

    def wait(self) -> None:
        self._thread.join()
        if self._error is not None:
            raise self._error

    def cancel(self) -> None:
        self._cancel.set()


def start_verification(bundle: Bundle, progress: Optional[Callable[[str], None]] = None) -> Verification:
    """Begin checking the sha256 of every file of a loaded bundle in a background thread; wait() on the result
    before the first generation (see Verification)."""
    return Verification(bundle.path, bundle.manifest["files"], progress)


def _looks_swapped(path: Path, files: dict[str, dict[str, Any]]) -> bool:
    probe = "target/" + MODEL_XML
    twin = "draft/" + MODEL_XML
    if probe not in files or twin not in files or not (path / probe).is_file():
        return False
    return sha256_file(path / probe) == files[twin]["sha256"] != files[probe]["sha256"]


def load_bundle(path: str | Path, verify: bool = True,
                progress: Optional[Callable[[str], None]] = None) -> Bundle:
    """Open a bundle folder and validate it: the manifest against its schema, every file there with its size.

    verify=True also checks the sha256 of every file against the manifest (a second or two per GB); verify=False
    leaves that to the caller, as Engine does: it loads with verify=False, then hashes in a thread while the
    models compile (start_verification) and waits for it before anything generates."""
    path = Path(path)
    manifest = read_manifest(path)
    check_manifest(manifest, str(path / MANIFEST_FILE), _REEXPORT)  # types and ranges, before anything reads them
    files = _check_files(path, manifest)
    if verify:
        _hash_files(path, files, progress)
    bundle = Bundle(path, manifest)
    for entry in (bundle.target, bundle.draft):
        if entry is None:
            continue
        for name in REQUIRED_MODEL_FILES:
            if f"{entry.role}/{name}" not in manifest["files"]:
                raise BundleError(f"{path / MANIFEST_FILE} does not list {entry.role}/{name}; {_REEXPORT}.")
    return bundle


def rehash_bundle(path: str | Path) -> list[str]:
    """Record a bundle's files as they are now in its manifest, after a deliberate edit (a chat template, a
    tokenizer_config.json): the sha256 and size of every file, and each model's size on disk. Returns what changed,
    one line a file, and leaves the manifest as it is when nothing did. A bundle that lacks a file a model needs is
    refused; the new manifest replaces the old one in one rename, so a failure leaves the old one whole."""
    path = Path(path)
    manifest = read_manifest(path)
    check_manifest(manifest, str(path / MANIFEST_FILE), _REEXPORT)
    before, now = manifest["files"], file_records(path)
    changes = {rel: "removed" for rel in set(before) - set(now)}
    changes.update({rel: f"added ({rec['size']} bytes)" for rel, rec in now.items() if rel not in before})
    changes.update({rel: f"changed ({before[rel]['size']} -> {rec['size']} bytes, sha256 {before[rel]['sha256'][:12]}"
                         f" -> {rec['sha256'][:12]})"
                    for rel, rec in now.items() if rel in before and rec != before[rel]})
    if not changes:
        return []
    roles = [role for role in ROLES if manifest.get(role)]
    missing = [rel for rel in [VOCAB_MAP_FILE] + [f"{role}/{name}" for role in roles for name in REQUIRED_MODEL_FILES]
               if rel not in now]
    if missing:
        raise BundleError(f"{path} lacks {', '.join(missing)}, which a bundle needs: nothing recorded. Put the files "
                          f"back (or {_REEXPORT}).")
    manifest = {**manifest, "files": now}
    for role in roles:
        manifest[role] = {**manifest[role], "size_bytes": sum(rec["size"] for rel, rec in now.items()
                                                               if rel.startswith(f"{role}/"))}
    check_manifest(manifest, str(path / MANIFEST_FILE), _REEXPORT)
    scratch = path / f".{MANIFEST_FILE}.{os.getpid()}.tmp"
    try:
        scratch.write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        os.replace(scratch, path / MANIFEST_FILE)
    finally:
        scratch.unlink(missing_ok=True)
    return [f"{rel}: {change}" for rel, change in sorted(changes.items())]


def _source_shown(source: dict[str, Any]) -> str:
    """Where a model came from, as `info` shows it: a hub id or a relative path as given, an absolute local path by
    its name only (a path on the machine that exported the bundle means nothing on this one; --json has it)."""
    given = str(source.get("given", "?"))
    if source.get("kind") != "hub" and (given.startswith("/") or given[1:3] in (":\\", ":/")):
        return given.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1]
    return given


def _has_chat_template(folder: Path) -> bool:
    """Whether a model folder has a chat template where runtime/chat.py looks (a file, or tokenizer_config.json)."""
    if (folder / "chat_template.jinja").is_file():
        return True
    try:
        return bool(json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8")).get("chat_template"))
    except (OSError, ValueError, AttributeError):
        return False


def kv_bytes_per_token(config: dict[str, Any], element_bytes: int = 2) -> Optional[int]:
    """Bytes one token takes in a model's KV cache (keys and values of every layer) at `element_bytes` per element,
    from its config.json (Llama/Qwen/Mistral names, or GPT-2's); None when the config does not say."""
    layers = config.get("num_hidden_layers", config.get("n_layer"))
    heads = config.get("num_attention_heads", config.get("n_head"))
    hidden = config.get("hidden_size", config.get("n_embd"))
    if not all(isinstance(v, int) and v > 0 for v in (layers, heads, hidden)):
        return None
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or hidden // heads
    return 2 * layers * kv_heads * head_dim * element_bytes


def _kv_line(entry: ModelEntry) -> Optional[str]:
    """info's line on a model's KV cache: bytes per token at the CPU's default f16 cache, and at the full context."""
    try:
        config = json.loads((entry.folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    per_token = kv_bytes_per_token(config)
    if per_token is None:
        return None
    context = entry.info.get("max_position_embeddings")
    full = f", {per_token * context / 2**20:.3g} MiB for its whole context of {context}" if context else ""
    return (f"         KV cache {per_token / 1024:.1f} KiB per token at f16 (the CPU's default; f32 twice that)"
            f"{full}")


def describe(bundle: Bundle, chat_lines: Callable[[Path], list[str]] = lambda folder: []) -> str:
    """A human-readable summary for `edge-specdec info`; chat_lines(folder): what the target's chat template lets a
    conversation hold (the runtime reads templates, and the bundle layer does not import it: `info` passes it)."""
    m = bundle.manifest
    lines = [f"bundle   {bundle.path}",
             f"made     {m.get('created', '?')} by edge-specdec {m.get('tool_versions', {}).get('edge-specdec', '?')}"]
    for entry in (bundle.target, bundle.draft):
        if entry is None:
            lines.append("draft    none (target-only bundle: prompt lookup still works)")
            continue
        info = entry.info
        w = info["weights"]
        settings = ", ".join(f"{k} {v}" for k, v in w.items()
                             if k not in ("format", "elements_by_type", "share_by_type") and v not in (None, False))
        stored = ", ".join(f"{k} {100 * v:.0f}%" for k, v in sorted(w.get("share_by_type", {}).items(),
                                                                    key=lambda kv: -kv[1]))
        special = info["special_tokens"]
        lines += [
            f"{entry.role:<8} {_source_shown(info['source'])}  ({info['source']['kind']})",
            f"         {info.get('architecture', '?')}, {info['num_parameters'] / 1e6:.1f}M parameters, "
            f"weights {w['format']}" + (f" ({settings})" if settings else ""),
            f"         stored as {stored}",
            f"         vocabulary {info['tokenizer_size']} tokens (logits {info['logits_size']}), "
            f"context {info.get('max_position_embeddings', '?')}, "
            f"BOS {special.get('bos_token')!r} EOS {special.get('eos_token')!r} ids {special.get('eos_token_ids')}",
            f"         size on disk {info['size_bytes'] / 1e6:.1f} MB",
        ] + [line for line in [_kv_line(entry)] if line]
    v = m["vocabulary"]
    if v["relation"] == "identical":
        lines.append("vocab    identical: standard speculative decoding applies")
    elif v["relation"] == "heterogeneous":
        lines.append(f"vocab    heterogeneous: {v['intersection']} token strings in common = "
                     f"{100 * v['target_share']:.1f}% of the target's, {100 * v['draft_share']:.1f}% of the draft's")
    lines.append("chat     " + ("the target's chat template: edge-specdec chat and /v1/chat/completions work"
                             if _has_chat_template(bundle.target.folder) else
                             "no chat template: the target continues text (run, /v1/completions)"))
    if _has_chat_template(bundle.target.folder):
        lines += [f"         {line}" for line in chat_lines(bundle.target.folder)]
    defaults = bundle.generation_defaults
    lines.append("defaults " + (", ".join(f"{k} {v!r}" for k, v in sorted(defaults.items()))
                                + " (recorded at export; a request that sets none of these takes them)" if defaults
                                else "none recorded: GenerationConfig's own (greedy, no repetition penalty)"))
    total = sum(r["size"] for r in m["files"].values())
    lines.append(f"files    {len(m['files'])} files, {total / 1e6:.1f} MB")
    versions = ", ".join(f"{k} {v}" for k, v in m.get("tool_versions", {}).items())
    lines.append(f"tools    {versions}")
    return "\n".join(lines)
