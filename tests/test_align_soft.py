"""align's training on the target's distribution (--soft-weight): where the soft labels go, and the loss they give.

The labels are checked on a hand-made pair of vocabularies whose expected positions are worked out by hand; the
loss against a cross-entropy computed here in numpy from the model's own logits."""
from __future__ import annotations

import math

import numpy as np
import pytest

from edge_specdec.export.align.train import Example, SoftLabels, sequence_loss, soft_labels
from edge_specdec.vocab_map import NO_TOKEN, build_vocab_map

# target: 0 "he", 1 "llo", 2 "hello", 3 " world", 4 "!", 5 EOS (no text)
# draft:  0 "he", 1 "llo", 2 " world", 3 "hel", 4 "lo", 5 "!", 6 EOS
TARGET = [b"he", b"llo", b"hello", b" world", b"!", None]
DRAFT = [b"he", b"llo", b" world", b"hel", b"lo", b"!", None]


@pytest.fixture()
def vocab_map():
    return build_vocab_map(TARGET, [False] * 6, 6, 5, DRAFT, [False] * 7, 7, 6)


def record(target_ids, top):
    return {"target_ids": target_ids, "target_top": [[ids, [math.log(p) for p in probs]] for ids, probs in top]}


def test_soft_labels_only_where_the_draft_token_is_the_targets_own(vocab_map):
    # the target wrote "hello" " world" "!" EOS; the draft spells it "he" "llo" " world" "!" EOS
    rec = record([2, 3, 4, 5], [([2, 0], [0.9, 0.1]),             # "hello": not in the draft's vocabulary
                                ([3, 4, 2], [0.6, 0.3, 0.1]),      # " world": shared; "hello" is not
                                ([4, 3], [0.5, 0.25]),             # "!": shared, the top two sum to 0.75
                                ([5, 4], [0.8, 0.2])])             # EOS: paired by the map
    labels = soft_labels(rec, [0, 1, 2, 5, 6], vocab_map)
    # "he" starts where "hello" starts but is another token; "llo" starts inside "hello"
    assert labels.positions.tolist() == [2, 3, 4]
    # each row: the shared candidates renormalized; the rest (not shared, or padding) the label at weight 0
    assert labels.ids.shape == labels.weights.shape == (3, 3)
    world, bang, eos = ([(i, round(w, 6)) for i, w in zip(ids.tolist(), ws.tolist())]
                        for ids, ws in zip(labels.ids, labels.weights))
    assert world == [(2, 0.666667), (5, 0.333333), (2, 0.0)]
    assert bang == [(5, 0.666667), (2, 0.333333), (5, 0.0)]
    assert eos == [(6, 0.8), (5, 0.2), (6, 0.0)]


def test_soft_labels_none_without_a_recorded_distribution_or_an_agreeing_position(vocab_map):
    assert soft_labels({"target_ids": [2]}, [0, 1], vocab_map) is None
    # the draft spells "hello" as "hel" "lo": no token of the two starts and ends together
    assert soft_labels(record([2], [([2], [1.0])]), [3, 4], vocab_map) is None
    assert vocab_map.target_to_draft[2] == NO_TOKEN


@pytest.fixture(scope="module")
def tiny_draft(model_dir):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(model_dir("llama-metaspace")).eval()


def numpy_log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_loss_mixes_the_targets_distribution_at_its_positions_only(tiny_draft):
    import torch
    rng = np.random.default_rng(0)
    vocab = tiny_draft.config.vocab_size
    ids = rng.integers(3, vocab, 12).tolist()
    n_loss = 7
    with torch.no_grad():
        rows = tiny_draft(input_ids=torch.tensor([ids[:-1]])).logits[0, -n_loss:].numpy()
    logp = numpy_log_softmax(rows)
    labels = ids[-n_loss:]
    positions = np.array([1, 4], dtype=np.int64)
    soft_ids = rng.integers(3, vocab, (2, 3))
    weights = np.array([[0.5, 0.3, 0.2], [0.7, 0.3, 0.0]], dtype=np.float32)
    example = Example(ids, n_loss, SoftLabels(positions, soft_ids, weights))
    hard = -logp[np.arange(n_loss), labels]
    soft = -(weights * logp[positions[:, None], soft_ids]).sum(-1)
    with torch.no_grad():
        plain = sequence_loss(tiny_draft, example).item()
        mixed = sequence_loss(tiny_draft, example, soft_weight=0.25).item()
        only_soft = sequence_loss(tiny_draft, example, soft_weight=1.0).item()
    assert plain == pytest.approx(hard.sum(), rel=1e-5)
    expected = hard.sum() + 0.25 * (soft - hard[positions]).sum()
    assert mixed == pytest.approx(expected, rel=1e-5)
    assert only_soft == pytest.approx(np.delete(hard, positions).sum() + soft.sum(), rel=1e-5)
    assert abs(mixed - plain) > 1e-3


def test_one_hot_soft_labels_on_the_label_change_nothing(tiny_draft):
    import torch
    ids = list(range(5, 17))
    n_loss = 6
    positions = np.arange(n_loss, dtype=np.int64)
    labels = np.array(ids[-n_loss:])[:, None]
    example = Example(ids, n_loss, SoftLabels(positions, np.repeat(labels, 2, axis=1),
                                             np.tile(np.array([1.0, 0.0], dtype=np.float32), (n_loss, 1))))
    with torch.no_grad():
        assert (sequence_loss(tiny_draft, example, soft_weight=0.7).item()
                == pytest.approx(sequence_loss(tiny_draft, example).item(), rel=1e-6))
