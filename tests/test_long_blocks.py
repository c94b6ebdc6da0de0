"""Long blocks: an exact session never makes a call of more tokens than its model's longest exact call, which
open_model measures (session.py, "Long blocks"; probes.longest_exact_call).

On an AVX2 CPU the real 1.5B int4 target's rows change bits once a call holds more than about 80 tokens; on a Xeon
with AMX not up to 256. The stand-in session below does the same to the cache slots a call of more than `wide`
tokens writes, so a prompt prefilled in one call leaves other values than the same tokens fed in blocks. The tiny
OpenVINO models do not show the effect, so the pieces themselves are checked on one of them (same logits, every
call between 2 and the longest block), and the switch is faked on it to see the probe refuse the sizes beyond."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import edge_specdec.runtime.session as session_module
from edge_specdec.runtime.batching import Call, ModelQueue
from edge_specdec.runtime.probes import CALL_SIZES, REAL_PAST, SHORT_CALL, longest_exact_call, passes_block_invariance
from edge_specdec.runtime.session import LONGEST_BLOCK, ModelSession, PagedSession, open_model
from support import load_target_xml, spy_block_sizes

WIDE = 80  # a call of more tokens than this writes other bits, as the AVX2 kernels do


class _WideCallDrifts(ModelSession):
    """A ModelSession whose cache slot for each token holds token * 31 + position, plus 1e-3 when a call of more
    than `wide` tokens wrote it; a row's logits are the sum of the slots up to it. Records each call's size.
    longest: the model's longest block (None: a model that does not say, as one made without open_model)."""

    rollback_method = "fake"

    def __init__(self, wide: int = WIDE, longest=None):
        model = SimpleNamespace(compiled=SimpleNamespace(create_infer_request=lambda: None), device="CPU",
                                precision="dq", vocab_size=8, max_context=None, output_ids=None,
                                block_invariant=True, **({"longest_block": longest} if longest else {}))
        self.wide = wide
        self.slots: list[float] = []
        self.calls: list[int] = []
        super().__init__(model)

    def _restart(self):
        self.slots = []

    def _forget(self, n):
        del self.slots[-n:]

    def _infer(self, tokens, rows):
        self.calls.append(len(tokens))
        drift = 1e-3 if len(tokens) > self.wide else 0.0
        self.slots += [t * 31 + (self.length + i) + drift for i, t in enumerate(tokens)]
        sums = np.cumsum(np.asarray(self.slots, np.float64))[-len(tokens):]
        return np.repeat(sums[:, None], self.vocab_size, axis=1).astype(np.float32)[-max(rows, 2):]


def test_a_wide_call_no_longer_breaks_the_check_after_a_real_prefill():
    """Before the pieces, the probe after a real prefill of REAL_PAST tokens failed on such a session (the re-fed
    last prompt token got other bits than the prefill wrote), so a target like this was not exact."""
    session = _WideCallDrifts()
    assert REAL_PAST > WIDE
    assert passes_block_invariance(session)
    assert session.calls and max(session.calls) <= LONGEST_BLOCK and min(session.calls) >= 2


@pytest.mark.parametrize("n,rows", [(LONGEST_BLOCK + 1, 1), (150, 3), (150, 150), (2 * LONGEST_BLOCK, 70)])
def test_a_long_block_gives_the_rows_of_short_blocks(n, rows):
    tokens = list(np.random.default_rng(n).integers(0, 8, n))
    session = _WideCallDrifts()
    whole = session.feed(tokens, rows=rows)
    assert whole.shape[0] == rows and session.length == n
    assert all(2 <= c <= LONGEST_BLOCK for c in session.calls), session.calls
    session.reset()
    pieces = np.concatenate([session.feed(tokens[i:i + 8]) for i in range(0, n, 8)])
    assert np.array_equal(whole, pieces[-rows:])


def test_a_session_that_is_not_exact_keeps_one_call():
    session = _WideCallDrifts()
    session.block_invariant = False
    session.feed(list(range(8)) * 20, rows=1)
    assert session.calls == [160]


