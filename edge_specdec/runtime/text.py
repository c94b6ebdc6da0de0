"""Text in and out: the bundle's OpenVINO tokenizer for prompts, token bytes for streamed output."""
from __future__ import annotations

import codecs
import threading
from pathlib import Path
from typing import NamedTuple, Optional

import openvino as ov
import openvino_tokenizers  # noqa: F401  (registers the tokenizer operations with OpenVINO)

from ..vocab_map import TokenBytes


class PromptTokenizer:
    """Text -> token ids with the exported tokenizer IR (adds BOS where the model's tokenizer does)."""

    def __init__(self, tokenizer_xml: Path, core: Optional[ov.Core] = None):
        self.compiled = (core or ov.Core()).compile_model(str(tokenizer_xml), "CPU")
        self._lock = threading.Lock()  # the compiled model's own request serves one call at a time
        self.added = self.encode("")  # the special tokens the tokenizer puts before any text (a BOS, or none)

    def encode(self, text: str, add_special: bool = True) -> list[int]:
        """The text's token ids; add_special False leaves out the special tokens the tokenizer puts before it."""
        with self._lock:
            ids = self.compiled([text])["input_ids"][0].tolist()
        if not add_special and self.added and ids[:len(self.added)] == self.added:
            return ids[len(self.added):]
        return ids


def unfinished_end(text: str, marks) -> int:
    """The length of the longest end of text that one of marks starts with (and is not yet all of): text a
    stream must hold back until it knows whether the mark follows."""
    return max((n for mark in marks for n in range(min(len(mark) - 1, len(text)), 0, -1)
                if text.endswith(mark[:n])), default=0)


class Span(NamedTuple):
    """A run of generated text from one source, and how many tokens it holds. source: "draft" (proposed by the
    drafter and accepted by the target), "grammar" (forced by the request's grammar, proposed without the
    drafter and accepted by the target) or "target" (the target's own token of the round)."""
    text: str
    source: str
    tokens: int

    @property
    def drafted(self) -> bool:
        """Proposed by the drafter and accepted by the target."""
        return self.source == "draft"


class TextPiece(str):
    """A piece of generated text, as on_text and the stream iterators hand it over: a str that also knows its
    spans (which characters came from accepted drafted tokens and which the target wrote itself), the ids of
    the tokens it completes and, when the config asked for them, their logprobs."""
    spans: tuple[Span, ...]
    token_ids: tuple[int, ...]
    logprobs: tuple = ()

    def __new__(cls, spans: list[Span], token_ids: list[int], logprobs: list = ()) -> "TextPiece":
        piece = super().__new__(cls, "".join(span.text for span in spans))
        piece.spans, piece.token_ids, piece.logprobs = tuple(spans), tuple(token_ids), tuple(logprobs)
        return piece


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

