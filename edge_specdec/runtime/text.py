"""Text in and out: the bundle's OpenVINO tokenizer for prompts, token bytes for streamed output."""
from __future__ import annotations

import codecs
import threading
from pathlib import Path
from typing import Optional

import openvino as ov
import openvino_tokenizers  # noqa: F401  (registers the tokenizer operations with OpenVINO)

from ..vocab_map import TokenBytes


class PromptTokenizer:
    """Text -> token ids with the exported tokenizer IR (adds BOS where the model's tokenizer does)."""

    def __init__(self, tokenizer_xml: Path, core: Optional[ov.Core] = None):
        self.compiled = (core or ov.Core()).compile_model(str(tokenizer_xml), "CPU")
        self._lock = threading.Lock()  # the compiled model's own request serves one call at a time

    def encode(self, text: str) -> list[int]:
        with self._lock:
            return self.compiled([text])["input_ids"][0].tolist()


class TextStream:
    """Token ids -> text, incrementally: only whole UTF-8 characters come out, never half of one."""

    def __init__(self, pieces: TokenBytes):
        self.pieces = pieces
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.text = ""

    def push(self, token_ids: list[int]) -> str:
        """Add tokens; return the newly final text (may be empty while a character is incomplete)."""
        data = b"".join(self.pieces.piece(t) or b"" for t in token_ids)
        new = self._decoder.decode(data)
        self.text += new
        return new

    def finish(self) -> str:
        new = self._decoder.decode(b"", final=True)
        self.text += new
        return new


def decode(pieces: TokenBytes, token_ids: list[int]) -> str:
    stream = TextStream(pieces)
    stream.push(token_ids)
    stream.finish()
    return stream.text