def test_the_pieces_on_a_real_model_give_its_logits(bundle_dir):
    model = open_model(load_target_xml(bundle_dir), known_invariant={"dq": True}, known_longest={"dq": 64})
    assert model.longest_block == 64
    exact, plain = model.session(), model.session()
    plain.block_invariant = False  # one call for the whole prompt
    tokens = list(np.random.default_rng(0).integers(0, model.vocab_size, 3 * 64 + 5))
    assert np.array_equal(exact.feed(tokens, rows=64 + 3), plain.feed(tokens, rows=64 + 3))
    assert exact.tokens == plain.tokens == tokens


# --- the longest exact call, measured -----------------------------------------------------------------------------

@pytest.mark.parametrize("wide,longest", [(WIDE, 64), (200, 128), (10_000, max(CALL_SIZES)), (10, SHORT_CALL)])
def test_the_probe_takes_the_longest_call_that_keeps_the_bits(wide, longest):
    """The probe refuses the first size whose call writes other bits (and every size above it)."""
    session = _WideCallDrifts(wide)
    session.longest_call = 32
    assert longest_exact_call(session) == longest
    assert session.length == 0 and session.longest_call == 32  # left empty, its bound as it was


def test_the_probe_sees_bits_a_long_call_leaves_in_the_cache():
    """A call whose own rows are right but which writes other key/value bits: the short call after it sees them."""
    class WritesOtherSlots(_WideCallDrifts):
        def _infer(self, tokens, rows):
            logits = super()._infer(tokens, rows)
            if len(tokens) > WIDE:
                self.slots[-1] += 1.0  # after its rows were computed
            return logits
    assert longest_exact_call(WritesOtherSlots(wide=10_000)) == 64


def test_a_session_feeds_pieces_of_its_models_longest_block():
    session = _WideCallDrifts(wide=10_000, longest=128)
    assert session.longest_block == 128
    session.feed(list(range(8)) * 40, rows=1)
    assert max(session.calls) <= 128 and len(session.calls) == 3  # 320 tokens in even pieces: 107, 106, 107
    assert _WideCallDrifts().longest_block == LONGEST_BLOCK  # a model that does not say: the AVX2 measurement


def _fake_kernel_switch(monkeypatch, wide: int) -> None:
    """Paged sessions' calls of more than `wide` tokens write other key/value bits and give other rows, as another
    matmul kernel for many rows would."""
    real = PagedSession.infer_alone

    def infer_alone(self, tokens, rows):
        logits = real(self, tokens, rows)
        if len(tokens) > wide:
            for name in self.pool.names[:1]:  # the first layer's keys of this call's first slot
                data = self.pool.tensors[name].data
                block, slot = divmod(self.length, self.block_size)
                data[self.blocks[block], :, slot] += 1
            logits = logits + 1e-3
        return logits
    monkeypatch.setattr(PagedSession, "infer_alone", infer_alone)


def test_open_model_measures_the_longest_call_and_feeds_prompts_in_pieces_of_it(bundle_dir, monkeypatch):
    """With a kernel switch beyond 100 tokens, the model keeps calls of at most 64 and stays exact; a prompt
    longer than that gives the logits of the same tokens fed in calls of 8."""
    _fake_kernel_switch(monkeypatch, 100)
    known, longest = {}, {}
    model = open_model(load_target_xml(bundle_dir), known_invariant=known, known_longest=longest)
    assert longest == {"dq": 64} and known == {"dq": True} and model.longest_block == 64
    assert model.block_invariant
    session = model.session()
    calls = spy_block_sizes(session, monkeypatch)
    tokens = list(np.random.default_rng(4).integers(0, model.vocab_size, 300))
    whole = session.feed(tokens)
    assert calls and max(calls) <= 64
    session.reset()
    pieces = np.concatenate([session.feed(tokens[i:i + 8]) for i in range(0, 300, 8)])
    assert np.array_equal(whole, pieces)


