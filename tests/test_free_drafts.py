"""Free drafts: copies of text the target has seen (the request's own, and earlier requests' in the draft pool),
proposed without a draft model, first in a draft model's rounds; lossless greedy and sampled, repeatable seeded."""
from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pytest

from edge_specdec.runtime import Engine, GenerationConfig, Pipeline
from edge_specdec.runtime.drafters import Proposal
from edge_specdec.runtime.sources import FIRST_PAUSE, OPENING_MATCH, STRONG_MATCH, TRIAL_ROUNDS, FreeFirst
from edge_specdec.runtime.retokenize import Retokenizer
from edge_specdec.runtime.suffix import (FREE_TOKENS, POOL_MATCH, RESUME_FROM_MATCH, RESUME_SHARE, RESUME_SPAN,
                                         RESUME_TRIES, RESUMED_MATCH, Copy, DraftPool, Rename, SuffixDrafter,
                                         TokenIndex, as_proposal, best_copy, renamed_word)
from edge_specdec.vocab_map import TokenBytes
from hostile_text import HOSTILE_STRINGS
from support import (ALPHA, N_SAMPLES, OTHER_VOCAB, SAME_VOCAB, SAMPLING, bits, forced_logprobs, homogeneity_pvalue,
                     logprob_bits)

REPEATING = ["def f(x):\n    return x\n" * 3 + "def f(x):\n", "a b a b a b a b",
             "def f(x):\n    return x\n\ndef g(x):\n    return x\n\ndef h(x):\n",
             "one two three four. one two three four. one two"]


def opened(drafter: FreeFirst) -> FreeFirst:
    """The drafter as it is once the target kept a copied token in its request: copies on short matches go out too
    (before that, only those on a match of OPENING_MATCH tokens or more)."""
    drafter.opened = True
    return drafter


class Recorder:
    """A stand-in draft model: proposes [7] and records each call."""

    def __init__(self):
        self.calls = []

    def propose(self, sequence, k):
        self.calls.append((list(sequence), k))
        return Proposal([7] * min(k, 2), None)

    def accept(self, n, token):
        pass

    def constrain(self, grammar):
        pass

    def stats(self):
        return {}


# --- the index, the copy and the pool, without a model ------------------------------------------------------------

def test_the_longest_match_is_copied_and_its_most_frequent_continuation_wins():
    # (1, 2) is followed by 3 twice and by 4 once; the longer context (9, 1, 2) matched only where 5 follows
    index = TokenIndex([1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 4, 0, 9, 1, 2, 5, 6, 0])
    assert best_copy([("suffix", index, False)], [7, 1, 2], 4).tokens[0] == 3
    copy = best_copy([("suffix", index, False)], [9, 1, 2], 4)
    assert copy.tokens == [5, 6, 0] and copy.match == 3 and copy.expected == pytest.approx(3.0)


def test_the_request_index_does_not_match_its_own_end_and_follows_its_sequence():
    drafter = SuffixDrafter([5, 6, 7, 8, 9])
    assert drafter.copy([5, 6, 7, 8, 9]) is None  # (8, 9) occurs only at the end itself
    found = drafter.copy([5, 6, 7, 8, 9, 5, 6])
    assert found.tokens == [7, 8, 9, 5] and found.source == "suffix"  # 2 matched tokens: up to 2x2 copied
    assert drafter.own.tokens == [5, 6, 7, 8, 9, 5, 6]
    drafter.sync([5, 6, 7, 8, 1])  # a guessed sequence that did not come true: cut back, then grown
    assert drafter.own.tokens == [5, 6, 7, 8, 1] and drafter.copy([5, 6, 7, 8, 1, 5, 6]).tokens[:2] == [7, 8]


def test_a_copy_grows_while_the_target_keeps_it_and_shrinks_when_it_does_not():
    body = list(range(20, 40))
    drafter = SuffixDrafter([1, 2] + body + [9])
    sequence = [1, 2] + body + [9, 1, 2]
    assert len(drafter.copy(sequence).tokens) == 4  # a 2-token match: twice as many
    drafter.verified(Proposal(body[:4], copied=4, source="suffix"), 4, 0.1)
    assert len(drafter.copy(sequence).tokens) == 8
    drafter.verified(Proposal(body[:8], copied=8, source="suffix"), 1, 0.1)
    assert len(drafter.copy(sequence).tokens) == 4


def test_the_pool_keeps_earlier_requests_within_its_bound_per_scope():
    pool = DraftPool(max_tokens=40)
    alice = list(range(100, 112))
    pool.add(alice, scope="alice")
    asks = [1] + alice[:POOL_MATCH]  # a request whose end matches POOL_MATCH tokens of alice's earlier one
    drafter = SuffixDrafter(asks, pool, scope="alice")
    assert drafter.copy(asks).tokens[:2] == alice[POOL_MATCH:POOL_MATCH + 2] and drafter.copy(asks).source == "pool"
    assert SuffixDrafter(asks, pool, scope="bob").copy(asks) is None  # another key sees nothing
    pool.add(list(range(200, 212)), scope="bob")
    later = list(range(300, 316))
    pool.add(later, scope="alice")  # over 40 tokens: the oldest document goes
    assert pool.describe() == {"max_tokens": 40, "tokens": 30, "documents": 2, "scopes": 2}
    assert SuffixDrafter(asks, pool, scope="alice").copy(asks) is None
    asks_later = later[:POOL_MATCH]
    assert SuffixDrafter(asks_later, pool, scope="alice").copy(asks_later).tokens[0] == later[POOL_MATCH]
    pool.forget("alice")
    assert SuffixDrafter(asks_later, pool, scope="alice").copy(asks_later) is None
    assert pool.describe()["documents"] == 1
    pool.forget()
    assert pool.describe() == {"max_tokens": 40, "tokens": 0, "documents": 0, "scopes": 0}


