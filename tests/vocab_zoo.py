"""The vocabulary zoo: real tokenizers of twelve model families, rebuilt from vocabulary-only GGUF files.

The zoo is a folder of `ggml-vocab-<family>.gguf` files (the tokenizer and no weights), most with upstream's test
texts (`.inp`) and the ids the family's real tokenizer gives them (`.out`). `EDGE_SPECDEC_VOCAB_ZOO=DIR` points the
opt-in tests at it. Each family is rebuilt as a Hugging Face fast tokenizer folder (tokenizer.json), which is what
the export stage reads:
- transformers reads six families itself (`AutoTokenizer.from_pretrained(DIR, gguf_file=...)`);
- the six it refuses are built here from the GGUF's own `tokenizer.ggml.*` fields, with the pre-tokenizer llama.cpp
  uses for the file's `tokenizer.ggml.pre` (llama.cpp's src/llama-vocab.cpp, the reference the .out ids come from).

    python tests/vocab_zoo.py table     # the docs' families x families table (needs EDGE_SPECDEC_VOCAB_ZOO)
"""
from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

ZOO_ENV = "EDGE_SPECDEC_VOCAB_ZOO"
SEPARATOR = "\n__ggml_vocab_test__\n"

# family -> whether transformers' GGUF reader accepts it ("transformers") or refuses it ("fields")
FAMILIES = {
    "llama-bpe": "transformers", "llama-spm": "transformers", "qwen2": "transformers", "gpt-2": "transformers",
    "starcoder": "transformers", "deepseek-coder": "transformers",
    "gemma-4": "fields", "command-r": "fields", "mpt": "fields", "gpt-neox": "fields", "baichuan": "fields",
    "refact": "fields",
}
# families whose file names no tokenizer.ggml.pre: the pre-tokenizer of the family's own tokenizer.json
# (GPT-NeoX splits with GPT-2's regular expression; llama.cpp falls back to a "default" it warns about)
MISSING_PRE = {"gpt-neox": "gpt-2"}
# SentencePiece families: a space is put in front of the text (llama.cpp's add_space_prefix, on by default)
SPACE_PREFIX = {"llama-spm", "baichuan"}


def zoo_dir() -> Optional[Path]:
    """The zoo folder named by EDGE_SPECDEC_VOCAB_ZOO, or None when unset or absent."""
    value = os.environ.get(ZOO_ENV)
    if not value or not Path(value).expanduser().is_dir():
        return None
    return Path(value).expanduser()


def gguf_path(zoo: Path, family: str) -> Path:
    return zoo / f"ggml-vocab-{family}.gguf"


def upstream_cases(zoo: Path, family: str) -> Optional[list[tuple[str, list[int]]]]:
    """Upstream's (text, expected ids) pairs for the family, or None when the zoo has none for it.

    The .inp file is every text followed by the separator line; the .out file has one line of ids per text, as
    the family's Hugging Face tokenizer gave them with add_special_tokens=False (no BOS)."""
    inp, out = gguf_path(zoo, family).with_suffix(".gguf.inp"), gguf_path(zoo, family).with_suffix(".gguf.out")
    if not inp.is_file() or not out.is_file():
        return None
    texts = inp.read_text(encoding="utf-8").split(SEPARATOR)
    if texts and texts[-1] == "":
        texts.pop()
    lines = out.read_text(encoding="utf-8").split("\n")
    ids = [[int(t) for t in line.split()] for line in lines[:len(texts)]]
    assert len(ids) == len(texts), f"{out}: {len(ids)} lines for {len(texts)} texts"
    return list(zip(texts, ids))


@dataclass
class Family:
    """One family's rebuilt tokenizer: its folder (tokenizer.json and tokenizer_config.json) and the fast tokenizer."""
    name: str
    folder: Path
    tokenizer: object  # transformers.PreTrainedTokenizerFast
    eos_token_id: Optional[int]
    bos_token_id: Optional[int]


def build_family(zoo: Path, family: str, out: Path, reader: str = "fields") -> Path:
    """Write the family's tokenizer to `out` (a Hugging Face tokenizer folder) and return `out`. reader: "fields"
    (the project's reader of the GGUF's own fields) or "transformers" (transformers' GGUF reader)."""
    from transformers import AutoTokenizer

    from edge_specdec.export.gguf_tokenizer import gguf_tokenizer_fields, tokenizer_from_gguf

    path = gguf_path(zoo, family)
    if reader == "transformers":
        tokenizer = AutoTokenizer.from_pretrained(str(zoo), gguf_file=path.name)
    else:
        fields = gguf_tokenizer_fields(path)
        fields.setdefault("pre", MISSING_PRE.get(family))
        tokenizer = tokenizer_from_gguf(path, fields)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(out))
    return out


def side_of(folder: Path, name: str):
    """The family's vocabulary as the property checks see it (tests/vocab_properties.py's Side)."""
    from tokenizers import Tokenizer

    from edge_specdec.export.token_bytes import token_table
    from vocab_properties import Side

    backend = Tokenizer.from_file(str(folder / "tokenizer.json"))
    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    eos = backend.token_to_id(config["eos_token"]) if config.get("eos_token") else None
    return Side(name, token_table(folder), eos, lambda text: backend.encode(text, add_special_tokens=False).ids)


def pair_figures(target, draft, texts: list[str]) -> tuple[float, float]:
    """(shared, coverage) of a target and a draft Side: the share of the target's text tokens whose bytes a draft
    token spells, and the share of the target's tokens of `texts` that the vocabulary map sends to a draft token."""
    from edge_specdec.vocab_map import NO_TOKEN
    from vocab_properties import pair_map

    vmap = pair_map(target, draft)
    text_ids = [i for i, piece in enumerate(target.table.pieces) if piece]
    shared = sum(int(vmap.target_to_draft[i]) != NO_TOKEN for i in text_ids) / len(text_ids)
    used = [t for text in texts for t in target.encode(text)]
    covered = sum(int(vmap.target_to_draft[t]) != NO_TOKEN for t in used) / max(1, len(used))
    return shared, covered


def print_table(zoo: Path, scratch: Path) -> None:
    """The docs' tables: one row per target family, one column per draft family."""
    sides = {name: side_of(build_family(zoo, name, scratch / name), name) for name in FAMILIES}
    texts = list(dict.fromkeys(t for name in FAMILIES for t, _ in (upstream_cases(zoo, name) or [])))
    figures = {(t, d): pair_figures(sides[t], sides[d], texts) for t in FAMILIES for d in FAMILIES if t != d}
    for title, k in (("shared strings", 0), ("coverage of the test texts", 1)):
        print(f"\n{title} (rows: target, columns: draft)\n")
        print("| target \\ draft | " + " | ".join(FAMILIES) + " |")
        print("|---" * (len(FAMILIES) + 1) + "|")
        for t in FAMILIES:
            cells = ["-" if t == d else f"{100 * figures[t, d][k]:.0f}" for d in FAMILIES]
            print(f"| {t} ({len(sides[t].table):,}) | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    import tempfile

    sys.path.insert(0, str(Path(__file__).parent))
    if sys.argv[1:] != ["table"] or zoo_dir() is None:
        sys.exit(print(__doc__))
    with tempfile.TemporaryDirectory() as scratch:
        print_table(zoo_dir(), Path(scratch))
