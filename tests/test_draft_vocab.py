"""The draft's cut output layer (--draft-vocab): the kept logits unchanged, the output still exact."""
from __future__ import annotations

import numpy as np
import pytest

from edge_specdec.bundle import load_bundle
from edge_specdec.errors import EdgeSpecdecError
from edge_specdec.runtime import GenerationConfig, Pipeline
from edge_specdec.runtime.drafters import DraftModelDrafter
from edge_specdec.runtime.pipeline import draft_output_ids
from edge_specdec.runtime.session import open_session
from edge_specdec.vocab_map import TokenBytes
from hostile_text import HOSTILE_STRINGS
from support import ALPHA, N_SAMPLES, OTHER_VOCAB, SAME_VOCAB, SAMPLING, first_tokens, homogeneity_pvalue, run_cli

KEEP = 150  # of the tiny tokenizers' 500-700 ids
PROMPTS = [s for s in HOSTILE_STRINGS if s.strip()][:12] + ["def fib(n):\n    return n", "a b a b a b"]


@pytest.mark.slow
@pytest.mark.parametrize("weights", ["int8", "int4", "fp16"])
@pytest.mark.parametrize("rollback", ["paged", "masked"])
def test_cut_output_layer_computes_the_kept_logits_and_nothing_else(bundle_dir, weights, rollback):
    """Any id set (not just a prefix): the kept columns as the whole layer computes them, the rest -inf.

    The tiny Qwen2 draft ties its output layer to the embedding, so this also shows the embedding keeps every row.
    """
    draft_xml = load_bundle(bundle_dir("qwen2-bytelevel", "qwen2-bytelevel-small", weights, weights)).draft.model_xml
    rng = np.random.default_rng(0)
    whole = open_session(draft_xml, rollback=rollback, block_invariant=False)
    ids = np.sort(rng.choice(whole.vocab_size, 200, replace=False))
    cut = open_session(draft_xml, rollback=rollback, block_invariant=False, output_ids=ids)
    assert cut.output_ids is not None and cut.vocab_size == whole.vocab_size
    assert cut.compiled.output("logits").get_partial_shape()[-1].get_length() == len(ids)
    seq = rng.integers(0, whole.vocab_size, 20).tolist()
    expected, got = whole.feed(seq), cut.feed(seq)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got[:, ids], expected[:, ids], rtol=1e-5, atol=1e-5)
    assert np.isneginf(np.delete(got, ids, axis=1)).all()


def test_draft_output_ids_keep_the_first_ids_and_every_special_token():
    tokens = TokenBytes.pack([b"a", b"b", b"c", b"d", None, b"e", None])  # None: special, or past the tokenizer
    assert draft_output_ids(tokens, 2).tolist() == [0, 1, 4, 6]
    assert draft_output_ids(tokens, 0) is None and draft_output_ids(tokens, 7) is None


@pytest.fixture(scope="module")
def cut_pipe(bundle_dir):
    return Pipeline(bundle_dir(*SAME_VOCAB), draft_vocab=KEEP)


@pytest.fixture(scope="module")
def cut_hetero(bundle_dir):
    return Pipeline(bundle_dir(*OTHER_VOCAB), draft_vocab=KEEP)


def test_greedy_stays_lossless_and_the_draft_proposes_only_kept_ids(cut_pipe, monkeypatch):
    kept = set(cut_pipe.draft.output_ids.tolist())
    assert len(kept) < cut_pipe.draft.vocab_size
    proposed: list[int] = []
    propose = DraftModelDrafter.propose

    def recording(self, sequence, k):
        proposal = propose(self, sequence, k)
        proposed.extend(proposal.tokens)
        return proposal
    monkeypatch.setattr(DraftModelDrafter, "propose", recording)
    config = GenerationConfig(max_new_tokens=20, ignore_eos=True)
    generated: set[int] = set()
    for prompt in PROMPTS:
        base = cut_pipe.generate(prompt, config, algorithm="none")
        spec = cut_pipe.generate(prompt, config, algorithm="standard", num_assistant_tokens=3, confidence=0.0,
                                 lookup=False)
        assert spec.token_ids == base.token_ids, prompt
        generated |= set(base.token_ids)
    assert proposed and set(proposed) <= kept
    assert generated - kept, "the target never wrote a cut id: the test would not notice a draft that could"


@pytest.mark.parametrize("algorithm", ["slem", "tli"])
def test_heterogeneous_greedy_stays_lossless(cut_hetero, algorithm):
    config = GenerationConfig(max_new_tokens=20, ignore_eos=True)
    for prompt in PROMPTS:
        base = cut_hetero.generate(prompt, config, algorithm="none")
        assert cut_hetero.generate(prompt, config, algorithm=algorithm).token_ids == base.token_ids, prompt


@pytest.mark.slow  # a distribution test each (the fast tier keeps test_runtime.py's)
@pytest.mark.parametrize("which,algorithm", [("cut_pipe", "standard"), ("cut_hetero", "tli")])
def test_sampling_stays_lossless(request, which, algorithm):
    """Rejection sampling against a draft that gives every cut id probability 0 (chi-square, 0.1%)."""
    pipe = request.getfixturevalue(which)
    base = first_tokens(pipe, "none", range(N_SAMPLES), SAMPLING)
    spec = first_tokens(pipe, algorithm, range(10_000, 10_000 + N_SAMPLES), SAMPLING)
    assert len(base) > 5
    assert homogeneity_pvalue(base, spec) > ALPHA


@pytest.mark.slow
def test_negative_draft_vocab_is_a_clear_error(bundle_dir):
    with pytest.raises(EdgeSpecdecError, match="draft_vocab must be 0"):
        Pipeline(bundle_dir(*SAME_VOCAB), draft_vocab=-1)
    proc = run_cli("run", str(bundle_dir(*SAME_VOCAB)), "--prompt", "hi", "--draft-vocab", "-3")
    assert proc.returncode == 1 and "draft_vocab must be 0" in proc.stderr and "Traceback" not in proc.stderr
