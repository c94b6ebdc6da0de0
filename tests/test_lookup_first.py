"""LookupFirst: a draft model's round first looks for the next tokens in the text so far, and stays lossless."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from edge_specdec.runtime import GenerationConfig, Pipeline
from edge_specdec.runtime.drafters import LookupFirst, Proposal
from hostile_text import HOSTILE_STRINGS
from support import ALPHA, N_SAMPLES, OTHER_VOCAB, SAME_VOCAB, SAMPLING, homogeneity_pvalue

REPEATING = ["def f(x):\n    return x\n" * 3 + "def f(x):\n", "a b a b a b a b",
             "def f(x):\n    return x\n\ndef g(x):\n    return x\n\ndef h(x):\n",
             "one two three four. one two three four. one two"]


class Recorder:
    """A stand-in draft model: proposes [7] and records each call."""

    def __init__(self):
        self.calls = []

    def propose(self, sequence, k):
        self.calls.append((list(sequence), k))
        return Proposal([7], None)


def test_a_repeat_is_proposed_without_the_model():
    model = Recorder()
    drafter = LookupFirst(model)
    sequence = [1, 2, 3, 4, 5, 6, 9, 9, 1, 2]  # the tail (1, 2) occurred at the start, then 3 4 5 6
    assert drafter.propose(sequence, 4).tokens == [3, 4, 5, 6]
    assert model.calls == [] and drafter.lookup_rounds == 1
    assert drafter.propose(sequence, 2).tokens == [7]  # k allows fewer than min_tokens: the model drafts
    assert drafter.propose([5, 8, 1, 2, 3], 4).tokens == [7]  # nothing repeats: the model drafts
    assert len(model.calls) == 2 and drafter.lookup_rounds == 1


def test_a_match_needs_two_tokens_of_context_and_three_to_copy():
    model = Recorder()
    drafter = LookupFirst(model)
    assert drafter.propose([1, 2, 3, 4, 8, 1], 4).tokens == [7]  # one token of context (1): too little evidence
    assert drafter.propose([6, 3, 4, 3, 4], 4).tokens == [7]  # (3, 4) matched, but only 3 4 follow it
    assert drafter.propose([1, 2, 3, 9, 6, 1, 2], 4).tokens == [3, 9, 6, 1]
    assert drafter.lookup_rounds == 1


def test_a_shorter_match_copies_fewer_tokens():
    model = Recorder()
    drafter = LookupFirst(model)
    body = list(range(20, 32))  # 12 tokens that follow the matched context
    # context (1, 2) matched: 2 tokens each, at most 4 copied; (3, 1, 2): 6; (5, 3, 1, 2), the longest n-gram: all k
    assert drafter.propose([1, 2] + body + [9, 1, 2], 8).tokens == body[:4]
    assert drafter.propose([3, 1, 2] + body + [9, 3, 1, 2], 8).tokens == body[:6]
    assert drafter.propose([5, 3, 1, 2] + body + [5, 3, 1, 2], 8).tokens == body[:8]
    assert model.calls == [] and drafter.lookup_rounds == 3


@pytest.fixture(scope="module")
def pipes(bundle_dir):
    return {"standard": Pipeline(bundle_dir(*SAME_VOCAB)), "hetero": Pipeline(bundle_dir(*OTHER_VOCAB))}


@pytest.mark.parametrize("algorithm", ["standard", "slem", "tli", "slrs"])
def test_greedy_is_lossless_with_lookup_rounds(pipes, algorithm):
    pipe = pipes["standard" if algorithm == "standard" else "hetero"]
    looked_up = 0
    for prompt in REPEATING + [s for s in HOSTILE_STRINGS if s.strip()]:
        config = GenerationConfig(max_new_tokens=24, ignore_eos=True)
        base = pipe.generate(prompt, config, algorithm="none")
        spec = pipe.generate(prompt, config, algorithm=algorithm, num_assistant_tokens=4)
        assert spec.token_ids == base.token_ids, (algorithm, prompt)
        looked_up += spec.extra["lookup_rounds"]
        off = pipe.generate(prompt, config, algorithm=algorithm, num_assistant_tokens=4, lookup=False)
        assert off.token_ids == base.token_ids and off.extra.get("lookup_rounds", 0) == 0
    assert looked_up > 0  # the prompts repeat themselves: some rounds were copies, and they stayed exact


@pytest.mark.slow
def test_sampling_is_lossless_with_lookup_rounds(pipes):
    """On a prompt that repeats, the first round is a copy; the sampled tokens keep the target's distribution."""
    from collections import Counter

    pipe = pipes["standard"]
    prompt = "a b c d a b c d a b c d a b"
    samples = {"none": Counter(), "standard": Counter()}
    looked_up = 0
    for algorithm, offset in (("none", 0), ("standard", 50_000)):
        for seed in range(offset, offset + N_SAMPLES):
            config = GenerationConfig(max_new_tokens=5, seed=seed, ignore_eos=True, **SAMPLING)
            result = pipe.generate(prompt, config, algorithm=algorithm, num_assistant_tokens=4)
            samples[algorithm][tuple(result.token_ids[:2])] += 1
            looked_up += result.extra.get("lookup_rounds", 0)
    assert looked_up >= N_SAMPLES  # every speculative run started with a copied round
    assert len(samples["none"]) > 5, "the test distribution is too concentrated to tell anything"
    assert homogeneity_pvalue(samples["none"], samples["standard"]) > ALPHA


@pytest.mark.slow
def test_cli_no_lookup_and_the_json_count(bundle_dir):
    counts = {}
    for flags in ([], ["--no-lookup"]):
        proc = subprocess.run([sys.executable, "-m", "edge_specdec.cli", "run", str(bundle_dir(*SAME_VOCAB)),
                               "--prompt", REPEATING[0], "--max-new-tokens", "16", "--ignore-eos", "--json", *flags],
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        counts[bool(flags)] = json.loads(proc.stdout).get("lookup_rounds", 0)
    assert counts[False] > 0 and counts[True] == 0
