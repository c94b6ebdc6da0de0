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
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Union

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

# What was verified is remembered outside the bundle, one small JSON per bundle, in the folder CHECKS_DIR below the
# compiled-model cache folder (see checks_dir): the cache_dir given, else $EDGE_SPECDEC_CACHE_DIR, else
# DEFAULT_CACHE_DIR; "off" remembers nothing. DEFAULT_CACHE_DIR repeats runtime/devices.py's: this module uses the
# standard library only, and importing the runtime package would import OpenVINO.
CHECKS_DIR = "verified-bundles"
DEFAULT_CACHE_DIR = Path.home() / ".cache" / "edge-specdec" / "ov-cache"
# A file modified less than this before a verification is hashed but not remembered: a write landing after the hash
# within the same timestamp tick (coarse on some file systems; 2 s on FAT) would leave size and mtime unchanged.
RECENT_NS = 2 * 10**9


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

    @property
    def vocabulary(self) -> dict[str, Any]:
        return self.manifest["vocabulary"]

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


def checks_dir(cache_dir: Union[str, Path, None] = None) -> Optional[Path]:
    """The folder of the verification records: below the cache folder given, else $EDGE_SPECDEC_CACHE_DIR, else
    the user cache (as for the compiled-model cache); None when that is "off"."""
    value = cache_dir if cache_dir is not None else os.environ.get("EDGE_SPECDEC_CACHE_DIR", DEFAULT_CACHE_DIR)
    if str(value).lower() in ("off", "none", ""):
        return None
    return Path(value).expanduser() / CHECKS_DIR


def _record_path(folder: Path, path: Path) -> Path:
    """One record per bundle, named after its absolute path (the manifest's hash is checked inside)."""
    return folder / (hashlib.sha256(str(path.resolve()).encode("utf-8")).hexdigest()[:32] + ".json")


def _remembered(record: Optional[Path], path: Path, manifest_sha256: str, files: dict[str, dict[str, Any]],
                stats: dict[str, os.stat_result]) -> set[str]:
    """The files whose sha256 was verified on an earlier load and that have kept their size and mtime since.

    A record is trusted only for this bundle path and this exact manifest, and a file only if the record holds the
    manifest's sha256 for it: any doubt (no record, an unreadable one, another export) means hash again."""
    if record is None:
        return set()
    try:
        data = json.loads(record.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return set()
    if (not isinstance(data, dict) or data.get("bundle") != str(path.resolve())
            or data.get("manifest_sha256") != manifest_sha256 or not isinstance(data.get("files"), dict)):
        return set()
    trusted = set()
    for rel, rec in files.items():
        seen = data["files"].get(rel)
        if (isinstance(seen, dict) and seen.get("sha256") == rec["sha256"]
                and seen.get("size") == stats[rel].st_size and seen.get("mtime_ns") == stats[rel].st_mtime_ns):
            trusted.add(rel)
    return trusted


def _remember(record: Optional[Path], path: Path, manifest_sha256: str, files: dict[str, dict[str, Any]],
              stats: dict[str, os.stat_result], verified: set[str], started_ns: int) -> None:
    """Write the record of the verified files, atomically (a temporary file, then a rename): a reader sees the
    old record or the new one, never half of one. Files modified just before the verification began are left
    out (see RECENT_NS), so the next load hashes them again.

    A cache that cannot be written is no error: nothing is remembered, and every load verifies again (correct,
    only slower)."""
    if record is None:
        return
    entries = {rel: {"size": stats[rel].st_size, "mtime_ns": stats[rel].st_mtime_ns, "sha256": files[rel]["sha256"]}
               for rel in sorted(verified) if started_ns - stats[rel].st_mtime_ns >= RECENT_NS}
    text = json.dumps({"bundle": str(path.resolve()), "manifest_sha256": manifest_sha256, "files": entries},
                      indent=1)
    tmp = None
    try:
        record.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=record.parent, prefix=record.stem + ".", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, record)
        tmp = None
    except OSError:
        pass
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def _check_files(path: Path, manifest: dict[str, Any], verify: Optional[bool],
                 progress: Optional[Callable[[str], None]], cache_dir: Union[str, Path, None] = None) -> None:
    """verify: True hashes every file, None only those not verified since they last changed (see load_bundle),
    False none; sizes are always checked."""
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        raise BundleError(f"{path / MANIFEST_FILE} lists no files; {_REEXPORT}.")
    for rel in files:
        if not (path / rel).is_file():
            raise BundleError(f"{path / rel} is missing from the bundle (the manifest lists it); {_REEXPORT}, "
                              "or copy the whole bundle folder again.")
    started_ns = time.time_ns()
    # each file's size and mtime before it is hashed: a change during or after the hash shows at the next load
    stats = {rel: (path / rel).stat() for rel in files}
    record = manifest_sha256 = None
    if verify is not False:
        record_dir = checks_dir(cache_dir)
        record = None if record_dir is None else _record_path(record_dir, path)
        manifest_sha256 = hashlib.sha256((path / MANIFEST_FILE).read_bytes()).hexdigest()  # part of the key
    trusted = _remembered(record, path, manifest_sha256, files, stats) if verify is None else set()
    to_hash = [] if verify is False else [rel for rel in files if rel not in trusted]
    # target/ and draft/ swapped: the probe then differs from its record in size or mtime, so it is to be hashed
    if (manifest.get("draft") is not None and "target/" + MODEL_XML in to_hash
            and _looks_swapped(path, files)):
        raise BundleError(f"{path}: the files in target/ and draft/ are swapped (each matches the other's checksums). "
                          "Rename the folders back, or export again with the larger model as --target.")
    for rel, rec in files.items():
        fpath = path / rel
        if stats[rel].st_size != rec["size"]:
            raise BundleError(f"{fpath} has {stats[rel].st_size} bytes but the manifest says {rec['size']}: "
                              f"the file is damaged or was replaced; {_REEXPORT}.")
    for rel in to_hash:
        fpath, size = path / rel, files[rel]["size"]
        if progress and size > 50_000_000:
            progress(f"verifying {rel} ({size / 1e6:.0f} MB)")
        if sha256_file(fpath) != files[rel]["sha256"]:
            raise BundleError(f"{fpath} does not match its sha256 in the manifest: the file is damaged or was "
                              f"changed after export; {_REEXPORT}.")
    if to_hash:
        _remember(record, path, manifest_sha256, files, stats, trusted | set(to_hash), started_ns)


