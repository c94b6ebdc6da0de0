"""Long blocks: an exact session never makes a call of more than LONGEST_BLOCK tokens (session.py, "Long blocks").

On an AVX2 CPU the real 1.5B int4 target's rows change bits once a call holds more than about 80 tokens. The
stand-in session below does the same to the cache slots a long call writes, so a prompt prefilled in one call
leaves other values than the same tokens fed in blocks. The tiny OpenVINO models do not show the effect, so the
pieces themselves are checked on one of them (same logits, every call between 2 and LONGEST_BLOCK tokens)."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from edge_specdec.runtime.batching import Call, ModelQueue
from edge_specdec.runtime.probes import REAL_PAST, passes_block_invariance
from edge_specdec.runtime.session import LONGEST_BLOCK, ModelSession, open_model
from support import load_target_xml

WIDE = 80  # a call of more tokens than this writes other bits, as the AVX2 kernels do


class _WideCallDrifts(ModelSession):
    """A ModelSession whose cache slot for each token holds token * 31 + position, plus 1e-3 when a call of more
    than WIDE tokens wrote it; a row's logits are the sum of the slots up to it. Records each call's size."""

    rollback_method = "fake"

    def __init__(self):
        model = SimpleNamespace(compiled=SimpleNamespace(create_infer_request=lambda: None), device="CPU",
                                precision="dq", vocab_size=8, max_context=None, output_ids=None,
                                block_invariant=True)
        self.slots: list[float] = []
        self.calls: list[int] = []
        super().__init__(model)

    def _restart(self):
        self.slots = []

    def _forget(self, n):
        del self.slots[-n:]

    def _infer(self, tokens, rows):
        self.calls.append(len(tokens))
        drift = 1e-3 if len(tokens) > WIDE else 0.0
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
    model = open_model(load_target_xml(bundle_dir), known_invariant={"dq": True})
    exact, plain = model.session(), model.session()
    plain.block_invariant = False  # one call for the whole prompt
    tokens = list(np.random.default_rng(0).integers(0, model.vocab_size, 3 * LONGEST_BLOCK + 5))
    assert np.array_equal(exact.feed(tokens, rows=LONGEST_BLOCK + 3), plain.feed(tokens, rows=LONGEST_BLOCK + 3))
    assert exact.tokens == plain.tokens == tokens


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
