"""min_p, presence_penalty, frequency_penalty and logit_bias: what each does to the logits, the values refused, and
that a speculative run with each of them computes the target alone's tokens and logprob bits."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

from edge_specdec.errors import EdgeSpecdecError
from edge_specdec.runtime import GenerationConfig
from edge_specdec.runtime.sampling import distribution, penalize
from support import ALPHA, N_SAMPLES, OTHER_VOCAB, SAME_VOCAB, SAMPLING, bits, first_tokens, homogeneity_pvalue, \
    pipeline_cache

PROMPTS = ["a b a b a b a b", "def fib(n):\n    if n < 2:\n        return n\n", "The quick brown fox"]
RUNS = {SAME_VOCAB: [("standard", {"num_assistant_tokens": 4, "confidence": 0.0, "lookup": False}),
                     ("prompt-lookup", {"num_assistant_tokens": 3})],
        OTHER_VOCAB: [("slem", {"num_assistant_tokens": 4, "confidence": 0.0, "lookup": False}), ("tli", {})]}


@pytest.fixture(scope="module")
def pipes(bundle_dir):
    return pipeline_cache(bundle_dir)



# --- what each knob does ----------------------------------------------------------------------------------------

def test_presence_and_frequency_penalties_count_the_output_only_row_by_row():
    rows = np.zeros((3, 6), dtype=np.float32)
    config = GenerationConfig(presence_penalty=0.5, frequency_penalty=0.25)
    # prompt [1, 1]; output so far [2, 2, 3]; the block drafts 3, then 4
    out = penalize(rows, config, [1, 1, 2, 2, 3], [3, 4], prompt_length=2)
    assert out[0].tolist() == [0, 0, -1.0, -0.75, 0, 0]       # 2 twice, 3 once; the prompt's 1 not at all
    assert out[1].tolist() == [0, 0, -1.0, -1.0, 0, 0]        # after the drafted 3: twice
    assert out[2].tolist() == [0, 0, -1.0, -1.0, -0.75, 0]    # after the drafted 4: once
    negative = penalize(rows, GenerationConfig(presence_penalty=-2.0), [1, 2], [], prompt_length=1)
    assert negative[0].tolist() == [0, 0, 2.0, 0, 0, 0]       # a negative penalty favours what was written


def test_logit_bias_is_added_before_the_repetition_penalty():
    rows = np.array([[1.0, 2.0, -1.0, 0.5]], dtype=np.float32)
    config = GenerationConfig(logit_bias={0: 3.0, 2: -100.0}, repetition_penalty=2.0)
    out = penalize(rows, config, [0], [], prompt_length=1)
    assert out[0].tolist() == [2.0, 2.0, -101.0, 0.5]         # (1 + 3) / 2, then the others as they were
    assert rows[0].tolist() == [1.0, 2.0, -1.0, 0.5]          # the caller's rows are left alone


def test_logits_no_knob_adjusts_are_left_as_they_are():
    """penalize() copies and walks the rows only where a bias or a penalty is on: a run without them (the default)
    does no work per row for it."""
    rows = np.array([[1.0, -2.0, 3.0]], dtype=np.float32)
    assert penalize(rows, GenerationConfig(), [0, 1, 2], [1], prompt_length=1) is rows
    assert not GenerationConfig().adjusts_logits and GenerationConfig(repetition_penalty=1.1).adjusts_logits
    penalized = penalize(rows, GenerationConfig(repetition_penalty=2.0), [0, 1, 2], [], prompt_length=1)
    assert penalized is not rows and penalized.tolist() == [[0.5, -4.0, 1.5]]


def test_min_p_drops_tokens_under_a_share_of_the_most_likely():
    probabilities = np.array([0.5, 0.3, 0.15, 0.05])
    logits = np.log(probabilities)[None]
    kept = distribution(logits, GenerationConfig(temperature=1.0, min_p=0.4))[0]
    assert np.allclose(kept, [0.5 / 0.8, 0.3 / 0.8, 0, 0])     # 0.15 < 0.4 * 0.5: dropped
    assert np.allclose(distribution(logits, GenerationConfig(temperature=1.0))[0], probabilities)


@pytest.mark.parametrize("settings, words", [
    ({"min_p": 1.5}, "min_p must be between 0 and 1"),
    ({"min_p": -0.1}, "min_p must be between 0 and 1"),
    ({"min_p": float("nan")}, "min_p must be a finite number"),
    ({"presence_penalty": 2.5}, "presence_penalty must be between -2 and 2"),
    ({"frequency_penalty": -3}, "frequency_penalty must be between -2 and 2"),
    ({"frequency_penalty": "1"}, "frequency_penalty must be a finite number"),
    ({"logit_bias": {5: 101}}, r"logit_bias\[5\] must be between -100 and 100"),
    ({"logit_bias": {5: float("inf")}}, r"logit_bias\[5\] must be a finite number"),
    ({"logit_bias": {"5": 1}}, "logit_bias keys must be token ids"),
    ({"logit_bias": {-1: 1}}, "logit_bias keys must be token ids"),
    ({"logit_bias": [5]}, "logit_bias must be a dict"),
])
def test_bad_knob_values_are_refused_naming_the_field(settings, words):
    with pytest.raises(EdgeSpecdecError, match=words):
        GenerationConfig(**settings).validate()


def test_a_logit_bias_past_the_vocabulary_is_refused(pipes):
    pipe = pipes(SAME_VOCAB)
    with pytest.raises(EdgeSpecdecError, match="logit_bias names token id .* not a token of the target"):
        pipe.generate("x", GenerationConfig(max_new_tokens=2, logit_bias={pipe.target.vocab_size: 1.0}))


# --- exact under speculation ------------------------------------------------------------------------------------

def knob_settings(pipe, prompt: str) -> dict[str, dict]:
    """Each knob, set so that it matters: the logit bias pushes down the target alone's own second token and lifts
    another one; min_p is on (it leaves a greedy run as it was, by definition)."""
    plain = pipe.generate(prompt, GenerationConfig(max_new_tokens=16, ignore_eos=True), algorithm="none")
    lifted = (plain.token_ids[0] + 7) % pipe.target.vocab_size
    return {"presence_penalty": {"presence_penalty": 2.0},
            "frequency_penalty": {"frequency_penalty": 1.5},
            "logit_bias": {"logit_bias": {plain.token_ids[1]: -100.0, lifted: 2.5}},
            "min_p": {"min_p": 0.3},
            "all": {"presence_penalty": 0.7, "frequency_penalty": 0.6, "logit_bias": {lifted: 1.5}, "min_p": 0.1,
                    "repetition_penalty": 1.2}}


@pytest.mark.parametrize("pair", [SAME_VOCAB, OTHER_VOCAB], ids=["same-vocabulary", "other-vocabulary"])
def test_greedy_with_each_knob_is_the_target_alones_to_the_bit(pipes, pair):
    pipe = pipes(pair)
    changed = set()
    for prompt in PROMPTS:
        plain = pipe.generate(prompt, GenerationConfig(max_new_tokens=16, ignore_eos=True), algorithm="none")
        for name, knob in knob_settings(pipe, prompt).items():
            config = GenerationConfig(max_new_tokens=16, ignore_eos=True, logprobs=True, top_logprobs=2, **knob)
            base = pipe.generate(prompt, config, algorithm="none")
            if base.token_ids != plain.token_ids:
                changed.add(name)
            for algorithm, options in RUNS[pair]:
                result = pipe.generate(prompt, config, algorithm=algorithm, **options)
                assert result.exact
                assert result.token_ids == base.token_ids, (name, algorithm, prompt)
                assert bits(result.logprobs) == bits(base.logprobs), (name, algorithm, prompt)
    # every knob but min_p (which greedy decoding never feels) changed some output: the comparisons above saw it on
    assert changed >= {"presence_penalty", "frequency_penalty", "logit_bias", "all"}


def test_speculation_drafts_and_rolls_back_with_the_penalties_on(pipes):
    """The exactness above is not that of a run that never drafted: drafted tokens were kept and rejected."""
    pipe = pipes(SAME_VOCAB)
    config = GenerationConfig(max_new_tokens=32, ignore_eos=True, presence_penalty=1.0, frequency_penalty=0.5)
    result = pipe.generate(PROMPTS[0], config, algorithm="standard", num_assistant_tokens=4, confidence=0.0,
                           lookup=False)
    stats = result.stats
    assert stats.draft_tokens_accepted > 0 and stats.draft_tokens_proposed > stats.draft_tokens_accepted


# a negative frequency penalty makes the tiny target repeat its first token often: a concentrated distribution,
# decided by the counts of the tokens before each row
PENALIZED = {**SAMPLING, "frequency_penalty": -1.0}


@pytest.mark.slow
@pytest.mark.parametrize("pair, algorithm", [(SAME_VOCAB, "standard"), (OTHER_VOCAB, "tli")])
def test_sampling_with_a_frequency_penalty_is_lossless(pipes, pair, algorithm):
    """The first three sampled tokens with a frequency penalty have the target alone's distribution (chi-square,
    false-alarm rate 0.1%)."""
    pipe = pipes(pair)
    base = first_tokens(pipe, "none", range(N_SAMPLES), PENALIZED, n_tokens=3)
    spec = first_tokens(pipe, algorithm, range(10_000, 10_000 + N_SAMPLES), PENALIZED, n_tokens=3)
    assert len(base) > 5, "the test distribution is too concentrated to tell anything"
    assert homogeneity_pvalue(base, spec) > ALPHA


@pytest.mark.slow
def test_the_sampling_test_catches_penalties_that_miss_the_drafted_tokens(pipes, monkeypatch):
    """Verification whose rows count the context alone, not the drafted tokens before each row, samples another
    distribution, and the test above sees it (on the same-vocabulary pair, whose drafts are often accepted)."""
    import edge_specdec.runtime.verify as verify_module

    pipe = pipes(SAME_VOCAB)
    base = first_tokens(pipe, "none", range(N_SAMPLES), PENALIZED, n_tokens=3)

    def context_only(rows, config, context, block, prompt_length=0):
        return np.stack([penalize(row[None], config, context, [], prompt_length)[0] for row in rows])

    monkeypatch.setattr(verify_module, "penalize", context_only)
    broken = first_tokens(pipe, "standard", range(10_000, 10_000 + N_SAMPLES), PENALIZED, n_tokens=3)
    assert homogeneity_pvalue(base, broken) < ALPHA


# --- the command line -------------------------------------------------------------------------------------------

def test_run_flags_set_the_knobs(pipes, bundle_dir, capsys):
    """`run --presence-penalty ... --logit-bias ID+BIAS ...` generates what the same GenerationConfig does."""
    from edge_specdec.cli import main

    pipe = pipes(SAME_VOCAB)
    prompt = PROMPTS[1]
    plain = pipe.generate(prompt, GenerationConfig(max_new_tokens=16, ignore_eos=True), algorithm="none")
    pushed, lifted = plain.token_ids[1], (plain.token_ids[0] + 7) % pipe.target.vocab_size
    config = GenerationConfig(max_new_tokens=16, ignore_eos=True, presence_penalty=1.5, frequency_penalty=0.5,
                              min_p=0.1, logit_bias={pushed: -100.0, lifted: 2.5})
    alone = pipe.generate(prompt, config, algorithm="none")
    assert alone.token_ids != plain.token_ids
    capsys.readouterr()  # what building the bundle printed
    code = main(["run", str(bundle_dir(*SAME_VOCAB)), "--prompt", prompt, "--max-new-tokens", "16", "--ignore-eos",
                 "--json", "--algorithm", "standard", "--presence-penalty", "1.5", "--frequency-penalty", "0.5",
                 "--min-p", "0.1", "--logit-bias", f"{pushed}-100", "--logit-bias", f"{lifted}+2.5"])
    assert code == 0
    assert json.loads(capsys.readouterr().out)["token_ids"] == alone.token_ids


@pytest.mark.parametrize("args, words", [(["--logit-bias", "15043"], r"is not TOKEN_ID\+BIAS"),
                                         (["--logit-bias", "x+1"], r"is not TOKEN_ID\+BIAS"),
                                         (["--presence-penalty", "3"], "presence_penalty must be between -2 and 2"),
                                         (["--min-p", "2"], "min_p must be between 0 and 1"),
                                         (["--logit-bias", "5+500"], r"logit_bias\[5\] must be between")])
def test_run_refuses_bad_knobs_in_one_line(args, words, capsys):
    from edge_specdec.cli import main

    try:
        code = main(["run", "--prompt", "x", *args])
    except SystemExit as exc:  # argparse's own refusal of a value its type cannot read
        code = exc.code
    err = capsys.readouterr().err
    assert code in (1, 2) and re.search(words, err), err