def _looks_swapped(path: Path, files: dict[str, dict[str, Any]]) -> bool:
    probe = "target/" + MODEL_XML
    twin = "draft/" + MODEL_XML
    if probe not in files or twin not in files or not (path / probe).is_file():
        return False
    return sha256_file(path / probe) == files[twin]["sha256"] != files[probe]["sha256"]


def load_bundle(path: str | Path, verify: Optional[bool] = True,
                progress: Optional[Callable[[str], None]] = None,
                cache_dir: Union[str, Path, None] = None) -> Bundle:
    """Open a bundle folder and validate it.

    verify=True checks the sha256 of every file (a few seconds for a GB-sized bundle); verify=False checks
    only that every file is there with the right size. verify=None checks the sha256 of the files not verified
    on this machine since they last changed: every file the first time, then only a file whose size or
    modification time (mtime_ns) differs from the last verification, so that a later load of an unchanged bundle
    costs only stat() calls. (Rewriting a file and then setting its mtime back by hand is not seen; verify=True
    sees it.) What was verified is remembered in a small JSON per bundle below checks_dir(cache_dir) (the folder
    of the compiled-model cache: cache_dir, else $EDGE_SPECDEC_CACHE_DIR, else the user cache); with that "off"
    or unwritable, verify=None hashes every file at every load. verify=True records what it verified too.
    """
    path = Path(path)
    manifest = read_manifest(path)
    check_manifest(manifest, str(path / MANIFEST_FILE), _REEXPORT)  # types and ranges, before anything reads them
    _check_files(path, manifest, verify, progress, cache_dir)
    bundle = Bundle(path, manifest)
    for entry in (bundle.target, bundle.draft):
        if entry is None:
            continue
        for name in REQUIRED_MODEL_FILES:
            if f"{entry.role}/{name}" not in manifest["files"]:
                raise BundleError(f"{path / MANIFEST_FILE} does not list {entry.role}/{name}; {_REEXPORT}.")
    return bundle


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


def describe(bundle: Bundle) -> str:
    """A human-readable summary for `edge-specdec info`."""
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
        ]
    v = m["vocabulary"]
    if v["relation"] == "identical":
        lines.append("vocab    identical: standard speculative decoding applies")
    elif v["relation"] == "heterogeneous":
        lines.append(f"vocab    heterogeneous: {v['intersection']} token strings in common = "
                     f"{100 * v['target_share']:.1f}% of the target's, {100 * v['draft_share']:.1f}% of the draft's")
    lines.append("chat     " + ("the target's chat template: edge-specdec chat and /v1/chat/completions work"
                             if _has_chat_template(bundle.target.folder) else
                             "no chat template: the target continues text (run, /v1/completions)"))
    total = sum(r["size"] for r in m["files"].values())
    lines.append(f"files    {len(m['files'])} files, {total / 1e6:.1f} MB")
    versions = ", ".join(f"{k} {v}" for k, v in m.get("tool_versions", {}).items())
    lines.append(f"tools    {versions}")
    return "\n".join(lines)
