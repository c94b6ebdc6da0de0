"""The bundle manifest's schema: each field the runtime reads, checked for its type and range when a bundle is read.

A manifest is written by `edge-specdec export`, but it is a text file a user can edit, copy half of, or receive
from someone else. Without these checks a wrong type surfaced as a TypeError or KeyError deep in the runtime, and
an absurd value (a context of 0, an unknown vocabulary relation, a file path that leaves the bundle) was used as it
was. Every problem is one BundleError line that names the field. Only the standard library is used (see bundle.py).
"""
from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import Any, Optional

from .errors import BundleError

RELATIONS = ("identical", "heterogeneous", "target-only")
# The least context (max_position_embeddings) the engine loads a model with. Its load feeds up to 24 tokens to one
# scratch session: the block-invariance check's 12-token block, then the static block sizes it checks (a single
# step of up to 3 tokens and a verify block of the default draft length, 9); the warm-up's 8-token block, a step and
# the same static blocks come to less
MIN_CONTEXT = 24
_SHA256 = re.compile(r"[0-9a-f]{64}")


class _Checker:
    """Typed reads of one manifest, each problem a BundleError naming the field (`target.logits_size`)."""

    def __init__(self, where: str, fix: str):
        self.where, self.fix = where, fix

    def fail(self, field: str, problem: str) -> BundleError:
        return BundleError(f"{self.where}: {field} {problem}; {self.fix}.")

    def obj(self, value: Any, field: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(field, f"must be an object, not {_kind(value)}")
        return value

    def integer(self, value: Any, field: str, low: int, optional: bool = False) -> Optional[int]:
        if value is None and optional:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(field, f"must be an integer, not {_kind(value)}")
        if value < low:
            raise self.fail(field, f"must be at least {low}, not {value}")
        return value

    def number(self, value: Any, field: str, low: float, high: float) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
            raise self.fail(field, f"must be a number from {low:g} to {high:g}, not {value!r}")
        return value

    def string(self, value: Any, field: str, optional: bool = False) -> Optional[str]:
        if value is None and optional:
            return None
        if not isinstance(value, str):
            raise self.fail(field, f"must be a string, not {_kind(value)}")
        return value


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), f"the number {value!r}" if isinstance(value, (int, float)) else type(value).__name__)


def check_manifest(manifest: dict[str, Any], where: str, fix: str) -> None:
    """Raise a BundleError for the first field of `manifest` that is missing, of the wrong type or out of range.

    where: the manifest's path (for the message); fix: what to do about it."""
    c = _Checker(where, fix)
    for key in ("target", "vocabulary", "files"):
        if key not in manifest:
            raise c.fail(repr(key), "is missing")
    files = c.obj(manifest["files"], "files")
    if not files:
        raise c.fail("files", "lists no files")
    for rel, record in files.items():
        _check_file(c, rel, record)
    _check_model(c, manifest["target"], "target")
    draft = manifest.get("draft")
    if draft is not None:
        _check_model(c, draft, "draft")
    vocabulary = c.obj(manifest["vocabulary"], "vocabulary")
    relation = vocabulary.get("relation")
    if relation not in RELATIONS:
        raise c.fail("vocabulary.relation", f"must be one of {', '.join(RELATIONS)}, not {relation!r}")
    if (relation == "target-only") != (draft is None):
        raise c.fail("vocabulary.relation", f"{relation!r} does not fit a bundle "
                                            f"{'without' if draft is None else 'with'} a draft")
    for key in ("target_share", "draft_share"):
        if key in vocabulary:
            c.number(vocabulary[key], f"vocabulary.{key}", 0.0, 1.0)
    for key in ("intersection", "target_text_tokens", "draft_text_tokens"):
        if key in vocabulary:
            c.integer(vocabulary[key], f"vocabulary.{key}", 0)
    if manifest.get("generation_defaults") is not None:  # its values are checked as a GenerationConfig's at load
        for name, value in c.obj(manifest["generation_defaults"], "generation_defaults").items():
            if isinstance(value, (dict, list)) and name != "stop_strings":
                raise c.fail(f"generation_defaults.{name}", f"must be a number, a boolean or text, not {_kind(value)}")


def _check_file(c: _Checker, rel: Any, record: Any) -> None:
    """A file's entry: a relative POSIX path that stays inside the bundle, with its sha256 and size."""
    path = PurePosixPath(rel) if isinstance(rel, str) else None
    if (path is None or not rel or path.is_absolute() or ".." in path.parts or "\\" in rel or ":" in rel
            or rel != path.as_posix()):
        raise c.fail(f"files[{rel!r}]", "is not a path inside the bundle (relative, '/'-separated, without '..')")
    record = c.obj(record, f"files[{rel!r}]")
    sha = record.get("sha256")
    if not isinstance(sha, str) or not _SHA256.fullmatch(sha):
        raise c.fail(f"files[{rel!r}].sha256", f"must be 64 lowercase hex digits, not {sha!r}")
    c.integer(record.get("size"), f"files[{rel!r}].size", 0)


def _check_model(c: _Checker, info: Any, role: str) -> None:
    """A model's entry: what the runtime and `info` read of it."""
    info = c.obj(info, role)
    logits = c.integer(info.get("logits_size"), f"{role}.logits_size", 1)
    c.integer(info.get("tokenizer_size"), f"{role}.tokenizer_size", 1)
    c.integer(info.get("max_position_embeddings"), f"{role}.max_position_embeddings (the context)", MIN_CONTEXT,
              optional=True)
    c.integer(info.get("num_parameters"), f"{role}.num_parameters", 0)
    c.integer(info.get("size_bytes"), f"{role}.size_bytes", 0)
    source = c.obj(info.get("source"), f"{role}.source")
    c.string(source.get("given"), f"{role}.source.given")
    c.string(source.get("kind"), f"{role}.source.kind")
    weights = c.obj(info.get("weights"), f"{role}.weights")
    c.string(weights.get("format"), f"{role}.weights.format")
    special = c.obj(info.get("special_tokens"), f"{role}.special_tokens")
    eos = special.get("eos_token_ids")
    if not isinstance(eos, list):
        raise c.fail(f"{role}.special_tokens.eos_token_ids", f"must be a list of token ids, not {_kind(eos)}")
    for i, token in enumerate(eos):
        if c.integer(token, f"{role}.special_tokens.eos_token_ids[{i}]", 0) >= logits:
            raise c.fail(f"{role}.special_tokens.eos_token_ids[{i}]", f"({token}) is past the model's "
                                                                      f"{logits} logits")
    for key in ("eos_token_id", "bos_token_id", "pad_token_id", "unk_token_id"):
        c.integer(special.get(key), f"{role}.special_tokens.{key}", 0, optional=True)