def test_without_a_switch_the_tiny_model_takes_the_longest_size_tried(bundle_dir, monkeypatch):
    longest: dict = {}
    model = open_model(load_target_xml(bundle_dir), known_invariant={}, known_longest=longest)
    assert longest == {"dq": max(CALL_SIZES)} and model.session().longest_block == max(CALL_SIZES)
    session = model.session()
    calls = spy_block_sizes(session, monkeypatch)
    session.feed(list(np.random.default_rng(5).integers(0, model.vocab_size, 300)), rows=1)
    assert calls == [150, 150]  # 300 tokens in two even pieces, each more than the AVX2 CPU's 64


def test_a_verdict_is_reused_only_with_its_longest_call(bundle_dir, monkeypatch):
    """A verdict of exactness was measured with the prefill's pieces of one size: with no longest call beside it
    (measured again now), the verdict is measured again too; with both known, neither is."""
    probes: list[str] = []
    check, probe = session_module.passes_block_invariance, session_module.longest_exact_call
    monkeypatch.setattr(session_module, "passes_block_invariance", lambda s: probes.append("check") or check(s))
    monkeypatch.setattr(session_module, "longest_exact_call", lambda s: probes.append("longest") or probe(s))
    known = {"dq": False}  # a verdict without its layout: not read
    longest: dict = {}
    model = open_model(load_target_xml(bundle_dir), known_invariant=known, known_longest=longest)
    assert probes == ["longest", "check"] and model.block_invariant and model.precision == "dq"
    assert known == {"dq": True} and longest == {"dq": max(CALL_SIZES)}
    open_model(load_target_xml(bundle_dir), known_invariant=known, known_longest=longest)
    assert probes == ["longest", "check"]  # both from the earlier answers


def test_a_batched_call_holds_at_most_the_longest_block(monkeypatch):
    """The pending calls of several sessions (a new prompt among them) run in groups of at most LONGEST_BLOCK
    tokens; before, any mix of calls up to 1024 tokens ran as one call."""
    groups: list[list[int]] = []

    def together(self, calls):
        groups.append([len(c.tokens) for c in calls])
        return [np.zeros((c.rows, 1)) for c in calls]

    def alone(tokens, rows):
        groups.append([len(tokens)])
        return np.zeros((rows, 1))

    monkeypatch.setattr(ModelQueue, "__init__", lambda self: None)
    monkeypatch.setattr(ModelQueue, "together", together)
    session = SimpleNamespace(longest_block=LONGEST_BLOCK, infer_alone=alone)
    sizes = [5, LONGEST_BLOCK - 4, 6, 6, 3]
    batch = [Call(session, [1] * n, 1) for n in sizes]
    ModelQueue().run(batch)
    assert all(c.logits is not None and c.error is None for c in batch)
    assert sorted(n for group in groups for n in group) == sorted(sizes)
    assert all(sum(group) <= LONGEST_BLOCK for group in groups), groups
    assert len(groups) == 3  # [5], [60], [6, 6, 3]


def test_a_short_context_keeps_its_longest_call_to_itself(bundle_dir):
    """A context too short for the probe's longest sizes gives a shorter answer, which is that model's only: neither
    it nor the verdict measured with it goes to the measurement cache, where an engine of the same bundle with
    the whole context would read it (before, it did, and fed every prompt in pieces of 8)."""
    known, longest = {}, {}
    model = open_model(load_target_xml(bundle_dir), max_context=120, known_invariant=known, known_longest=longest)
    assert model.block_invariant and model.longest_block == 64  # 40 + 64 + 4 tokens fit in 120; 40 + 128 + 4 do not
    assert known == {} and longest == {}
    whole = open_model(load_target_xml(bundle_dir), known_invariant=known, known_longest=longest)
    assert whole.longest_block == max(CALL_SIZES) and longest == {"dq": max(CALL_SIZES)} and known == {"dq": True}


def test_the_batching_check_runs_where_the_longest_exact_call_is_short(bundle_dir):
    """The batching check's new prompt fits the longest exact call of any machine (before, under 33 tokens it drew
    from an empty range and raised)."""
    from edge_specdec.runtime.batching import batch_invariant

    model = open_model(load_target_xml(bundle_dir), known_invariant={"dq": True}, known_longest={"dq": SHORT_CALL})
    assert model.longest_block == SHORT_CALL and batch_invariant(model)