def test_the_pool_is_copied_from_only_on_a_long_match():
    """Other requests share the chat template's turn header and instructions with this one: a match that short in
    the pool (an answer's start) is no sign the answer repeats, so the pool needs POOL_MATCH tokens; the request's
    own text does not."""
    pool = DraftPool()
    earlier = [7, 7] + list(range(100, 120))
    pool.add(earlier)
    short = [1] + list(range(100, 100 + POOL_MATCH - 1))
    assert SuffixDrafter(short, pool).copy(short) is None
    assert SuffixDrafter(short + [5] + short[1:], pool).copy(short + [5] + short[1:]).source == "suffix"
    long = [1] + list(range(100, 100 + POOL_MATCH))
    found = SuffixDrafter(long, pool).copy(long)
    assert found.source == "pool" and found.tokens[:2] == [100 + POOL_MATCH, 101 + POOL_MATCH]


def test_documents_of_the_pool_do_not_run_into_each_other():
    pool = DraftPool()
    pool.add([1, 2, 3])
    pool.add([4, 5, 6])
    assert SuffixDrafter([2, 3], pool).copy([2, 3]) is None  # 3 ends its document: nothing follows it


def test_a_copy_goes_first_the_model_drafts_otherwise_and_after_a_short_sure_copy():
    model = Recorder()
    drafter = opened(FreeFirst(model, SuffixDrafter([1, 2, 3, 4, 5, 6, 9])))
    proposal = drafter.propose([1, 2, 3, 4, 5, 6, 9, 1, 2], 4)  # (1, 2) recurs: copied, and nothing chained
    assert proposal.tokens == [3, 4, 5, 6] and proposal.copied == 4 and model.calls == []
    assert drafter.propose([8, 8, 5, 7], 4).tokens == [7, 7] and len(model.calls) == 1  # nothing repeats
    proposal = drafter.propose([1, 2, 3, 4, 5, 6, 9, 1, 2], 8)  # k longer than the copy: the model goes on
    assert proposal.tokens[:4] == [3, 4, 5, 6] and proposal.tokens[4:] == [7, 7] and proposal.copied == 4
    assert model.calls[-1] == ([1, 2, 3, 4, 5, 6, 9, 1, 2, 3, 4, 5, 6], 4)
    assert drafter.propose([1, 2, 3, 4, 5, 6, 9, 1, 2], 0).tokens == [3, 4, 5, 6]  # the model paused: still copies
    assert drafter.propose([8, 8, 5, 7], 0).tokens == [] and len(model.calls) == 2


def test_until_a_copy_is_kept_only_long_matches_are_copied():
    """Text that does not repeat: a copy on a two-token match is mostly chance, and would take the round from the
    draft model. A request's copies go out on short matches only once the target kept a copied token."""
    model = Recorder()
    drafter = FreeFirst(model, SuffixDrafter([1, 2, 3, 4, 5, 6, 9]))
    short = [1, 2, 3, 4, 5, 6, 9, 1, 2]  # (1, 2) recurs: a match of 2
    assert drafter.propose(short, 4).tokens == [7, 7] and len(model.calls) == 1  # the model drafts
    assert OPENING_MATCH <= 6
    long_match = [1, 2, 3, 4, 5, 6, 9, 1, 2, 3, 4, 5, 6]  # a match of 6: copied at once
    proposal = drafter.propose(long_match, 2).head(2)
    assert proposal.copied == 2 and proposal.tokens == [9, 1] and len(model.calls) == 1
    drafter.verified(proposal, 0, 0.1)  # the target kept none of it: short matches still wait
    assert not drafter.propose(short, 4).copied
    drafter.verified(proposal, 1, 0.1)  # it kept one: short matches are copied from now on
    assert drafter.propose(short, 4).copied == 2  # (its length halved after the copy it kept 0 of)


def test_a_copy_ends_at_an_end_of_sequence_token_and_is_not_chained_past_it():
    eos = 2
    drafter = SuffixDrafter([5, 6, 7, 8, eos, 9, 5, 6], ends=(eos,))
    assert drafter.copy([5, 6, 7, 8, eos, 9, 5, 6]).tokens == [7, 8, eos]  # the run stops there: nothing after it
    assert SuffixDrafter([5, 6, 7, 8, eos, 9, 5, 6]).copy([5, 6, 7, 8, eos, 9, 5, 6]).tokens[:4] == [7, 8, eos, 9]
    lone = SuffixDrafter([3, 4, eos, 9, 3, 4], ends=(eos,))
    assert lone.copy([3, 4, eos, 9, 3, 4]).tokens == [eos]  # one token, but it ends the answer: worth its round
    model = Recorder()
    free_first = opened(FreeFirst(model, SuffixDrafter([5, 6, 7, 8, eos, 9, 5, 6], ends=(eos,))))
    proposal = free_first.propose([5, 6, 7, 8, eos, 9, 5, 6], 8)
    assert proposal.tokens == [7, 8, eos] and model.calls == []  # the model is not asked to go on after the end


def test_a_free_source_that_loses_is_paused_and_measured_again():
    model = Recorder()
    drafter = opened(FreeFirst(model, SuffixDrafter(list(range(10, 30)) + [5])))
    sequence = list(range(10, 30)) + [5, 10, 11]  # a short match: (10, 11)
    for _ in range(3):  # model rounds: 3 tokens in 0.1 s
        drafter.verified(Proposal([7, 7]), 2, 0.1)
    for _ in range(TRIAL_ROUNDS):  # copies of which the target keeps the first token: 2 tokens in 0.1 s
        proposal = drafter.propose(sequence, 4)
        assert proposal.copied
        drafter.verified(proposal, 1, 0.1)
    paused = [drafter.propose(sequence, 4).copied for _ in range(FIRST_PAUSE)]
    assert not any(paused) and drafter.stats()["free_paused_rounds"] == FIRST_PAUSE
    assert drafter.propose(sequence, 4).copied  # tried again after the pause


