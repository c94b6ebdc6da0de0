"""A GGUF file's tokenizer as a Hugging Face fast tokenizer, rebuilt from the file's own `tokenizer.ggml.*` fields.

llama.cpp tokenizes with the vocabulary, merges and token types stored in the file, split first by the
pre-tokenizer that `tokenizer.ggml.pre` names (llama.cpp's src/llama-vocab.cpp keeps one list of regular
expressions per name). transformers' own GGUF reader ignores that name: its Llama 3, DeepSeek Coder and StarCoder
tokenizers split text otherwise than the models' own (Llama 3's on 11 of upstream's 46 test texts), and it saves a
Llama 2 file as a Code Llama tokenizer whose EOS is the BOS. The tokenizer built here splits as llama.cpp does, so
it gives the ids the model was trained on.

Kinds of `tokenizer.ggml.model`:
- "gpt2": byte-level BPE; the pre-tokenizer's regular expressions isolate pieces one after the other, then each
  byte is drawn as GPT-2's printable character;
- "llama": SentencePiece BPE with `<0xNN>` byte fallback (merges follow the pieces' scores), a space put in front
  of the text unless `tokenizer.ggml.add_space_prefix` is false;
- "gemma4": BPE over raw UTF-8 with spaces written U+2581, split only at runs of newlines, with byte fallback.
Control tokens become special tokens (no text); user-defined ones are matched literally in the text, as llama.cpp
matches them.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
LLAMA3_REGEX = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
               r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# tokenizer.ggml.pre -> llama.cpp's regular expressions for it, applied in order
PRE_TOKENIZERS = {
    "gpt-2": [GPT2_REGEX], "mpt": [GPT2_REGEX], "olmo": [GPT2_REGEX], "phi-2": [GPT2_REGEX],
    "starcoder": [r"\p{N}", GPT2_REGEX], "refact": [r"\p{N}", GPT2_REGEX], "command-r": [r"\p{N}", GPT2_REGEX],
    "smollm": [r"\p{N}", GPT2_REGEX],
    "llama-bpe": [LLAMA3_REGEX], "llama3": [LLAMA3_REGEX], "llama-v3": [LLAMA3_REGEX], "dbrx": [LLAMA3_REGEX],
    "smaug-bpe": [LLAMA3_REGEX],
    "qwen2": [QWEN2_REGEX], "stablelm2": [QWEN2_REGEX], "deepseek-r1-qwen": [QWEN2_REGEX],
    "deepseek-coder": [r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+",
                       r"\p{N}"],
}
# pre-tokenizers that look a whole piece up in the vocabulary before merging it (llama.cpp's ignore_merges)
WHOLE_WORDS_FIRST = {"llama-bpe", "llama3", "llama-v3"}
UNKNOWN, CONTROL, USER_DEFINED = 2, 3, 4  # values of tokenizer.ggml.token_type (1 normal, 5 unused, 6 byte)
SPECIAL_FIELDS = {"bos_token": "bos_token_id", "eos_token": "eos_token_id", "unk_token": "unknown_token_id",
                  "pad_token": "padding_token_id"}


class UnsupportedGGUFTokenizer(ValueError):
    """The file's tokenizer is of a kind this module does not rebuild (its message says which)."""


