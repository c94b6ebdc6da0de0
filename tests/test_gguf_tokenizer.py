"""A GGUF file's tokenizer rebuilt from its own fields (edge_specdec/export/gguf_tokenizer.py), on a vocabulary-only
GGUF written from the suite's byte-level tokenizer (support.write_vocab_gguf); the opt-in zoo tier checks twelve
real families."""
from __future__ import annotations

import pytest

from hostile_text import HOSTILE_STRINGS
from support import write_vocab_gguf


def test_a_gpt2_gguf_tokenizes_as_its_tokenizer(tokenizer_dir, tmp_path):
    from transformers import AutoTokenizer

    from edge_specdec.export.gguf_tokenizer import tokenizer_from_gguf

    original = AutoTokenizer.from_pretrained(tokenizer_dir("bytelevel"))
    rebuilt = tokenizer_from_gguf(write_vocab_gguf(tokenizer_dir("bytelevel"), tmp_path / "v.gguf", "gpt-2"))
    for text in HOSTILE_STRINGS + ["def f(x):\n    return x + 12345"]:
        assert rebuilt(text)["input_ids"] == original(text)["input_ids"], text
    assert rebuilt.eos_token == original.eos_token
    assert rebuilt.chat_template == "{{ messages[0]['content'] }}"


def test_the_pre_tokenizer_the_file_names_decides_the_splits(tokenizer_dir, tmp_path):
    """StarCoder's pre-tokenizer isolates every digit: no token spans two of them."""
    from edge_specdec.export.gguf_tokenizer import tokenizer_from_gguf

    gpt2 = tokenizer_from_gguf(write_vocab_gguf(tokenizer_dir("bytelevel"), tmp_path / "a.gguf", "gpt-2"))
    starcoder = tokenizer_from_gguf(write_vocab_gguf(tokenizer_dir("bytelevel"), tmp_path / "b.gguf", "starcoder"))
    text = "x = 1000 + 2000"
    assert starcoder.convert_ids_to_tokens(starcoder(text)["input_ids"]) == \
        ["x", "Ġ=", "Ġ", "1", "0", "0", "0", "Ġ+", "Ġ", "2", "0", "0", "0"]
    assert gpt2(text)["input_ids"] != starcoder(text)["input_ids"]


def test_an_unknown_pre_tokenizer_is_refused(tokenizer_dir, tmp_path):
    from edge_specdec.export.gguf_tokenizer import UnsupportedGGUFTokenizer, tokenizer_from_gguf

    with pytest.raises(UnsupportedGGUFTokenizer, match="pre-tokenizer 'no-such-pre'"):
        tokenizer_from_gguf(write_vocab_gguf(tokenizer_dir("bytelevel"), tmp_path / "v.gguf", "no-such-pre"))
