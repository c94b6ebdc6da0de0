"""Token byte strings and the vocabulary map, checked against the Hugging Face tokenizers themselves."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edge_specdec.export.token_bytes import bytes_to_unicode, token_table
from edge_specdec.vocab_map import NO_TOKEN, VocabMap, build_vocab_map
from hostile_text import HOSTILE_STRINGS

STYLES = ["bytelevel", "metaspace", "prefixspace"]


def expected_bytes(style: str, text: str) -> bytes:
    """What the concatenated token bytes of `text` must spell, by the tokenizer's documented convention."""
    if style == "bytelevel":
        return text.encode()
    if style == "metaspace":  # Llama-2: a space is prepended, then every space is U+2581
        return (" " + text).encode()
    # prefix-space byte-level BPE: a space is added unless the text already starts with one
    return text.encode() if text.startswith(" ") else (" " + text).encode()


def spelled(tok, table, text: str) -> bytes:
    ids = tok(text, add_special_tokens=False)["input_ids"]
    return b"".join(table.pieces[i] for i in ids)


@pytest.fixture(scope="module")
def tokenizers(tokenizer_dir):
    from transformers import AutoTokenizer
    return {s: (AutoTokenizer.from_pretrained(tokenizer_dir(s)), token_table(tokenizer_dir(s))) for s in STYLES}


def test_gpt2_byte_table_is_a_bijection():
    table = bytes_to_unicode()
    assert sorted(table) == list(range(256))
    assert len(set(table.values())) == 256
    assert table[ord(" ")] == "Ġ" and table[ord("\n")] == "Ċ"


@pytest.mark.parametrize("style", STYLES)
def test_token_bytes_spell_hostile_text(tokenizers, style):
    tok, table = tokenizers[style]
    assert table.style == ("metaspace" if style == "metaspace" else "bytelevel")
    for text in HOSTILE_STRINGS:
        if text:
            assert spelled(tok, table, text) == expected_bytes(style, text), repr(text)


@pytest.mark.parametrize("style", STYLES)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(min_size=1, max_size=40))
def test_token_bytes_spell_random_text(tokenizers, style, text):
    tok, table = tokenizers[style]
    if any(special in text for special in tok.all_special_tokens):
        return  # the text of a special token is read as that token, which spells no bytes (by design)
    if style == "metaspace" and ("<0x" in text or "\u2581" in text):
        # literal "<0xNN>" text is spelled by its characters (covered by the hostile strings); a literal U+2581 is
        # the space marker itself, which the tokenizer's own decoder also turns into a space
        return
    assert spelled(tok, table, text) == expected_bytes(style, text)


def test_special_and_byte_fallback_tokens(tokenizers):
    tok, table = tokenizers["metaspace"]
    assert table.pieces[tok.convert_tokens_to_ids("<s>")] is None
    assert table.pieces[tok.convert_tokens_to_ids("</s>")] is None
    byte_a = tok.convert_tokens_to_ids("<0x41>")
    assert table.pieces[byte_a] == b"A" and table.byte_fallback[byte_a]
    assert sum(table.byte_fallback) == 256
    # a character the tiny vocabulary has never seen is spelled with byte-fallback tokens
    ids = tok("☃", add_special_tokens=False)["input_ids"]
    assert all(table.byte_fallback[i] for i in ids if table.pieces[i] != b" ")


def brute_force_candidates(src_pieces, dst_pieces):
    """For every source token with text: the set of destination ids that spell exactly the same bytes."""
    return [set() if p is None else {j for j, q in enumerate(dst_pieces) if q == p} for p in src_pieces]


@pytest.mark.parametrize("target_style,draft_style", [("bytelevel", "metaspace"), ("bytelevel", "prefixspace"),
                                                      ("metaspace", "prefixspace"), ("bytelevel", "bytelevel")])
def test_vocab_map_matches_brute_force(tokenizers, target_style, draft_style):
    (ttok, t), (dtok, d) = tokenizers[target_style], tokenizers[draft_style]
    t_eos, d_eos = ttok.eos_token_id, dtok.eos_token_id
    vmap = build_vocab_map(t.pieces, t.byte_fallback, len(t) + 3, t_eos, d.pieces, d.byte_fallback, len(d), d_eos)
    assert vmap.draft_to_target.shape == (len(d),) and vmap.target_to_draft.shape == (len(t) + 3,)
    assert (vmap.target_to_draft[len(t):] == NO_TOKEN).all()  # logits past the tokenizer map to nothing
    for src, dst, forward, eos_pair in ((d, t, vmap.draft_to_target, (d_eos, t_eos)),
                                        (t, d, vmap.target_to_draft, (t_eos, d_eos))):
        candidates = brute_force_candidates(src.pieces, dst.pieces)
        for i, cands in enumerate(candidates):
            got = int(forward[i])
            if i == eos_pair[0]:
                assert got == eos_pair[1]
            elif not cands:
                assert got == NO_TOKEN, (i, src.pieces[i])
            else:
                assert got in cands
                assert src.pieces[i] == dst.pieces[got]  # bytes round-trip
                regular = {j for j in cands if not dst.byte_fallback[j]}
                assert got == min(regular or cands)
    if target_style == draft_style:
        text_ids = [i for i, p in enumerate(d.pieces) if p is not None]
        assert (vmap.draft_to_target[text_ids] == text_ids).all()


def test_vocab_map_save_load_roundtrip(tokenizers, tmp_path):
    (ttok, t), (dtok, d) = tokenizers["bytelevel"], tokenizers["metaspace"]
    vmap = build_vocab_map(t.pieces, t.byte_fallback, len(t), ttok.eos_token_id,
                           d.pieces, d.byte_fallback, len(d), dtok.eos_token_id)
    vmap.save(tmp_path / "m.npz")
    loaded = VocabMap.load(tmp_path / "m.npz")
    assert loaded.target.pieces() == list(t.pieces) and loaded.draft.pieces() == list(d.pieces)
    assert (loaded.draft_to_target == vmap.draft_to_target).all()
    assert (loaded.target_to_draft == vmap.target_to_draft).all()
    assert loaded.intersection == vmap.intersection > 0


# --- the properties of every pair of vocabularies (the opt-in zoo tier checks them on twelve real families) --------

@pytest.fixture(scope="module")
def sides(tokenizers):
    from vocab_properties import Side

    return {s: Side(s, table, tok.eos_token_id, lambda text, t=tok: t(text, add_special_tokens=False)["input_ids"])
            for s, (tok, table) in tokenizers.items()}


@pytest.mark.parametrize("target_style,draft_style", [(t, d) for t in STYLES for d in STYLES if t != d])
def test_pair_properties_of_the_suite_styles(sides, target_style, draft_style):
    from vocab_properties import (check_mapped_ids_spell_the_same, check_retokenize_round_trip, check_twins_meet,
                                  check_vocab_map, pair_map)

    t, d = sides[target_style], sides[draft_style]
    vmap = pair_map(t, d)
    check_vocab_map(t, d, vmap)
    twins = check_twins_meet(d, t, vmap.draft_to_target) + check_twins_meet(t, d, vmap.target_to_draft)
    if "metaspace" in (target_style, draft_style):
        assert twins > 0  # the byte-fallback twins of its single-character tokens
    for text in HOSTILE_STRINGS:
        check_retokenize_round_trip(t, d, text)
        check_mapped_ids_spell_the_same(t, d, vmap, text)
