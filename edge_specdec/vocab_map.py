"""The vocabulary map between a draft and a target: computed at export, loaded by the runtime (numpy only).

Saved as one .npz with, for each side, every token's bytes (concatenated, with offsets) and a flag for
tokens that spell no text (special tokens, ids past the tokenizer), plus the two maps:
draft_to_target[d] is the target token with exactly d's bytes (or -1), target_to_draft the reverse.
Where several tokens share bytes (a regular token and a <0xNN> byte-fallback token), the map points to the
regular one, and among equals to the lowest id. EOS is mapped to EOS explicitly.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

NO_TOKEN = -1


@dataclass
class TokenBytes:
    """All token byte strings of one vocabulary, packed."""
    data: np.ndarray      # uint8, every token's bytes one after the other
    offsets: np.ndarray   # int64 [n + 1]
    has_text: np.ndarray  # bool [n]: False for special tokens and ids without a tokenizer entry

    @classmethod
    def pack(cls, pieces: Sequence[Optional[bytes]], size: Optional[int] = None) -> "TokenBytes":
        size = len(pieces) if size is None else size
        padded = list(pieces[:size]) + [None] * max(0, size - len(pieces))
        offsets = np.zeros(size + 1, dtype=np.int64)
        offsets[1:] = np.cumsum([0 if p is None else len(p) for p in padded])
        data = np.frombuffer(b"".join(p for p in padded if p), dtype=np.uint8).copy()
        has_text = np.array([p is not None for p in padded], dtype=bool)
        return cls(data, offsets, has_text)

    def __len__(self) -> int:
        return len(self.has_text)

    def piece(self, token_id: int) -> Optional[bytes]:
        if not self.has_text[token_id]:
            return None
        return self.data[self.offsets[token_id]:self.offsets[token_id + 1]].tobytes()

    def pieces(self) -> list[Optional[bytes]]:
        return [self.piece(i) for i in range(len(self))]

    @cached_property
    def _word_edges(self) -> tuple[np.ndarray, np.ndarray]:
        """bool [n] twice: tokens whose text starts with an ASCII letter or digit, and tokens whose text ends with
        one (False for special tokens and empty pieces)."""
        lengths = np.diff(self.offsets)
        has = self.has_text & (lengths > 0)
        first = np.zeros(len(self), dtype=np.uint8)
        last = np.zeros(len(self), dtype=np.uint8)
        first[has] = self.data[self.offsets[:-1][has]]
        last[has] = self.data[self.offsets[1:][has] - 1]

        def alnum(b: np.ndarray) -> np.ndarray:
            return has & (((b >= 48) & (b <= 57)) | ((b >= 65) & (b <= 90)) | ((b >= 97) & (b <= 122)))
        return alnum(first), alnum(last)

    def same_word(self, left: int, right: int) -> bool:
        """Would `right` written after `left` go on the same word: `left` ends with a letter or digit and `right`
        starts with one? (A word's first token carries its leading space in byte-level BPE and SentencePiece
        vocabularies, so a token that starts with a letter continues the word before it: "N" + "yon".)"""
        starts, ends = self._word_edges
        return 0 <= left < len(ends) and 0 <= right < len(starts) and bool(ends[left] and starts[right])

    def starts_with(self, whole: int, part: int) -> bool:
        """Does `whole`'s text begin with `part`'s and go on after it ("(users" and "("): a writer that wrote `part`
        where a text had `whole` split that token, and its next tokens spell the rest or replace it?"""
        if not (0 <= whole < len(self) and 0 <= part < len(self)):
            return False
        whole_text, part_text = self.piece(whole), self.piece(part)
        return bool(whole_text and part_text) and len(part_text) < len(whole_text) and whole_text.startswith(part_text)


@dataclass
class VocabMap:
    target: TokenBytes
    draft: TokenBytes
    draft_to_target: np.ndarray  # int32 [draft size]
    target_to_draft: np.ndarray  # int32 [target size]

    @property
    def intersection(self) -> int:
        return int((self.draft_to_target != NO_TOKEN).sum())

    def save(self, path: Path) -> None:
        arrays = {"draft_to_target": self.draft_to_target, "target_to_draft": self.target_to_draft}
        for side in ("target", "draft"):
            tb: TokenBytes = getattr(self, side)
            arrays.update({f"{side}_data": tb.data, f"{side}_offsets": tb.offsets, f"{side}_has_text": tb.has_text})
        with open(path, "wb") as f:
            np.savez_compressed(f, **arrays)

    @classmethod
    def load(cls, path: Path) -> "VocabMap":
        with np.load(path, allow_pickle=False) as z:
            sides = {side: TokenBytes(z[f"{side}_data"], z[f"{side}_offsets"], z[f"{side}_has_text"])
                     for side in ("target", "draft")}
            return cls(sides["target"], sides["draft"], z["draft_to_target"], z["target_to_draft"])


def _index(pieces: Sequence[Optional[bytes]], byte_fallback: Sequence[bool]) -> dict[bytes, int]:
    """bytes -> preferred token id: regular tokens before byte-fallback ones, lowest id first."""
    index: dict[bytes, int] = {}
    for prefer_fallback in (False, True):
        for i, piece in enumerate(pieces):
            if piece and bool(byte_fallback[i]) == prefer_fallback:
                index.setdefault(piece, i)
    return index


def _one_way(src: Sequence[Optional[bytes]], dst_index: dict[bytes, int], size: int) -> np.ndarray:
    out = np.full(size, NO_TOKEN, dtype=np.int32)
    for i, piece in enumerate(src[:size]):
        if piece:
            out[i] = dst_index.get(piece, NO_TOKEN)
    return out


def build_vocab_map(target_pieces: Sequence[Optional[bytes]], target_fallback: Sequence[bool], target_size: int,
                    target_eos: Optional[int],
                    draft_pieces: Sequence[Optional[bytes]], draft_fallback: Sequence[bool], draft_size: int,
                    draft_eos: Optional[int]) -> VocabMap:
    """Map every token of each side to the token of the other side that spells exactly the same bytes.

    *_size is the number of logits of each model (it may exceed the tokenizer's vocabulary).
    """
    d2t = _one_way(draft_pieces, _index(target_pieces, target_fallback), draft_size)
    t2d = _one_way(target_pieces, _index(draft_pieces, draft_fallback), target_size)
    if target_eos is not None and draft_eos is not None and draft_eos < draft_size and target_eos < target_size:
        d2t[draft_eos] = target_eos
        t2d[target_eos] = draft_eos
    return VocabMap(TokenBytes.pack(target_pieces, target_size), TokenBytes.pack(draft_pieces, draft_size), d2t, t2d)