def test_without_a_clock_the_source_is_judged_by_what_the_target_kept():
    drafter = opened(FreeFirst(Recorder(), SuffixDrafter(list(range(10, 30)) + [5]), clock=False))
    sequence = list(range(10, 30)) + [5, 10, 11]
    for _ in range(TRIAL_ROUNDS):
        drafter.verified(drafter.propose(sequence, 4), 0, 1e-9)  # absurd clocks do not matter: nothing kept
    assert not drafter.propose(sequence, 4).copied


def test_before_any_model_round_the_copies_are_judged_by_what_the_target_kept():
    drafter = opened(FreeFirst(Recorder(), SuffixDrafter(list(range(10, 30)) + [5])))
    sequence = list(range(10, 30)) + [5, 10, 11]
    for _ in range(TRIAL_ROUNDS):  # copies only, all rejected: no model round to compare their rate with
        drafter.verified(drafter.propose(sequence, 4), 0, 0.1)
    assert not drafter.propose(sequence, 4).copied


def test_a_paused_free_source_still_copies_a_long_match():
    drafter = opened(FreeFirst(Recorder(), SuffixDrafter(list(range(10, 30)) + [5])))
    short = list(range(10, 30)) + [5, 10, 11]
    for _ in range(3):  # model rounds: 3 tokens in 0.1 s
        drafter.verified(Proposal([7, 7]), 2, 0.1)
    for _ in range(TRIAL_ROUNDS):  # copies: 2 tokens in 0.1 s
        drafter.verified(drafter.propose(short, 4), 1, 0.1)
    assert not drafter.propose(short, 4).copied  # paused
    long_match = list(range(10, 30)) + [5] + list(range(10, 10 + STRONG_MATCH))
    proposal = drafter.propose(long_match, 4)
    assert proposal.copied >= 2 and proposal.tokens[:2] == [10 + STRONG_MATCH, 11 + STRONG_MATCH]


# --- resuming a copy where the target parted from it (an edit) --------------------------------------------------

SOURCE = [50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61]
LEAD = [9, 8, 7, 6, 5, 4, 3]  # before SOURCE: a copy after LEAD + [50, 51] matches 9 tokens (text that repeats)


def copied_then_parted(kept: int, written: list[int], lead: list[int] = LEAD, same_word=None, more: list[int] = ()):
    """A drafter whose copy of SOURCE (after the request's end, lead + [50, 51]: a match of len(lead) + 2 tokens)
    the target kept `kept` tokens of, then wrote `written` itself: (the drafter, the sequence). more: prompt tokens
    after SOURCE."""
    drafter = SuffixDrafter(lead + SOURCE + [1] + list(more), same_word=same_word)
    sequence = lead + SOURCE + [1] + list(more) + lead + [50, 51]
    found = drafter.copy(sequence)
    assert found.match == len(lead) + 2
    proposal = as_proposal(found)
    assert proposal.tokens[:4] == [52, 53, 54, 55]
    drafter.verified(proposal, kept, 0.1)
    return drafter, sequence + proposal.tokens[:kept] + written


def test_a_copy_on_a_short_match_leaves_no_place_to_resume():
    """In text that does not repeat, a copy on a two-token match is mostly chance: where the target parts from it,
    no copy resumes (the draft model drafts), while after a long match the same parting resumes."""
    assert RESUME_FROM_MATCH > 2
    drafter, sequence = copied_then_parted(1, [99], lead=[9])  # a match of 2 tokens ([50, 51] after the end)
    assert drafter.anchor is None and drafter.copy(sequence) is None
    drafter, sequence = copied_then_parted(1, [99])
    assert drafter.copy(sequence).match == RESUMED_MATCH
    # a resumed copy the target kept keeps its anchor's match: the copy after it resumes again
    found = drafter.copy(sequence)
    drafter.verified(as_proposal(found), 1, 0.1)
    assert drafter.anchor is not None and drafter.anchor.repeated == len(LEAD) + 2 + 1  # the match, and 1 kept


def test_text_seen_to_repeat_through_its_copy_gets_a_place_to_resume():
    """A copy on a 5-token match (too short to resume after a parting on its own) whose tokens the target kept up
    to RESUME_FROM_MATCH in all shows text that repeats: the copy resumes after the target's replacement."""
    lead = [9, 8, 7]  # with [50, 51]: a match of 5 tokens
    drafter, sequence = copied_then_parted(1, [99], lead=lead)
    assert drafter.anchor is None and drafter.copy(sequence) is None
    kept = RESUME_FROM_MATCH - 5
    drafter, sequence = copied_then_parted(kept, [99], lead=lead)  # 52 to 54 kept, 55 replaced by 99
    found = drafter.copy(sequence)
    assert found.match == RESUMED_MATCH and found.tokens[:2] == [56, 57]


def test_a_copy_resumes_after_the_tokens_the_target_replaced():
    drafter, sequence = copied_then_parted(1, [99])  # 53 replaced by 99
    assert drafter.stats() == {}
    found = drafter.copy(sequence)
    assert found.tokens[:2] == [54, 55]
    assert drafter.stats() == {}  # counted once the target verified it, not when it was built (it may be dropped)
    drafter.verified(as_proposal(found), 2, 0.1)
    assert drafter.stats() == {"resumed_copies": 1}  # in Result.extra, through FreeFirst's stats
    assert FreeFirst(Recorder(), drafter).stats()["resumed_copies"] == 1
    drafter, sequence = copied_then_parted(1, [99, 98])  # 53 and 54 replaced by two tokens
    assert drafter.copy(sequence).tokens[:2] == [55, 56]