def gguf_tokenizer_fields(path: Path) -> dict[str, Any]:
    """The file's tokenizer.ggml.* fields, without the prefix ("model", "tokens", "merges", "token_type", ...), and
    its chat template (tokenizer.chat_template) as "chat_template"."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    prefix = "tokenizer.ggml."
    fields = {key[len(prefix):]: field.contents() for key, field in reader.fields.items() if key.startswith(prefix)}
    if "tokenizer.chat_template" in reader.fields:
        fields["chat_template"] = reader.fields["tokenizer.chat_template"].contents()
    return fields


def can_rebuild(fields: dict[str, Any]) -> bool:
    model = fields.get("model")
    return model in ("llama", "gemma4") or (model == "gpt2" and fields.get("pre") in PRE_TOKENIZERS)


def tokenizer_from_gguf(path: Path, fields: Optional[dict[str, Any]] = None):
    """The GGUF file's tokenizer as a transformers PreTrainedTokenizerFast (save it with save_pretrained).

    Raises UnsupportedGGUFTokenizer for a kind of tokenizer it does not know."""
    from transformers import PreTrainedTokenizerFast

    fields = gguf_tokenizer_fields(path) if fields is None else fields
    if not can_rebuild(fields):
        raise UnsupportedGGUFTokenizer(f"{Path(path).name}: tokenizer.ggml.model {fields.get('model')!r} with "
                                       f"pre-tokenizer {fields.get('pre')!r}")
    tokens = fields["tokens"]
    special = {name: tokens[fields[key]] for name, key in SPECIAL_FIELDS.items()
               if isinstance(fields.get(key), int) and 0 <= fields[key] < len(tokens)}
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=_backend(fields), **special)
    if fields.get("chat_template"):
        tokenizer.chat_template = fields["chat_template"]
    return tokenizer


def adds_bos(fields: dict[str, Any]) -> bool:
    """Whether the model's prompts start with BOS: the file's add_bos_token, else llama.cpp's default for its
    kind (SentencePiece and Llama 3 vocabularies add one, byte-level BPE ones do not)."""
    default = fields.get("model") == "llama" or fields.get("pre") in WHOLE_WORDS_FIRST
    return bool(fields.get("add_bos_token", default)) and isinstance(fields.get("bos_token_id"), int)


def _backend(fields: dict[str, Any]):
    model = fields["model"]
    if model == "gpt2":
        tokenizer = _byte_level_bpe(fields)
    elif model == "gemma4":
        tokenizer = _gemma4_bpe(fields)
    else:
        tokenizer = _sentencepiece_bpe(fields)
    _add_special_tokens(tokenizer, fields)
    if adds_bos(fields):
        from tokenizers import processors

        bos = fields["tokens"][fields["bos_token_id"]]
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A $B", special_tokens=[(bos, fields["bos_token_id"])])
    return tokenizer


def _merges(fields: dict[str, Any]) -> list[tuple[str, str]]:
    """The "a b" merge rules, split as llama.cpp splits them: at the first space after the first character."""
    out = []
    for rule in fields["merges"]:
        cut = rule.find(" ", 1)
        out.append((rule[:cut], rule[cut + 1:]))
    return out


def _byte_level_bpe(fields: dict[str, Any]):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    pre = fields.get("pre")
    vocab = {token: i for i, token in enumerate(fields["tokens"])}
    tokenizer = Tokenizer(models.BPE(vocab, _merges(fields), ignore_merges=pre in WHOLE_WORDS_FIRST))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in PRE_TOKENIZERS[pre]]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def _gemma4_bpe(fields: dict[str, Any]):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    vocab = {token: i for i, token in enumerate(fields["tokens"])}
    tokenizer = Tokenizer(models.BPE(vocab, _merges(fields), byte_fallback=True, unk_token=_unk(fields)))
    tokenizer.normalizer = normalizers.Replace(" ", "▁")
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[^\n]+|[\n]+"), behavior="isolated")
    tokenizer.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    return tokenizer


def _sentencepiece_bpe(fields: dict[str, Any]):
    """SentencePiece BPE: the pair whose merged piece scores highest merges first, so the merge rules are every
    split of every piece into two pieces, ranked by the whole piece's score."""
    from tokenizers import Tokenizer, decoders, models, normalizers

    tokens, scores = fields["tokens"], fields["scores"]
    vocab = {token: i for i, token in enumerate(tokens)}
    ranked = []
    for i, piece in enumerate(tokens):
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                ranked.append((-scores[i], vocab[left], vocab[right], left, right))
    ranked.sort()
    merges = [(left, right) for *_, left, right in ranked]
    tokenizer = Tokenizer(models.BPE(vocab, merges, byte_fallback=True, unk_token=_unk(fields), fuse_unk=True))
    prefix = fields.get("add_space_prefix", True)
    replace = normalizers.Replace(" ", "▁")
    tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), replace]) if prefix else replace
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    tokenizer.decoder = decoders.Sequence(steps + ([decoders.Strip(content=" ", left=1)] if prefix else []))
    return tokenizer


def _unk(fields: dict[str, Any]) -> Optional[str]:
    unk = fields.get("unknown_token_id")
    return fields["tokens"][unk] if isinstance(unk, int) else None


def _add_special_tokens(tokenizer, fields: dict[str, Any]) -> None:
    from tokenizers import AddedToken

    tokens, types = fields["tokens"], fields["token_type"]
    tokenizer.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                                  for i, kind in enumerate(types) if kind in (CONTROL, UNKNOWN)])
    tokenizer.add_tokens([AddedToken(tokens[i], special=False, normalized=False)
                          for i, kind in enumerate(types) if kind == USER_DEFINED])
