"""Properties every pair of vocabularies must have, checked without a model: the vocabulary map (what export
builds) and the retokenizer (how the runtime spells one side's text in the other's tokens).

Each check takes two `Side`s (a tokenizer's encode and its token table) and raises AssertionError with the first
counterexample. The default suite runs them on its own three tokenizer styles (test_vocab_map.py), the opt-in zoo
tier on all 132 ordered pairs of twelve real families (test_vocab_zoo.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

from edge_specdec.export.token_bytes import TokenTable
from edge_specdec.runtime.retokenize import Retokenizer
from edge_specdec.vocab_map import NO_TOKEN, TokenBytes, VocabMap, build_vocab_map

PAD_LOGITS = 3  # each side's model is given this many logits past its tokenizer (padding that spells nothing)


@dataclass
class Side:
    """One vocabulary: its name, token table, EOS id, and text -> ids without special tokens."""
    name: str
    table: TokenTable
    eos: Optional[int]
    encode: Callable[[str], list[int]]
    _retokenizer: Optional[Retokenizer] = field(default=None, repr=False)
    _spellings: Optional[dict[bytes, list[int]]] = field(default=None, repr=False)

    @property
    def size(self) -> int:
        return len(self.table) + PAD_LOGITS

    def retokenizer(self) -> Retokenizer:
        """This side's retokenizer (its index spans the whole vocabulary: built once)."""
        if self._retokenizer is None:
            self._retokenizer = Retokenizer(self.encode, TokenBytes.pack(self.table.pieces, self.size))
        return self._retokenizer


def pair_map(target: Side, draft: Side) -> VocabMap:
    t, d = target.table, draft.table
    return build_vocab_map(t.pieces, t.byte_fallback, target.size, target.eos,
                           d.pieces, d.byte_fallback, draft.size, draft.eos)


def spellings(side: Side) -> dict[bytes, list[int]]:
    """bytes -> every id that spells exactly them, in id order (computed once per side)."""
    if side._spellings is None:
        out: dict[bytes, list[int]] = {}
        for i, piece in enumerate(side.table.pieces):
            if piece:
                out.setdefault(piece, []).append(i)
        side._spellings = out
    return side._spellings


def preferred(ids: list[int], table: TokenTable) -> int:
    """The id a map must choose among tokens of equal bytes: a regular token before a <0xNN> byte-fallback one,
    then the lowest id."""
    regular = [i for i in ids if not table.byte_fallback[i]]
    return min(regular or ids)


def check_one_way(src: Side, dst: Side, forward, dst_spellings: dict[bytes, list[int]]) -> None:
    """Every src token maps to the preferred dst token of exactly its bytes, or to nothing when no dst token spells
    them; tokens without text and padded logits map to nothing, EOS to EOS."""
    assert len(forward) == src.size
    for i in range(src.size):
        got = int(forward[i])
        piece = src.table.pieces[i] if i < len(src.table) else None
        if i == src.eos and dst.eos is not None:
            assert got == dst.eos, f"{src.name} EOS {i} -> {got}, not {dst.name}'s EOS {dst.eos}"
        elif not piece:
            assert got == NO_TOKEN, f"{src.name} token {i} spells no text but maps to {dst.name} {got}"
        elif piece not in dst_spellings:
            assert got == NO_TOKEN, f"{src.name} token {i} {piece!r}: no {dst.name} token spells it, mapped to {got}"
        else:
            want = preferred(dst_spellings[piece], dst.table)
            assert got == want, f"{src.name} token {i} {piece!r} -> {got}, want {want} of {dst_spellings[piece]}"


def check_vocab_map(target: Side, draft: Side, vmap: VocabMap) -> None:
    check_one_way(draft, target, vmap.draft_to_target, spellings(target))
    check_one_way(target, draft, vmap.target_to_draft, spellings(draft))
    assert vmap.target.pieces()[:len(target.table)] == list(target.table.pieces)
    assert vmap.draft.pieces()[:len(draft.table)] == list(draft.table.pieces)


def check_twins_meet(src: Side, dst: Side, forward) -> int:
    """Tokens of src that spell the same bytes (a byte-fallback twin and its regular token, duplicate spellings)
    all map to one dst id. Returns how many such groups were checked."""
    groups = 0
    for piece, ids in spellings(src).items():
        if len(ids) > 1:
            targets = {int(forward[i]) for i in ids if i != src.eos}
            assert len(targets) == 1, f"{src.name} ids {ids} all spell {piece!r} but map to {sorted(targets)}"
            groups += 1
    return groups


def spelled_bytes(side: Side, ids: list[int]) -> bytes:
    return b"".join(side.table.pieces[i] or b"" for i in ids)


def check_retokenize_round_trip(target: Side, draft: Side, text: str) -> None:
    """The target writes `text` one token at a time; the draft's retokenizer spells each new token's bytes after
    the draft tokens of everything before, and the draft's tokens spell, at every step, exactly the target's
    bytes. Where the draft's text tokens map to target ids, those spell the same bytes."""
    t_ids = target.encode(text)
    retok = draft.retokenizer()
    d_ids: list[int] = []
    for step, t in enumerate(t_ids):
        new = target.table.pieces[t]
        if not new:
            continue
        got = retok.continuation(d_ids, new)
        assert spelled_bytes(draft, got) == new, (
            f"{draft.name} spelled {spelled_bytes(draft, got)!r} for {target.name} token {t} {new!r} "
            f"(step {step} of {text!r})")
        d_ids += got
    assert spelled_bytes(draft, d_ids) == spelled_bytes(target, t_ids)


def check_mapped_ids_spell_the_same(target: Side, draft: Side, vmap: VocabMap, text: str) -> None:
    """The draft's own tokens of `text`, mapped to the target where the map has them, spell the same bytes."""
    for d in draft.encode(text):
        t = int(vmap.draft_to_target[d])
        if t != NO_TOKEN and d != draft.eos:
            assert target.table.pieces[t] == draft.table.pieces[d], (d, t)
