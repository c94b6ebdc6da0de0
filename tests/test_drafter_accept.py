"""The drafter's accept step (the decode loop tells it each verification's outcome) and the registry's facts:
the `auto` rule, the defaults, and the help and README texts generated from it."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edge_specdec.bundle import load_bundle
from edge_specdec.errors import EdgeSpecdecError
from edge_specdec.runtime import generate as generate_module
from edge_specdec.runtime.algorithms import (ALGORITHMS, AUTO, REGISTRY, TLI_MIN_DRAFT_SHARE, algorithms_help,
                                             auto_algorithm, available, markdown_table, resolve)
from edge_specdec.runtime.drafters import DraftLength, DraftModelDrafter, Drafter, Proposal
from edge_specdec.runtime.sampling import GenerationConfig
from edge_specdec.runtime.session import open_session
from edge_specdec.runtime.text import TextStream
from support import SAME_VOCAB

REPO = Path(__file__).resolve().parent.parent


class Recording(Drafter):
    """A drafter that proposes what `inner` proposes and logs its calls to `log`, shared with the verify spy."""

    def __init__(self, inner: Drafter, log: list):
        self.inner, self.log = inner, log

    def propose(self, sequence: list[int], k: int) -> Proposal:
        self.log.append(("propose", len(sequence)))
        return self.inner.propose(sequence, k)

    def accept(self, n_accepted: int, next_token: int) -> None:
        self.log.append(("accept", n_accepted, next_token))


@pytest.fixture(scope="module")
def sessions(bundle_dir):
    bundle = load_bundle(bundle_dir(*SAME_VOCAB))
    return open_session(bundle.target.model_xml), open_session(bundle.draft.model_xml), bundle.load_vocab_map()


@pytest.mark.parametrize("concurrent", [False, True])
@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.8, "top_k": 5, "seed": 4}])
def test_the_drafter_hears_each_verification_right_after_it_in_order(sessions, monkeypatch, concurrent, sampling):
    target, draft, vocab_map = sessions
    log: list = []
    verify = generate_module.verify

    def spy(*args, **kwargs):
        verdict = verify(*args, **kwargs)
        log.append(("verify", verdict.accepted, verdict.next_token))
        return verdict

    monkeypatch.setattr(generate_module, "verify", spy)
    config = GenerationConfig(max_new_tokens=24, ignore_eos=True, **sampling)
    rng = np.random.default_rng(config.seed)
    drafter = Recording(DraftModelDrafter(draft, config, rng, width=target.vocab_size), log)
    result = generate_module.generate(target, [1, 2, 3, 4], config, TextStream(vocab_map.target), drafter,
                                      DraftLength(3), rng, concurrent=concurrent)
    verdicts = [entry for entry in log if entry[0] == "verify"]
    accepts = [entry for entry in log if entry[0] == "accept"]
    assert len(verdicts) == result.stats.rounds > 1
    assert [v[1:] for v in verdicts] == [a[1:] for a in accepts]  # exactly (accepted, next), in order
    for i, entry in enumerate(log):  # each verification is followed at once by its accept
        if entry[0] == "verify":
            assert log[i + 1] == ("accept", *entry[1:])
    assert sum(a[1] for a in accepts) == result.stats.draft_tokens_accepted
    # concurrent mode drafts the next round during the target pass: two proposals before a verification, the
    # guess's before the round's accept; sequential mode never does
    ahead = any(log[i][0] == log[i + 1][0] == "propose" for i in range(len(log) - 1))
    assert ahead == concurrent


def test_every_drafter_accepts_by_default():
    class Minimal(Drafter):
        def propose(self, sequence, k):
            return Proposal()

    drafter = Minimal()
    assert drafter.accept(2, 7) is None and drafter.stats() == {}


@pytest.mark.parametrize("relation,greedy,share,expected", [
    ("identical", True, 1.0, "standard"), ("identical", False, 1.0, "standard"),
    ("target-only", True, 0.0, "suffix"), ("target-only", False, 0.0, "suffix"),
    ("heterogeneous", True, 0.9, "slem"),
    ("heterogeneous", False, TLI_MIN_DRAFT_SHARE, "tli"),
    ("heterogeneous", False, TLI_MIN_DRAFT_SHARE - 0.01, "slem")])
def test_auto_follows_the_relation_the_sampling_mode_and_the_shared_vocabulary(relation, greedy, share, expected):
    assert auto_algorithm(relation, greedy, share) == expected
    assert resolve(AUTO, relation, relation != "target-only", greedy, share) == expected
    assert expected in available(relation, relation != "target-only")


def test_resolve_refuses_what_the_bundle_cannot_run():
    with pytest.raises(EdgeSpecdecError, match="unknown algorithm"):
        resolve("fast", "identical", True)
    with pytest.raises(EdgeSpecdecError, match="needs a draft model"):
        resolve("slem", "target-only", False)
    with pytest.raises(EdgeSpecdecError, match="Use none, prompt-lookup, suffix, slem, tli, slrs or auto"):
        resolve("standard", "heterogeneous", True)
    assert available("target-only", False) == ["none", "prompt-lookup", "suffix"]


def test_the_defaults_live_in_the_registry():
    assert not REGISTRY["none"].speculates and REGISTRY["none"].draft_tokens == 0
    assert REGISTRY["prompt-lookup"].draft_tokens == 3 and not REGISTRY["prompt-lookup"].drafts_ahead
    for name in ("standard", "slem", "tli", "slrs"):
        entry = REGISTRY[name]
        assert entry.needs_draft and entry.drafts_ahead and entry.draft_tokens == 8


def test_the_help_and_the_usage_page_are_the_registry():
    text = algorithms_help()
    for name in ALGORITHMS:
        assert f"\n  {name} " in text
    assert all(len(line) <= 110 for line in text.splitlines())
    assert markdown_table() in (REPO / "docs" / "usage.md").read_text(encoding="utf-8")
