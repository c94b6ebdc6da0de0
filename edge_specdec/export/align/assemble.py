"""The aligned bundle: the fine-tuned draft exported as the bundle's draft was, beside the bundle's own target.

- export_aligned_draft: the fine-tuned Hugging Face folder -> OpenVINO IR with the weight settings recorded in the
  source bundle's manifest, through the export stage's own export_model (optimum-intel, then NNCF).
- build_bundle: a new bundle folder whose target, vocabulary map and draft tokenizer IRs are the source bundle's
  files, hard-linked (copied when the folders are on different file systems, and said so), and whose draft model
  is the exported one. The tokenizers are unchanged, so the vocabulary map is the source's: its check is that the
  draft's tokenizer.json and logits size are the source draft's. The manifest is the source's with the draft's
  entry made afresh, the alignment record, and the sha256 of every file: the bundle is self-contained and passes
  load_bundle's checks like any exported bundle.
- move_into_place: the finished folder renamed to --out (atomically; an existing bundle only with --force, kept
  until the new one is in place).
"""
from __future__ import annotations

import json
import os
import shutil
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Optional

from ...bundle import MANIFEST_FILE, VOCAB_MAP_FILE, Bundle, file_records, sha256_file
from ...errors import ExportError
from .. import _model_entry, _move_into_place, _tool_versions
from ..convert import WeightSettings, export_model, quiet_libraries
from ..sources import ResolvedSource, count_parameters
from ..token_bytes import token_table

DRAFT_TOKENIZER_FILES = ("openvino_tokenizer.xml", "openvino_tokenizer.bin", "openvino_detokenizer.xml",
                         "openvino_detokenizer.bin")


def weight_settings(bundle: Bundle) -> WeightSettings:
    """The draft's weight settings as the source bundle's manifest records them."""
    recorded = bundle.draft.info["weights"]
    fields = WeightSettings.__dataclass_fields__
    return WeightSettings(**{k: v for k, v in recorded.items() if k in fields}).validate("draft")


def export_aligned_draft(hf_folder: Path, settings: WeightSettings, out: Path, scratch: Path,
                         say: Callable[[str], None]) -> dict[str, Any]:
    """Export into `out` (replaced if there); returns the weight statistics export_model reports."""
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        with quiet_libraries():
            stats = export_model(hf_folder, partial, settings, scratch, say)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    partial.rename(out)
    return stats


def build_bundle(source: Bundle, hf_folder: Path, draft_ir: Path, settings: WeightSettings, stats: dict[str, Any],
                 dest: Path, say: Callable[[str], None]) -> dict[str, Any]:
    """Write the aligned bundle's files into dest (replaced if there); return its manifest without the file
    records and the alignment record (write_manifest adds them), and how many files were linked and copied."""
    shutil.rmtree(dest, ignore_errors=True)
    (dest / "target").mkdir(parents=True)
    (dest / "draft").mkdir()
    _check_same_tokenizer(source, hf_folder)
    copied = []
    reused = [rel for rel in source.manifest["files"] if rel.startswith("target/")]
    reused += [VOCAB_MAP_FILE] + [f"draft/{name}" for name in DRAFT_TOKENIZER_FILES]
    for rel in reused:
        if not _link_or_copy(source.path / rel, dest / rel):
            copied.append(rel)
    for path in draft_ir.iterdir():
        if path.is_file() and not (dest / "draft" / path.name).exists():
            _link_or_copy(path, dest / "draft" / path.name)
    if copied:
        say(f"bundle: {len(copied)} files of the source bundle copied, not hard-linked (another file system)")
    given = source.draft.info["source"]
    resolved = ResolvedSource(given["given"], given["kind"], hf_folder)
    entry = _model_entry(resolved, dest / "draft", settings, stats, count_parameters(hf_folder),
                         token_table(hf_folder))
    entry["source"] = dict(given)  # the original weights: a later align starts from them again
    if entry["logits_size"] != source.draft.info["logits_size"]:
        raise ExportError(f"the aligned draft has {entry['logits_size']} logits, the bundle's draft "
                          f"{source.draft.info['logits_size']}: the vocabulary map would not fit it.")
    manifest = {**source.manifest, "draft": entry,
                "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "tool_versions": _tool_versions()}
    manifest.pop("files", None)
    manifest.pop("alignment", None)
    return {"manifest": manifest, "linked": len(reused) - len(copied), "copied": len(copied)}


def write_manifest(dest: Path, manifest: Optional[dict[str, Any]], alignment: Optional[dict[str, Any]]) -> None:
    """Write dest/manifest.json last: a new manifest with the sha256 and size of every file in dest, or (manifest
    None) the one there with the alignment record added (the files are unchanged, so not hashed again)."""
    if manifest is None:
        manifest = json.loads((dest / MANIFEST_FILE).read_text(encoding="utf-8"))
    else:
        manifest = {**manifest, "files": file_records(dest)}
    if alignment is not None:
        manifest["alignment"] = alignment
    tmp = dest / (MANIFEST_FILE + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, dest / MANIFEST_FILE)


def move_into_place(built: Path, out: Path, say: Callable[[str], None]) -> None:
    """Rename the built bundle to out: through a hidden folder beside out, so that out only ever holds a
    complete bundle (on another file system the built folder is first copied there, keeping nothing half-done
    in out)."""
    partial = out.parent / f".{out.name}.partial-{uuid.uuid4().hex[:8]}"
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.rename(built, partial)
    except OSError:
        say(f"bundle: copying to {out.parent} (the work folder is on another file system)")
        try:
            shutil.copytree(built, partial)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        shutil.rmtree(built, ignore_errors=True)
    try:
        _move_into_place(partial, out)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise


def _check_same_tokenizer(source: Bundle, hf_folder: Path) -> None:
    """The vocabulary map and tokenizer IRs are reused: the draft's tokenizer must be the source draft's."""
    ours, theirs = hf_folder / "tokenizer.json", source.draft.folder / "tokenizer.json"
    if not ours.is_file() or not theirs.is_file() or sha256_file(ours) != sha256_file(theirs):
        raise ExportError(f"the draft source's tokenizer.json is not the bundle's draft tokenizer ({theirs}): "
                          "align keeps the bundle's tokenizers and vocabulary map, so the draft source must be "
                          "the model the bundle was exported from. Pass that folder with --draft-source.")


def _link_or_copy(src: Path, dst: Path) -> bool:
    """Hard-link src to dst; copy when a link is impossible. True when linked."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
        return True
    except OSError:
        shutil.copy2(src, dst)
        return False