def test_a_resumed_copy_cut_short_expects_only_its_own_steps_and_is_not_chained():
    drafter, sequence = copied_then_parted(1, [99])  # the copy was kept 1 of 4: its length factor halved
    found = drafter.copy(sequence)
    # as long as a match of the text's repetition (the 9-token match and the 1 kept), at the halved factor
    n = int(drafter.factor * drafter.anchor.repeated)
    assert drafter.anchor.repeated == len(LEAD) + 3 and n < FREE_TOKENS
    after = (SOURCE + [1] + LEAD)[4:4 + n]  # the prompt's tokens after the replaced one
    assert found.tokens == after and found.match == RESUMED_MATCH
    # a guess about the source's place: its steps' chances, not those of the tokens it was cut from
    assert found.expected == pytest.approx(sum(RESUME_SHARE ** (i + 1) for i in range(n)))
    model = Recorder()
    drafter, sequence = copied_then_parted(1, [99])
    proposal = FreeFirst(model, drafter).propose(sequence, 12)
    assert proposal.copied == n and proposal.tokens == after and not model.calls  # no model tokens behind it


def test_a_short_copy_an_edit_takes_its_value_from_leaves_the_place_to_resume():
    """The target parted from the copied text (99 for 53) and took its new value from elsewhere (a short match:
    70 after 52, 99); back at 53, the copy resumes in the text it edits."""
    def same_word(left, right):
        return right == 54 and left in (53, 99)
    drafter, sequence = copied_then_parted(1, [99], same_word=same_word, more=[52, 99, 70, 71, 72, 1])
    short = drafter.copy(sequence)
    assert short.tokens[:2] == [70, 71] and short.match == 2
    drafter.verified(as_proposal(short), 1, 0.1)  # 70 kept, then the target wrote 53
    found = drafter.copy(sequence + [70, 53])
    assert found is not None and found.match == RESUMED_MATCH and found.tokens[:2] == [54, 55]


def test_a_copy_does_not_resume_inside_a_word_while_another_copy_matches():
    """The target wrote 99 where the source had 53, and 53 + 54 spell one word (as "L" + "yon"): resuming at 54
    would glue the source's word onto the target's. Where another copy matches the sequence's end, that one goes; where
    none does, the copy guesses that 99 took the place of the whole word and resumes after it."""
    def same_word(left, right):
        return right == 54 and left in (53, 99)
    drafter, sequence = copied_then_parted(1, [99], same_word=same_word)
    assert drafter.copy(sequence).tokens[:2] == [55, 56]
    drafter, sequence = copied_then_parted(1, [99], same_word=same_word, more=[52, 99, 70, 71, 72, 1])
    assert drafter.copy(sequence).tokens[:2] == [70, 71]  # (52, 99) matched in the prompt
    drafter, sequence = copied_then_parted(1, [99], more=[52, 99, 70, 71, 72, 1])  # no word: the count resumes
    assert drafter.copy(sequence).tokens[:2] == [54, 55]
    drafter, sequence = copied_then_parted(1, [98, 99], same_word=lambda left, right: right == 55)
    assert drafter.copy(sequence).tokens[:2] == [56, 57]  # 99 then 55 is a word: 98 and 99 replaced 53 to 55


def test_a_target_that_splits_the_source_s_token_resumes_after_that_token():
    """The target wrote 98, whose text is the start of 53's ("(" where the source had "(users"), then 99 (the new
    word, "people"): the two took the place of 53 alone. After 98 no copy resumes (the target writes on inside 53's
    text); after 99 the copy goes on at 54, not one token further."""
    def starts_with(whole, part):
        return (whole, part) == (53, 98)
    drafter, sequence = copied_then_parted(1, [98])
    drafter.starts_with = starts_with
    assert drafter.copy(sequence) is None
    assert drafter.copy(sequence + [99]).tokens[:2] == [54, 55]
    drafter, sequence = copied_then_parted(1, [98, 99])  # without the split: as many source tokens replaced
    assert drafter.copy(sequence).tokens[:2] == [55, 56]


def test_a_copy_does_not_resume_past_the_end_of_its_source_s_text():
    """The source's text ends (2, an end-of-sequence token: the prompt's turn ends there) a few tokens after the
    parting; the target's token 70 comes after that end in the source (the next turn): no copy resumes behind it,
    nor after a token the target wrote in the end's place."""
    source = LEAD + [50, 51, 52, 53, 54, 2, 70, 71, 72, 73]
    drafter = SuffixDrafter(source, ends=(2,))
    sequence = source + LEAD + [50, 51]
    proposal = as_proposal(drafter.copy(sequence))
    assert proposal.tokens == [52, 53, 54, 2]  # (a copy stops at an end)
    drafter.verified(proposal, 1, 0.1)  # 52 kept, then the target wrote 70
    assert drafter.copy(sequence + [52, 70]).tokens == [54, 2]  # (the count's guess: 70 took 53's place)
    # nor where the target took the end's place: the count would resume in the next turn
    drafter = SuffixDrafter(source, ends=(2,))
    drafter.verified(as_proposal(drafter.copy(sequence)), 3, 0.1)  # 52 to 54 kept, then the target wrote 99
    assert drafter.copy(sequence + [52, 53, 54, 99]) is None
    drafter = SuffixDrafter(source)  # where 2 ends nothing, 70 is found in the window, and the copy resumes behind it
    drafter.verified(as_proposal(drafter.copy(sequence)), 1, 0.1)
    assert drafter.copy(sequence + [52, 70]).tokens[:2] == [71, 72]


