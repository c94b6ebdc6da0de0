"""Text -> tokens of one vocabulary, for text that continues tokens already fixed.

Tokenization is not compositional: "de" + "f" is not how a tokenizer splits "def", a SentencePiece tokenizer
puts a U+2581 dummy prefix in front of whatever text it is given, and a byte-level token can end in the
middle of a UTF-8 character. `Retokenizer.continuation(context, new)` therefore tokenizes a window that
reaches back over the last few context tokens plus the new bytes, and keeps the tokens that spell exactly
the new bytes, aligned from the end (so a dummy prefix or a BOS in front does no harm). Where a window
token straddles the boundary, or the tokenizer does not spell its input back byte for byte (normalizers),
the affected bytes are spelled by greedy longest match over the vocabulary instead. Every result spells
exactly its input: callers rely on that, and losslessness never depends on how natural the split is.
"""
from __future__ import annotations

from typing import Callable, Optional

from ..vocab_map import TokenBytes

WINDOW = 4  # context tokens re-tokenized together with the new text


def complete_utf8(data: bytes) -> int:
    """Length of the longest prefix of data that does not end inside a UTF-8 character."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte < 0x80:
            return len(data) if back == 1 else len(data) - back + 1
        if byte >= 0xC0:  # a lead byte: is its character complete?
            need = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return len(data) if back >= need else len(data) - back
    return len(data)


class Retokenizer:
    """Spells byte strings as tokens of one vocabulary (see the module docstring)."""

    def __init__(self, encode: Callable[[str], list[int]], pieces: TokenBytes, window: int = WINDOW):
        self.encode, self.pieces, self.window = encode, pieces, window
        self._index: Optional[dict[bytes, int]] = None
        self._max_len = 0

    def bytes_of(self, token_ids: list[int]) -> bytes:
        return b"".join(self.pieces.piece(t) or b"" for t in token_ids)

    @property
    def index(self) -> dict[bytes, int]:
        """bytes -> token id; where several tokens spell the same bytes, the lowest id (in SentencePiece
        vocabularies that is the <0xNN> byte-fallback twin of a single-character token)."""
        if self._index is None:
            index: dict[bytes, int] = {}
            for i in range(len(self.pieces)):
                piece = self.pieces.piece(i)
                if piece:
                    index.setdefault(piece, i)
            self._index = index
            self._max_len = max(map(len, index), default=1)
        return self._index

    def longest_prefix(self, data: bytes, start: int = 0) -> Optional[int]:
        """The longest token that spells a prefix of data[start:], or None."""
        index = self.index
        for size in range(min(self._max_len, len(data) - start), 0, -1):
            token = index.get(data[start:start + size])
            if token is not None:
                return token
        return None

    def longest_match(self, data: bytes) -> list[int]:
        """Greedy longest-match spelling; stops early at a byte no token spells (the caller sees a short result)."""
        out, pos = [], 0
        while pos < len(data):
            token = self.longest_prefix(data, pos)
            if token is None:
                break
            out.append(token)
            pos += len(self.pieces.piece(token))
        return out

    def continuation(self, context: list[int], new: bytes) -> list[int]:
        """Tokens that spell exactly `new` (or a prefix of it, if some byte has no token) after `context`."""
        if not new:
            return []
        anchor_ids: list[int] = []
        for token in reversed(context[-self.window:]):
            if not self.pieces.has_text[token]:
                break  # never re-tokenize across a special token
            anchor_ids.insert(0, token)
        anchor = self.bytes_of(anchor_ids)
        while anchor and 0x80 <= anchor[0] < 0xC0:  # start on a character boundary
            anchor = anchor[1:]
        text = anchor + new
        head = complete_utf8(text)
        if head <= len(anchor):
            return self.longest_match(new)
        try:
            decoded = text[:head].decode("utf-8")
        except UnicodeDecodeError:
            return self.longest_match(new)
        ids = [t for t in self.encode(decoded) if self.pieces.has_text[t]]
        lengths = [len(self.pieces.piece(t)) for t in ids]
        if not self.bytes_of(ids).endswith(text[:head]):
            return self.longest_match(new)
        # walk back from the end until the tokens cover exactly the new part of the window
        want, covered, i = head - len(anchor), 0, len(ids)
        while i > 0 and covered + lengths[i - 1] <= want:
            covered += lengths[i - 1]
            i -= 1
        straddled = new[:want - covered]  # bytes of a token that began inside the anchor
        out = self.longest_match(straddled)
        if self.bytes_of(out) != straddled:
            return out
        return out + ids[i:] + self.longest_match(new[want:])
