"""Every token of a Hugging Face fast tokenizer as the raw bytes it stands for.

Tokenizers write their tokens in their own conventions; to compare two vocabularies we undo them:
- byte-level BPE (GPT-2, Qwen, SmolLM): each byte is drawn as a printable character (space is U+0120 'Ġ');
- SentencePiece-style (Llama-2, Mistral): the space is U+2581 '▁' and bytes that have no token of their own
  are spelled by byte-fallback tokens '<0xNN>';
- added tokens are matched literally in the text, so their bytes are their UTF-8 content;
- special tokens (BOS, EOS, PAD, chat markers) stand for no text at all: they get no bytes.
Only the tokenizer.json file is read (standard library only).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from ..errors import ExportError

_BYTE_TOKEN = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def bytes_to_unicode() -> dict[int, str]:
    """The GPT-2 byte -> printable character table used by every byte-level BPE."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


_UNICODE_TO_BYTE = {ch: b for b, ch in bytes_to_unicode().items()}


def _walk(node: Any):
    """Yield every dict inside a (possibly Sequence-nested) tokenizer.json component."""
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from _walk(value)


def _has_type(node: Any, name: str) -> bool:
    return any(d.get("type") == name for d in _walk(node))


@dataclass
class TokenTable:
    """Per token id: its bytes (None for special tokens), and whether it is a byte-fallback token."""
    pieces: list[Optional[bytes]]
    byte_fallback: list[bool]
    style: str

    def __len__(self) -> int:
        return len(self.pieces)


def detect_style(spec: dict[str, Any]) -> str:
    """'bytelevel', 'metaspace' or 'plain' from the tokenizer.json components."""
    parts = [spec.get("pre_tokenizer"), spec.get("decoder"), spec.get("normalizer")]
    if any(_has_type(p, "ByteLevel") for p in parts):
        return "bytelevel"
    if any(_has_type(p, "Metaspace") for p in parts) or any(
            d.get("type") == "Replace" and "▁" in json.dumps(d, ensure_ascii=False) for p in parts for d in _walk(p)):
        return "metaspace"
    return "plain"


def token_table(tokenizer_dir: Path) -> TokenTable:
    """Read tokenizer_dir/tokenizer.json and return the byte string of every token id."""
    path = Path(tokenizer_dir) / "tokenizer.json"
    if not path.is_file():
        raise ExportError(f"{path} is missing: edge-specdec needs a Hugging Face *fast* tokenizer (tokenizer.json). "
                          "Load the tokenizer with transformers and save it with save_pretrained() to create one.")
    spec = json.loads(path.read_text(encoding="utf-8"))
    model = spec.get("model", {})
    vocab = model.get("vocab")
    if isinstance(vocab, list):  # Unigram: [[piece, score], ...]
        id_to_token = {i: piece for i, (piece, _score) in enumerate(vocab)}
    elif isinstance(vocab, dict):
        id_to_token = {i: t for t, i in vocab.items()}
    else:
        raise ExportError(f"{path}: unsupported tokenizer model {model.get('type')!r} (no vocabulary found).")
    style = detect_style(spec)
    has_fallback = bool(model.get("byte_fallback"))
    added = {tok["id"]: tok for tok in spec.get("added_tokens", [])}
    size = max([*id_to_token, *added, -1]) + 1
    pieces: list[Optional[bytes]] = [None] * size
    fallback = [False] * size
    for i, tok in id_to_token.items():
        pieces[i], fallback[i] = _piece_bytes(tok, style, has_fallback)
    for i, tok in added.items():
        pieces[i] = None if tok.get("special") else tok["content"].encode("utf-8")
        fallback[i] = False
    return TokenTable(pieces, fallback, style)


def _piece_bytes(token: str, style: str, has_fallback: bool) -> tuple[bytes, bool]:
    if has_fallback:
        match = _BYTE_TOKEN.match(token)
        if match:
            return bytes([int(match.group(1), 16)]), True
    if style == "bytelevel":
        try:
            return bytes(_UNICODE_TO_BYTE[ch] for ch in token), False
        except KeyError:  # a piece outside the byte alphabet (rare; e.g. a hand-added vocabulary entry)
            return token.encode("utf-8"), False
    if style == "metaspace":
        return token.replace("▁", " ").encode("utf-8"), False
    return token.encode("utf-8"), False