def test_a_copy_that_ran_to_the_end_of_the_pool_resumes_nowhere_after_an_edit():
    """A copy from the pool kept whole up to the last token the pool holds: its place to resume is past the end of
    the pool's text, so after the target's own token nothing resumes (and nothing reads past that end)."""
    pool = DraftPool()
    document = LEAD + [50, 51, 52, 53, 54, 55]
    pool.add(document)
    drafter = SuffixDrafter([1], pool=pool)
    sequence = [1] + LEAD + [50, 51]
    proposal = as_proposal(drafter.copy(sequence))
    assert proposal.tokens == [52, 53, 54, 55] and proposal.source == "pool"
    drafter.verified(proposal, 4, 0.1)  # all kept, then the target wrote 99
    assert drafter.anchor is not None and drafter.anchor.next == len(drafter.anchor.tokens)
    assert drafter.copy(sequence + [52, 53, 54, 55, 99]) is None


def test_starts_with_is_a_token_whose_text_begins_another_s_and_is_shorter():
    pieces = [b"(", b"(users", b"(user", b" users", None, b""]
    vocab = TokenBytes.pack(pieces)
    assert vocab.starts_with(1, 0) and vocab.starts_with(1, 2) and vocab.starts_with(2, 0)
    assert not vocab.starts_with(0, 1) and not vocab.starts_with(1, 1) and not vocab.starts_with(1, 3)
    assert not vocab.starts_with(1, 4) and not vocab.starts_with(4, 0) and not vocab.starts_with(1, 5)
    assert not vocab.starts_with(1, len(pieces)) and not vocab.starts_with(-1, 0)


def test_same_word_is_a_token_that_ends_with_a_letter_or_digit_followed_by_one_that_starts_with_one():
    pieces = [b' "', b"L", b"yon", b'"}}', b"Nice", b"2", b"0", None, b"", b" count", b"_words", "é".encode()]
    vocab = TokenBytes.pack(pieces)
    ids = {piece: i for i, piece in enumerate(pieces)}
    assert vocab.same_word(ids[b"L"], ids[b"yon"]) and vocab.same_word(ids[b"2"], ids[b"0"])
    assert vocab.same_word(ids[b"Nice"], ids[b"yon"])
    assert not vocab.same_word(ids[b"Nice"], ids[b'"}}']) and not vocab.same_word(ids[b' "'], ids[b"L"])
    assert not vocab.same_word(ids[b"L"], ids[b" count"]) and not vocab.same_word(ids[b" count"], ids[b"_words"])
    assert not vocab.same_word(ids[b"L"], 7) and not vocab.same_word(8, ids[b"L"])  # no text: special, empty
    assert not vocab.same_word(ids[b"L"], len(pieces)) and not vocab.same_word(-1, ids[b"L"])
    assert not vocab.same_word(ids[b"L"], 11)  # (a non-ASCII letter is not told apart: no word is assumed)


def test_the_requests_first_copy_takes_its_whole_length():
    """The first copy goes to the target in the call that prefills the prompt, where a few more tokens add little:
    it is not cut to the length factor times its match, as the copies after it are."""
    prompt = [9, 8] + list(range(20, 40)) + [1, 9, 8]
    drafter = SuffixDrafter(prompt)
    first = drafter.copy(prompt)
    assert first.match == 2 and first.tokens == list(range(20, 20 + FREE_TOKENS))
    later = drafter.copy(prompt + [7, 9, 8])
    assert later.match == 2 and len(later.tokens) == int(drafter.factor * 2)


def test_a_one_token_copy_that_ends_the_answer_goes_where_the_model_does_not_draft():
    """A round the drafting guard runs without the model loses nothing to a copy: one that ends the answer goes
    even when it is expected to keep only half a token. A round where the model drafts keeps the model's."""
    eos = 2
    prompt = [10, 3, 4, 9, 11, 3, 4, eos, 12, 3, 4]  # after (3, 4): 9 once, the end once (the more recent)
    free_first = opened(FreeFirst(Recorder(), SuffixDrafter(prompt, ends=(eos,))))
    assert free_first.free.copy(prompt).expected == pytest.approx(0.5)
    assert free_first.propose(prompt, 0).tokens == [eos]
    model = Recorder()
    assert opened(FreeFirst(model, SuffixDrafter(prompt, ends=(eos,)))).propose(prompt, 4).tokens == [7, 7]
    assert model.calls


def test_a_copy_resumes_behind_the_source_token_the_target_came_back_to():
    drafter, sequence = copied_then_parted(1, [99, 98, 97, 96, 95, 54])  # inserted 5 tokens, then back at 54
    assert drafter.copy(sequence).tokens[:2] == [55, 56]
    drafter, sequence = copied_then_parted(1, [55])  # dropped 53 and 54
    assert drafter.copy(sequence).tokens[:2] == [56, 57]


def test_an_anchor_whose_resumed_copies_miss_is_dropped():
    drafter, sequence = copied_then_parted(1, [99])
    for i in range(RESUME_TRIES):
        found = drafter.copy(sequence)
        assert found is not None and found.match == RESUMED_MATCH
        drafter.verified(as_proposal(found), 0, 0.1)
        sequence = sequence + [80 + i]  # the target's own token each time
    assert drafter.anchor is None and drafter.copy(sequence) is None
    # far past the parting: nothing resumes
    drafter, sequence = copied_then_parted(1, list(range(100, 101 + RESUME_SPAN)))
    assert drafter.copy(sequence) is None


# --- renames: an edit the target made to copied text, replayed in later copies ---------------------------------

# a vocabulary of whole pieces for the rename tests: the generic tokens spell " tN", the others what they say
RENAME_PIECES = {53: b" users", 60: b"(users", 61: b"(", 62: b"people", 63: b" superusers", 99: b" people"}


def rename_respell() -> Retokenizer:
    pieces = [RENAME_PIECES.get(i, b" t%d" % i) for i in range(128)]
    vocab = TokenBytes.pack(pieces)
    by_length = sorted(range(len(pieces)), key=lambda i: -len(pieces[i]))

    def encode(text: str) -> list[int]:  # greedy longest match: the toy tokenizer
        data, out = text.encode(), []
        while data:
            token = next(i for i in by_length if data.startswith(pieces[i]))
            out.append(token)
            data = data[len(pieces[token]):]
        return out
    return Retokenizer(encode, vocab)


def test_renamed_word_is_the_one_whole_word_an_edit_replaced():
    assert renamed_word(b" users", b" people") == Rename(b"users", b"people")
    assert renamed_word(b"(users", b"(people") == Rename(b"users", b"people")
    assert renamed_word(b" count_words(", b" word_counts(") == Rename(b"count_words", b"word_counts")
    assert renamed_word(b"load_users", b"load_people") == Rename(b"users", b"people")  # (a piece of a name)
    assert renamed_word(b" delay =", b" max_delay =") is None  # an insertion: nothing was replaced
    assert renamed_word(b" the old cat", b" a new dog") is None  # more than one word
    assert renamed_word(b" 42", b" 43") is None  # a number, not a name
    assert renamed_word(b" ab", b" cd") is None  # too short to be told from any other text
    assert renamed_word(b" users", b" all_users") is None  # the new text would hold the old word again


def test_a_rename_is_replayed_in_later_copies_and_a_copy_resumes_after_it():
    """The target wrote " people" (99) where the source had " users" (53) and went on with the source (a resumed
    copy it kept): later copies spell every whole word " users" as " people", and after a replayed copy the target
    kept, a parting resumes in the source."""
    source = LEAD + [50, 51, 52, 53, 54, 55, 56, 40, 41, 53, 42, 43, 44, 45, 46, 53, 47, 48, 49, 57, 58]
    drafter = SuffixDrafter(source + [1], respell=rename_respell())
    sequence = source + [1] + LEAD + [50, 51]
    drafter.verified(as_proposal(drafter.copy(sequence)), 1, 0.1)  # 52 kept, then 99 in 53's place
    sequence += [52, 99]
    resumed = drafter.copy(sequence)
    assert resumed.match == RESUMED_MATCH and resumed.tokens[:4] == [54, 55, 56, 40]
    assert 53 in resumed.tokens and not drafter.renames  # (learnt only once the target keeps the resumed copy)
    drafter.verified(as_proposal(resumed), 5, 0.1)  # kept up to 41, then the target renamed the second one too
    assert drafter.renames == [Rename(b"users", b"people")]
    sequence += [54, 55, 56, 40, 41, 99]
    replayed = drafter.copy(sequence)
    assert replayed.tokens[:7] == [42, 43, 44, 45, 46, 99, 47]  # the third " users" spelled " people"
    assert replayed.origin is None and tuple(replayed.tokens) in drafter.replays
    drafter.verified(as_proposal(replayed), 7, 0.1)  # kept up to 47, then the target wrote 80 in 48's place
    assert drafter.stats()["renamed_copies"] == 1 and drafter.renames
    after = drafter.copy(sequence + replayed.tokens[:7] + [80])
    assert after.match == RESUMED_MATCH and after.tokens[:2] == [49, 57]


def test_a_rename_the_target_parts_from_inside_its_new_spelling_is_forgotten():
    drafter = SuffixDrafter(LEAD + [50, 51, 53, 54, 55, 56], respell=rename_respell())
    drafter.renames = [Rename(b"users", b"people")]
    sequence = LEAD + [50, 51, 53, 54, 55, 56, 1] + LEAD + [50, 51]
    found = drafter.copy(sequence)
    assert found.tokens[:2] == [99, 54]
    drafter.verified(as_proposal(found), 0, 0.1)  # the target kept " users" here: not a rename of this text
    assert drafter.renames == [] and drafter.copy(sequence).tokens[:2] == [53, 54]
    drafter = SuffixDrafter(LEAD + [50, 51, 53, 54, 55, 56])  # no re-tokenizer: nothing is replayed
    drafter.renames = [Rename(b"users", b"people")]
    assert drafter.copy(sequence).tokens[:2] == [53, 54]


def test_a_replayed_rename_respells_the_tokens_that_hold_the_word_and_only_whole_words():
    """"(users" becomes "(" + "people" (the toy tokenizer's spelling of "(people"); " superusers" holds the old word
    only as part of another, and a copy's last word may go on after it: both stay as they are."""
    drafter = SuffixDrafter([1], respell=rename_respell())
    drafter.renames = [Rename(b"users", b"people")]
    copy = Copy([60, 40, 63, 41, 53, 42, 53], [1.0] * 7, 9, "suffix", ([0] * 20, 5, 10))
    drafter.replay_renames(copy, 39, FREE_TOKENS, 9)
    assert copy.tokens == [61, 62, 40, 63, 41, 99, 42, 53]
    assert len(copy.chances) == len(copy.tokens) and copy.origin is None
    replay = drafter.replays[tuple(copy.tokens)]
    assert [span[:2] for span in replay.spans] == [(0, 2), (5, 6)]
    assert replay.after == [None, 7, 8, 9, 10, 11, 12, 13]  # the source position after each token


# --- lossless with real (tiny) models ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pipes(bundle_dir):
    return {"standard": Pipeline(bundle_dir(*SAME_VOCAB)), "hetero": Pipeline(bundle_dir(*OTHER_VOCAB))}


def test_the_seconds_of_the_rounds_that_copied_are_counted_apart(pipes):
    """Stats.copy_round_seconds: the rounds after the first that verified a copy (what the workloads suite leaves
    out to show how far cheaper copies could go); none in a run without free drafts."""
    pipe = pipes["hetero"]
    config = GenerationConfig(max_new_tokens=24, ignore_eos=True)
    copied = pipe.generate(REPEATING[0], config, algorithm="suffix", pool_scope=None)
    st = copied.stats
    assert st.suffix_tokens_proposed > 0 and st.rounds > 1
    assert 0 < st.copy_round_seconds < st.target_seconds + st.draft_seconds
    assert pipe.generate(REPEATING[0], config, algorithm="slem", lookup=False).stats.copy_round_seconds == 0


@pytest.mark.parametrize("algorithm", ["standard", "slem", "suffix", pytest.param("tli", marks=pytest.mark.slow),
                                       pytest.param("slrs", marks=pytest.mark.slow)])
def test_greedy_ids_and_bits_are_the_target_alones_with_copies_and_the_pool(pipes, algorithm):
    pipe = pipes["standard" if algorithm == "standard" else "hetero"]
    pipe.forget()
    config = GenerationConfig(max_new_tokens=24, ignore_eos=True, logprobs=True)
    copied = pooled = 0
    for prompt in REPEATING + [s for s in HOSTILE_STRINGS if s.strip()][:6]:
        base = pipe.generate(prompt, config, algorithm="none", pool_scope=None)
        for scope in ("cold", "warm"):  # the second run finds the first's text in the pool
            spec = pipe.generate(prompt, config, algorithm=algorithm, num_assistant_tokens=4, pool_scope=scope)
            assert spec.token_ids == base.token_ids and logprob_bits(spec) == logprob_bits(base), (prompt, scope)
            copied += spec.stats.suffix_tokens_accepted
            pooled += spec.stats.pool_tokens_accepted
        off = pipe.generate(prompt, config, algorithm=algorithm, num_assistant_tokens=4, lookup=False)
        assert off.token_ids == base.token_ids
    assert copied > 0 and pooled > 0  # copies from the request and from the pool were verified, and stayed exact
    pipe.forget()


def test_the_drafter_hears_the_first_rounds_outcome_without_its_clock(pipes, monkeypatch):
    heard = []
    monkeypatch.setattr(SuffixDrafter, "verified", lambda self, proposal, accepted, seconds: heard.append(seconds))
    result = pipes["standard"].generate(REPEATING[0], GenerationConfig(max_new_tokens=12, ignore_eos=True),
                                        algorithm="suffix", pool_scope=None)
    assert len(heard) == result.stats.rounds  # every round, the first included
    assert heard[0] is None and all(seconds > 0 for seconds in heard[1:])


def test_a_seeded_sampled_request_repeats_with_the_pool_warm_or_cold(pipes):
    pipe = pipes["hetero"]
    pipe.forget()
    config = GenerationConfig(max_new_tokens=24, seed=7, ignore_eos=True, **SAMPLING)
    prompt = REPEATING[0]
    cold = pipe.generate(prompt, config, algorithm="slem")
    for _ in range(2):  # the pool now holds this very answer, and other text
        pipe.generate(prompt, GenerationConfig(max_new_tokens=24, ignore_eos=True), algorithm="slem")
        again = pipe.generate(prompt, config, algorithm="slem")
        assert again.token_ids == cold.token_ids
    pipe.forget()


def test_an_engine_without_a_pool_and_forget(bundle_dir):
    engine = Engine(bundle_dir(*SAME_VOCAB), draft_pool_tokens=0)
    assert engine.draft_pool is None
    engine.forget()  # nothing to forget: no error
    config = GenerationConfig(max_new_tokens=16, ignore_eos=True)
    first = engine.session().generate(REPEATING[2], config, algorithm="suffix")
    second = engine.session().generate(REPEATING[2], config, algorithm="suffix")
    assert second.token_ids == first.token_ids and second.stats.pool_tokens_proposed == 0


@pytest.mark.slow
def test_sampling_keeps_the_target_distribution_where_copies_are_verified(pipes):
    """On a prompt that repeats, the first rounds are copies, chained with the model's tokens; the sampled tokens
    keep the target's distribution, and the returned logprobs are the target's on the emitted ids."""
    pipe = pipes["standard"]
    pipe.forget()
    prompt = "a b c d a b c d a b c d a b"
    samples = {"none": Counter(), "standard": Counter()}
    copied = 0
    for algorithm, offset in (("none", 0), ("standard", 50_000)):
        for seed in range(offset, offset + N_SAMPLES):
            config = GenerationConfig(max_new_tokens=5, seed=seed, ignore_eos=True, **SAMPLING)
            result = pipe.generate(prompt, config, algorithm=algorithm, num_assistant_tokens=4, pool_scope=None)
            samples[algorithm][tuple(result.token_ids[:2])] += 1
            copied += result.stats.suffix_tokens_proposed
    assert copied >= N_SAMPLES  # every speculative run copied
    assert len(samples["none"]) > 5, "the test distribution is too concentrated to tell anything"
    assert homogeneity_pvalue(samples["none"], samples["standard"]) > ALPHA



@pytest.mark.parametrize("algorithm", ["standard", "suffix"])
def test_sampled_logprobs_are_the_target_alones_where_copies_were_verified(pipes, algorithm):
    """Each sampled token's logprob equals, bit for bit, the target's computed in one block from scratch, in runs
    whose rounds copied from the request and from the pool (and were cut back where the target disagreed)."""
    pipe = pipes["standard"]
    pipe.forget()
    prompt_ids = pipe.tokenizer.encode("a b c d a b c d a b c d a b")
    copied = rolled_back = 0
    for seed in range(6):
        config = GenerationConfig(max_new_tokens=24, seed=seed, ignore_eos=True, logprobs=True, **SAMPLING)
        result = pipe.generate(prompt_ids, config, algorithm=algorithm, num_assistant_tokens=4, pool_scope="")
        st = result.stats
        copied += st.suffix_tokens_proposed + st.pool_tokens_proposed
        rolled_back += st.suffix_tokens_accepted + st.pool_tokens_accepted < st.free_tokens_proposed
        assert bits(result.logprobs) == bits(forced_logprobs(pipe, prompt_ids, result.token_ids, config))
    assert copied and rolled_back  # copies were verified, some cut back
    pipe.forget()


@pytest.mark.parametrize("algorithm", ["suffix", pytest.param("slem", marks=pytest.mark.slow)])
def test_copies_that_replay_a_rename_keep_the_target_alone_s_ids_and_bits(bundle_dir, algorithm, monkeypatch):
    """Copies spelled with a rename (every whole word "return" as "yield", as if the target had renamed it) are
    verified as any proposal is: greedy ids and logprob bits, and a sampled run's logprobs, are the target alone's."""
    build = SuffixDrafter.__init__

    def renaming(self, *args, **kwargs):
        build(self, *args, **kwargs)
        self.renames = [Rename(b"return", b"yield")]
    monkeypatch.setattr(SuffixDrafter, "__init__", renaming)
    # every round may copy, whatever the clock: copies that lose to the model's rounds are not paused, and no block
    # measured to pay caps their length
    monkeypatch.setattr(FreeFirst, "_losing", lambda self: False)
    pipe = Pipeline(bundle_dir(*OTHER_VOCAB), fixed_blocks=False)
    greedy = GenerationConfig(max_new_tokens=24, ignore_eos=True, logprobs=True)
    renamed = 0
    for prompt in [REPEATING[0], REPEATING[2]]:
        base = pipe.generate(prompt, greedy, algorithm="none", pool_scope=None)
        spec = pipe.generate(prompt, greedy, algorithm=algorithm, num_assistant_tokens=4, pool_scope=None)
        assert spec.token_ids == base.token_ids and logprob_bits(spec) == logprob_bits(base), prompt
        renamed += spec.extra.get("renamed_copies", 0)
        prompt_ids = pipe.tokenizer.encode(prompt)
        for seed in range(2):
            config = GenerationConfig(max_new_tokens=24, seed=seed, ignore_eos=True, logprobs=True, **SAMPLING)
            result = pipe.generate(prompt_ids, config, algorithm=algorithm, num_assistant_tokens=4, pool_scope=None)
            assert bits(result.logprobs) == bits(forced_logprobs(pipe, prompt_ids, result.token_ids, config))
            renamed += result.extra.get("renamed_copies", 0)
    assert renamed  # copies replayed the rename, and the target verified them


@pytest.mark.slow
def test_cli_no_lookup_and_the_json_counts(bundle_dir):
    counts = {}
    for flags in ([], ["--no-lookup"]):
        proc = subprocess.run([sys.executable, "-m", "edge_specdec.cli", "run", str(bundle_dir(*SAME_VOCAB)),
                               "--prompt", REPEATING[0], "--max-new-tokens", "16", "--ignore-eos", "--json", *flags],
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        counts[bool(flags)] = json.loads(proc.stdout)["stats"]["suffix_tokens_proposed"]
    assert counts[False] > 0 and counts[True] == 0


@pytest.mark.slow
def test_the_server_shows_its_pool_and_scopes_it_by_key(bundle_dir):
    import urllib.request

    from edge_specdec.runtime.settings import EngineConfig
    from edge_specdec.serve.app import ServerSettings
    from serve_helpers import serve_in_thread

    def metric(url: str, name: str) -> float:
        text = urllib.request.urlopen(urllib.request.Request(url + "/metrics", headers=auth)).read().decode()
        return float(next(line.split()[-1] for line in text.splitlines() if line.startswith(f"edge_specdec_{name} ")))

    auth = {"Authorization": "Bearer k1", "Content-Type": "application/json"}
    body = json.dumps({"prompt": REPEATING[0], "max_tokens": 8, "temperature": 0}).encode()
    settings = ServerSettings(str(bundle_dir(*SAME_VOCAB)), slots=1, api_key="k1",
                              engine=EngineConfig(draft_pool_tokens=5000))
    with serve_in_thread(settings) as running:
        assert metric(running.url, "draft_pool_limit_tokens") == 5000 and metric(running.url, "draft_pool_tokens") == 0
        urllib.request.urlopen(urllib.request.Request(running.url + "/v1/completions", data=body, headers=auth))
        assert metric(running.url, "draft_pool_tokens") > 8
        pool = json.load(urllib.request.urlopen(running.url + "/health"))["draft_pool"]
        assert pool["max_tokens"] == 5000 and pool["documents"] == 1 and pool["tokens"] > 8
        scopes = list(running.server.engine.draft_pool.scopes)
        assert scopes and "" not in scopes and "k1" not in scopes  # one scope, named by the key's digest
    with serve_in_thread(ServerSettings(str(bundle_dir(*SAME_VOCAB)), slots=1, api_key="k1",
                                        engine=EngineConfig(draft_pool_tokens=0))) as running:
        assert metric(running.url, "draft_pool_limit_tokens") == 0


def test_copies_of_a_match_length_that_keeps_missing_are_expected_to_keep_less():
    drafter = SuffixDrafter(list(range(10, 30)) + [5])
    short = list(range(10, 30)) + [5, 10, 11]  # a match of 2 tokens
    first = drafter.copy(short).expected
    for _ in range(3):
        drafter.verified(as_proposal(drafter.copy(short)), 0, 0.1)  # the target kept none of them
    assert drafter.copy(short).expected < 0.5 * first
    long_match = list(range(10, 30)) + [5] + list(range(10, 22))  # a match of 12: its own record, still whole
    assert drafter.copy(long_match).expected == pytest.approx(min(len(drafter.copy(long_match).tokens), 16))
    free_first = opened(FreeFirst(Recorder(), drafter))
    assert not free_first.propose(short, 4).copied and free_first.propose(long_match, 4).copied
