"""Structured output: every algorithm under a JSON schema, a regex and a grammar writes what the constrained target
alone writes (token ids and logprob bits of the masked distribution), sampled runs follow the masked distribution,
the output matches its constraint, forced tokens are counted as the grammar's, and bad constraints are clear
errors."""
from __future__ import annotations

import json
import re
from collections import Counter
from typing import Optional

import jsonschema
import numpy as np
import pytest

from edge_specdec.errors import EdgeSpecdecError
from edge_specdec.runtime import GenerationConfig, Pipeline
from edge_specdec.runtime.constraint import Constraint
from edge_specdec.runtime.grammar import constraint_problem
from edge_specdec.runtime.sampling import penalize, token_logprobs
from support import ALPHA, OTHER_VOCAB, SAME_VOCAB, bits, homogeneity_pvalue, pipeline_cache

PERSON = {"type": "object", "additionalProperties": False, "required": ["first_name_of_the_person", "age", "kind"],
          "properties": {"first_name_of_the_person": {"type": "string", "maxLength": 12},
                         "age": {"type": "integer", "minimum": 0, "maximum": 130},
                         "kind": {"enum": ["employee", "contractor", "visitor"]}}}
REGEX = r"def [a-z_]{1,12}\((x|y|self)(, [a-z]{1,6}){0,2}\):"
LARK = 'start: "SELECT " COLUMN (", " COLUMN)* " FROM " TABLE ";"\nCOLUMN: /[a-z]{1,8}/\nTABLE: "users" | "orders"'
GBNF = 'root ::= "answer: " ("yes" | "no" | "maybe") "."'
CONSTRAINTS = {"json_schema": Constraint.json_schema(PERSON), "json_object": Constraint.json_object(),
               "regex": Constraint.regex(REGEX), "lark": Constraint.grammar(LARK), "gbnf": Constraint.grammar(GBNF)}
RUNS = [(SAME_VOCAB, "standard", {}), (SAME_VOCAB, "standard", {"num_assistant_tokens": 3, "lookup": False}),
        (SAME_VOCAB, "prompt-lookup", {}), (OTHER_VOCAB, "slem", {}), (OTHER_VOCAB, "tli", {}),
        (OTHER_VOCAB, "slrs", {}), (OTHER_VOCAB, "auto", {})]


@pytest.fixture(scope="module")
def pipes(bundle_dir):
    """pipes(pair, **options) -> a Pipeline, built once per module."""
    return pipeline_cache(bundle_dir)



def matches(name: str, text: str) -> bool:
    """Does the text fit the constraint (checked by other code than the grammar engine's)?"""
    if name in ("json_schema", "json_object"):
        value = json.loads(text)
        jsonschema.validate(value, PERSON if name == "json_schema" else {"type": "object"})
        return True
    if name == "regex":
        return re.fullmatch(REGEX, text) is not None
    if name == "lark":
        return re.fullmatch(r"SELECT [a-z]{1,8}(, [a-z]{1,8})* FROM (users|orders);", text) is not None
    return re.fullmatch(r"answer: (yes|no|maybe)\.", text) is not None


# every algorithm under a schema, a regex and a Lark grammar; the other two forms through one drafter of each kind
CASES = ([(run, name) for run in RUNS for name in ("json_schema", "regex", "lark")]
         + [(RUNS[0], "gbnf"), (RUNS[3], "gbnf"), (RUNS[0], "json_object"), (RUNS[3], "json_object")])


# the fast tier: every algorithm under the schema, and a drafter of each kind under every form; the slow tier the rest
@pytest.mark.parametrize("pair,algorithm,options,name",
                         [pytest.param(*run, name, marks=() if name == "json_schema" or run in (RUNS[0], RUNS[3])
                                       else pytest.mark.slow) for run, name in CASES])
def test_every_algorithm_writes_the_constrained_target_alones_tokens_and_bits(pipes, pair, algorithm, options, name):
    pipe = pipes(pair, precision="dq")
    config = GenerationConfig(max_new_tokens=48, constraint=CONSTRAINTS[name], repetition_penalty=1.1,
                              logprobs=True, top_logprobs=3)
    alone = pipe.generate("def parse_args(", config, algorithm="none")
    run = pipe.generate("def parse_args(", config, algorithm=algorithm, **options)
    assert run.token_ids == alone.token_ids and bits(run.logprobs) == bits(alone.logprobs)
    assert run.text == alone.text and run.stop_reason == alone.stop_reason
    if run.stop_reason == "grammar":  # complete: it parses and validates
        assert run.extra["constraint_complete"] and matches(name, run.text), run.text
    assert all(np.isfinite(v) for lp in run.logprobs for _, v in lp.top)  # forbidden ids are not alternatives


@pytest.mark.parametrize("precision", ["dq", "f32"])
def test_both_precisions_and_reused_prefixes_stay_exact(pipes, precision):
    """The same request twice on one session (the second reuses the cached prompt) and on a fresh session."""
    pipe = pipes(SAME_VOCAB, precision=precision)
    config = GenerationConfig(max_new_tokens=40, constraint=CONSTRAINTS["json_schema"], logprobs=True)
    alone = pipe.generate("Person: ", config, algorithm="none")
    first = pipe.generate("Person: ", config, algorithm="standard")
    second = pipe.generate("Person: ", config, algorithm="standard")
    assert bits(first.logprobs) == bits(second.logprobs) == bits(alone.logprobs)
    assert second.stats.prompt_tokens_reused > 0 or not pipe.target.block_invariant


def masked_logprobs(pipe: Pipeline, prompt_ids: list[int], tokens: list[int], config: GenerationConfig):
    """The target's logprobs of tokens computed in one block from scratch, penalized, then masked by a fresh grammar
    walked along the tokens: what the constrained target alone computes at each position."""
    session = pipe.target
    session.reset()
    rows = session.feed(prompt_ids + tokens, rows=len(tokens) + 1)[:-1]
    session.reset()
    grammar = pipe.grammar_tokenizer.compile(config.constraint)
    rows = grammar.mask(penalize(rows, config, prompt_ids, tokens), tokens)
    return token_logprobs(rows, tokens, config)


@pytest.mark.parametrize("pair,algorithm", [(SAME_VOCAB, "standard"), (OTHER_VOCAB, "slem"), (OTHER_VOCAB, "tli")])
def test_sampled_runs_compute_every_position_with_the_masked_targets_bits(pipes, pair, algorithm):
    pipe = pipes(pair, precision="dq")
    prompt_ids = pipe.tokenizer.encode("def f(x):\n    return x")
    for seed in range(3):
        config = GenerationConfig(max_new_tokens=30, temperature=0.9, top_p=0.95, seed=seed, repetition_penalty=1.2,
                                  logprobs=True, top_logprobs=2, constraint=CONSTRAINTS["regex"])
        result = pipe.generate(prompt_ids, config, algorithm=algorithm, num_assistant_tokens=4, confidence=0.0)
        assert result.token_ids
        assert bits(result.logprobs) == bits(masked_logprobs(pipe, prompt_ids, result.token_ids, config))
        if result.stop_reason == "grammar":
            assert matches("regex", result.text)


def test_the_mask_check_fails_on_unmasked_rows(pipes):
    """The reference above can fail: the unmasked target's logprobs differ from a constrained run's."""
    pipe = pipes(SAME_VOCAB, precision="dq")
    prompt_ids = pipe.tokenizer.encode("def f(x):\n    return x")
    config = GenerationConfig(max_new_tokens=12, temperature=0.9, seed=0, logprobs=True,
                              constraint=CONSTRAINTS["regex"])
    result = pipe.generate(prompt_ids, config, algorithm="standard")
    session = pipe.target
    session.reset()
    rows = session.feed(prompt_ids + result.token_ids, rows=len(result.token_ids) + 1)[:-1]
    session.reset()
    assert bits(result.logprobs) != bits(token_logprobs(rows, result.token_ids, config))


@pytest.mark.slow  # a distribution test (the fast tier keeps test_runtime.py's)
def test_sampled_first_tokens_follow_the_masked_distribution(pipes):
    """200 seeded runs each, the constrained target alone against SLEM and the same-vocabulary draft: one
    distribution of the first three tokens (chi-square homogeneity, false-alarm rate ALPHA), and every sample
    is text the grammar allows."""
    constraint = Constraint.regex(r"(def|class|import|return) [a-z]{1,5}")
    samples = {}
    for pair, algorithm in [(SAME_VOCAB, "none"), (SAME_VOCAB, "standard"), (OTHER_VOCAB, "slem")]:
        pipe = pipes(pair, precision="dq")
        counts = Counter()
        for seed in range(200):
            config = GenerationConfig(max_new_tokens=3, temperature=1.0, seed=seed, constraint=constraint)
            result = pipe.generate("x = 1\n", config, algorithm=algorithm, num_assistant_tokens=3, confidence=0.0)
            assert re.fullmatch(r"(def|class|import|return)( [a-z]{0,5})?|(d|de|c|cl|cla|clas|i|im|imp|impo|"
                                r"impor|r|re|ret|retu|retur)", result.text), result.text
            counts[result.text] += 1
        samples[(pair, algorithm)] = counts
    alone = samples[(SAME_VOCAB, "none")]
    assert len(alone) > 3  # a distribution, not one answer
    for key in [(SAME_VOCAB, "standard"), (OTHER_VOCAB, "slem")]:
        assert homogeneity_pvalue(alone, samples[key]) > ALPHA, (key, samples[key], alone)


def test_forced_tokens_are_proposed_without_the_draft_and_counted_as_the_grammars(pipes):
    pipe = pipes(SAME_VOCAB, precision="dq")
    config = GenerationConfig(max_new_tokens=48, constraint=CONSTRAINTS["json_schema"])
    pieces = []  # no draft pool: an earlier test's answer copied from it would carry the keys instead
    run = pipe.generate("Person: ", config, algorithm="standard", on_text=pieces.append, pool_scope=None)
    alone = pipe.generate("Person: ", config, algorithm="none", pool_scope=None)
    assert run.token_ids == alone.token_ids
    # the schema's keys and the punctuation around them are forced: tokens the draft never had to propose
    assert run.stats.grammar_tokens_accepted >= 3 and run.stats.grammar_tokens_proposed >= 3
    assert alone.stats.grammar_tokens_proposed == 0  # the target alone proposes nothing, forced or not
    grammar_text = "".join(s.text for p in pieces for s in p.spans if s.source == "grammar")
    assert grammar_text.startswith('{"first_name') and '"age": ' in grammar_text and '"kind": "' in grammar_text
    assert sum(s.tokens for p in pieces for s in p.spans if s.source == "grammar") == run.stats.grammar_tokens_accepted


def test_a_constraint_not_met_within_max_tokens_ends_at_length_and_says_so(pipes):
    pipe = pipes(SAME_VOCAB, precision="dq")
    config = GenerationConfig(max_new_tokens=5, constraint=Constraint.regex(r"[a-z]{40}"))
    result = pipe.generate("x", config, algorithm="standard")
    assert result.stop_reason == "length" and result.extra["constraint_complete"] is False
    assert re.fullmatch(r"[a-z]+", result.text)


def test_a_complete_grammar_ends_the_run_without_another_pass(pipes):
    pipe = pipes(SAME_VOCAB, precision="dq")
    result = pipe.generate("x", GenerationConfig(max_new_tokens=50, constraint=Constraint.regex("ok")),
                           algorithm="none")
    assert result.text == "ok" and result.stop_reason == "grammar" and result.extra["constraint_complete"]
    assert result.stats.target_passes == len(result.token_ids)


@pytest.mark.parametrize("constraint,message", [
    (Constraint.regex("[unclosed"), "regex constraint cannot be used.*unclosed character class"),
    (Constraint.json_schema({"type": "object", "if": {"type": "object"}}), "json schema constraint cannot be used.*if"),
    (Constraint.json_schema("{not json"), "not valid JSON"),
    (Constraint.json_schema([1, 2]), "must be a JSON object"),
    (Constraint.grammar('start: "a" | undefined_rule'), "grammar constraint cannot be used"),
    (Constraint("xml", "<a/>"), "unknown constraint kind 'xml'"),
    (Constraint.regex(""), "needs its text"),
])
def test_bad_constraints_are_one_line_errors(pipes, constraint, message):
    pipe = pipes(SAME_VOCAB, precision="dq")
    with pytest.raises(EdgeSpecdecError, match=message) as e:
        pipe.generate("x", GenerationConfig(max_new_tokens=4, constraint=constraint))
    assert "\n" not in str(e.value)


EMPTY = {"regex": Constraint.regex(r"[^\s\S]"), "lark": Constraint.grammar("start: start"),
         "gbnf": Constraint.grammar("root ::= root"), "lark-prefix": Constraint.grammar('start: "ab" x\nx: x')}


@pytest.mark.parametrize("name", EMPTY)
def test_a_constraint_that_admits_no_text_is_refused_before_any_token(pipes, name):
    """A regex that matches nothing, a rule defined only by itself, a grammar that dead-ends after its forced
    prefix: refused by the check a server and the CLI make, and by the run itself before it writes a token."""
    constraint = EMPTY[name]
    assert "admits no text" in constraint_problem(constraint)
    if name == "lark-prefix":
        assert "nothing may follow 'ab'" in constraint_problem(constraint)
    pieces = []
    with pytest.raises(EdgeSpecdecError, match="admits no text") as e:
        pipes(SAME_VOCAB, precision="dq").generate("x", GenerationConfig(max_new_tokens=8, constraint=constraint),
                                                   on_text=pieces.append)
    assert pieces == [] and "\n" not in str(e.value)


class CountingMatcher:
    """An llguidance matcher that counts its fast-forward computations."""

    def __init__(self, matcher):
        self.matcher, self.ff_calls = matcher, 0

    def compute_ff_tokens(self):
        self.ff_calls += 1
        return self.matcher.compute_ff_tokens()

    def __getattr__(self, name):
        return getattr(self.matcher, name)


def test_a_long_forced_literal_is_computed_once_per_position_not_every_round(pipes):
    grammar = pipes(SAME_VOCAB, precision="dq").grammar_tokenizer.compile(Constraint.regex("a{20000}"))
    grammar.matcher = counting = CountingMatcher(grammar.matcher)
    rounds = 0
    while grammar.committed < 40:
        tokens = grammar.forced(4)
        assert 0 < len(tokens) <= 4  # a round takes at most what it asks for
        grammar.commit(tokens)
        rounds += 1
    assert rounds >= 10 and counting.ff_calls <= 2, counting.ff_calls


def spelled_bytes(pipe, monkeypatch) -> list[int]:
    """Spy: the length of every text the target's grammar tokenizer spells."""
    retokenizer = pipe.target_retokenizer
    lengths, continuation = [], retokenizer.continuation

    def spy(before, data):
        lengths.append(len(data))
        return continuation(before, data)
    monkeypatch.setattr(retokenizer, "continuation", spy)
    return lengths


def test_a_long_forced_literal_costs_about_what_a_short_one_does(pipes, monkeypatch):
    """llguidance spells the forced bytes at every mask: of 20,000 forced bytes only a head is spelled, so a run
    under a{20000} does about the work of one under a{200} (it took 20 times as long when the whole was)."""
    import time

    pipe = pipes(SAME_VOCAB, precision="dq")
    config = GenerationConfig(max_new_tokens=24, constraint=Constraint.regex("a{200}"))
    pipe.generate("x", config, algorithm="standard")  # compiled and warm
    costs = {}
    for n in (200, 20000):
        lengths = spelled_bytes(pipe, monkeypatch)
        start = time.perf_counter()
        run = pipe.generate("x", GenerationConfig(max_new_tokens=24, constraint=Constraint.regex(f"a{{{n}}}")),
                            algorithm="standard")
        costs[n] = time.perf_counter() - start, sum(lengths)
        assert run.text == "a" * len(run.text) and len(run.token_ids) == 24
        monkeypatch.undo()
    assert costs[20000][1] <= 4 * costs[200][1], costs
    assert costs[20000][0] <= 5 * costs[200][0] + 0.5, costs


@pytest.mark.parametrize("constraint", [Constraint.regex("a{100000}"),
                                        Constraint.regex("|".join(f"word{i}" for i in range(20000)))],
                         ids=["literal", "alternatives"])
def test_a_constraint_past_the_grammar_engines_limit_is_refused_with_it(pipes, constraint):
    assert "grammar engine's limit" in constraint_problem(constraint)
    with pytest.raises(EdgeSpecdecError, match="grammar engine's limit"):
        pipes(SAME_VOCAB, precision="dq").generate("x", GenerationConfig(max_new_tokens=8, constraint=constraint))


def test_a_constraint_of_the_wrong_type_is_refused_by_validate():
    with pytest.raises(EdgeSpecdecError, match="constraint must be a Constraint"):
        GenerationConfig(constraint={"regex": "a"}).validate()


@pytest.mark.slow
def test_the_cli_takes_a_schema_file_a_regex_and_says_what_is_wrong(bundle_dir, tmp_path):
    from support import run_cli
    schema = tmp_path / "person.json"
    schema.write_text(json.dumps(PERSON))
    out = run_cli("run", str(bundle_dir(*SAME_VOCAB)), "--prompt", "Person: ", "--json-schema", str(schema),
                  "--max-new-tokens", "48", "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["stop_reason"] == "grammar" and matches("json_schema", result["text"])
    assert result["stats"]["grammar_tokens_accepted"] >= 3
    out = run_cli("run", str(bundle_dir(*SAME_VOCAB)), "--prompt", "x", "--regex", "[a-")
    assert out.returncode != 0 and "unclosed character class" in out.stderr and "Traceback" not in out.stderr
    out = run_cli("run", str(bundle_dir(*SAME_VOCAB)), "--prompt", "x", "--regex", r"[^\s\S]")
    assert out.returncode != 0 and "admits no text" in out.stderr and "Traceback" not in out.stderr
    assert out.stdout == ""
    schema.write_text("{not json")
    out = run_cli("run", str(bundle_dir(*SAME_VOCAB)), "--prompt", "x", "--json-schema", str(schema))
    assert out.returncode != 0 and "not JSON" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize("pair,algorithm,options", [
    (SAME_VOCAB, "standard", {"concurrent": True}), (SAME_VOCAB, "standard", {"static_shapes": True}),
    (OTHER_VOCAB, "slem", {"batching": True}), (OTHER_VOCAB, "slem", {"fixed_blocks": True})],
    ids=["concurrent", "static", "batching", "fixed"])
def test_every_engine_mode_stays_exact_under_a_grammar(pipes, pair, algorithm, options):
    """Drafting ahead (a guessed proposal meets the grammar's forced tokens), batched verification, fixed blocks
    and static copies (forced tokens fill a round of k)."""
    pipe = pipes(pair, precision="dq", **options)
    config = GenerationConfig(max_new_tokens=40, constraint=CONSTRAINTS["json_schema"], logprobs=True)
    alone = pipe.generate("Person: ", config, algorithm="none")
    for k in (2, 5):
        run = pipe.generate("Person: ", config, algorithm=algorithm, num_assistant_tokens=k, confidence=0.0)
        assert run.token_ids == alone.token_ids and bits(run.logprobs) == bits(alone.logprobs)


def test_a_stop_string_and_a_special_token_prompt_under_a_grammar(pipes):
    pipe = pipes(OTHER_VOCAB, precision="dq")
    eos = pipe.bundle.target.eos_token_ids[0]
    config = GenerationConfig(max_new_tokens=40, constraint=CONSTRAINTS["json_schema"], stop_strings=['"age"'])
    for prompt in ([eos], "Person: "):
        alone = pipe.generate(prompt, config, algorithm="none")
        run = pipe.generate(prompt, config, algorithm="auto")
        assert run.token_ids == alone.token_ids and run.text == alone.text
        assert run.stop_reason == "stop_string" and '"age"' not in run.text


# --- a heterogeneous draft's own grammar ------------------------------------------------------------------------

def record_proposals(monkeypatch, pipe, prompt_ids: list[int], constraint: Constraint) -> list[tuple]:
    """Watch every proposal a drafter makes in the runs that follow (before the decode loop cuts it to what the
    grammar allows): (its length; how many of its tokens, from the first, the target's grammar allows after the
    sequence it was made for, checked with a fresh grammar walked from the prompt's end; whether the drafter's own
    grammar was in step with the output when it drafted; whether its tokens carry no distribution q)."""
    from edge_specdec.runtime import generate as loop

    seen, original = [], loop.propose

    def spy(drafter, sequence, k):
        proposal = original(drafter, sequence, k)
        if proposal is not None and proposal.tokens:
            grammar = pipe.grammar_tokenizer.compile(constraint, base=len(prompt_ids))
            own = getattr(drafter, "grammar", None)
            seen.append((len(proposal.tokens), grammar.valid_prefix(sequence, proposal.tokens),
                         own is not None and own.in_step, proposal.q is None or all(q is None for q in proposal.q)))
        return proposal
    monkeypatch.setattr(loop, "propose", spy)
    return seen


HETERO_RUNS = [("slem", {}), ("tli", {}), ("tli", {"temperature": 0.9, "top_p": 0.95, "seed": 1}),
               ("slrs", {"temperature": 1.0, "top_k": 3, "seed": 2})]


@pytest.mark.parametrize("name", ["json_schema", "regex", "lark"])
@pytest.mark.parametrize("algorithm,sampling", HETERO_RUNS, ids=["slem", "tli", "tli-sampled", "slrs-sampled"])
def test_a_heterogeneous_draft_proposes_only_what_the_grammar_allows(pipes, monkeypatch, algorithm, sampling, name):
    """The draft is masked by the constraint compiled for its own vocabulary: every token it proposes is one the
    target's grammar allows, so the decode loop cuts nothing (a free draft of these tiny models proposes text the
    grammar refuses in nearly every round)."""
    pipe = pipes(OTHER_VOCAB, precision="dq")
    prompt_ids = pipe.tokenizer.encode("def parse_args(")
    config = GenerationConfig(max_new_tokens=48, constraint=CONSTRAINTS[name], repetition_penalty=1.1,
                              **sampling)
    seen = record_proposals(monkeypatch, pipe, prompt_ids, CONSTRAINTS[name])
    run = pipe.generate(prompt_ids, config, algorithm=algorithm, num_assistant_tokens=4, confidence=0.0,
                        lookup=False)
    assert sum(n for n, *_ in seen) >= 8, seen  # the draft proposed something
    assert all(valid == n and in_step for n, valid, in_step, _ in seen), seen
    if not sampling:
        assert run.token_ids == pipe.generate(prompt_ids, config, algorithm="none").token_ids


def mask_of(grammar) -> Optional[bytes]:
    allowed = grammar.allowed()
    return None if allowed is None else np.packbits(allowed).tobytes()


def test_the_draft_grammar_rolls_back_to_a_respelled_output_and_out_of_step_back_in(pipes):
    """DraftGrammar.follow on the draft's spellings of an output: a respelled end, a spelling the grammar refuses
    (out of step: no mask, so the round drafts freely), the right one again, a complete text and back: after each,
    the same mask as a matcher that consumed that spelling from the start."""
    from edge_specdec.runtime.grammar import DraftGrammar

    pipe = pipes(OTHER_VOCAB, precision="dq")
    tokenizer, retok = pipe.draft_grammar_tokenizer, pipe.draft_retokenizer
    constraint = CONSTRAINTS["lark"]

    def spell(*pieces: bytes) -> list[int]:  # the draft tokens of each piece, one after the other
        return [t for piece in pieces for t in retok.longest_match(piece)]

    special = int(np.flatnonzero(~pipe.vocab_map.draft.has_text)[0])  # a token without text: never grammar text
    grammar = DraftGrammar(tokenizer, constraint)
    for tokens, in_step in [(spell(b"SELECT ", b"ab"), True), (spell(b"SELECT ", b"a", b"b, c"), True),
                            (spell(b"SELECT ") + [special], False), (spell(b"SELECT a", b"b, "), True),
                            (spell(b"SELECT ab FROM users;"), True), (spell(b"SELECT ab FROM "), True), ([], True)]:
        assert grammar.follow(tokens) is in_step and grammar.in_step is in_step
        fresh = DraftGrammar(tokenizer, constraint)
        assert fresh.follow(tokens) is in_step
        assert mask_of(grammar) == mask_of(fresh)
        if not in_step:
            assert grammar.allowed() is None and grammar.consumed == tokens[:-1]  # it kept what it could take
    grammar.follow(spell(b"SELECT ab FROM users;"))
    assert not grammar.allowed().any()  # complete: nothing more to draft (the run ends there)
    allowed = grammar.allowed() if grammar.follow(spell(b"SELECT ab")) else None
    assert allowed is not None and allowed[retok.longest_match(b",")[0]] and allowed[retok.longest_match(b" ")[0]]
    assert grammar.stats()["draft_grammar_rounds"] == {"masked": 8, "free": 1}


def test_the_draft_grammar_stays_in_step_with_the_output_through_a_run(pipes, monkeypatch):
    """In a run, the draft context respells the end of the output when the target kept only part of a draft token
    or wrote its own: each time the draft's matcher follows, it rolls back what changed and ends in the state of a
    matcher that consumed the spelling from the start."""
    from edge_specdec.runtime.grammar import DraftGrammar

    pipe = pipes(OTHER_VOCAB, precision="dq")
    original, events, name = DraftGrammar.follow, [], None

    def spy(self, tokens):
        rolled_back = any(a != b for a, b in zip(self.consumed, tokens)) or len(tokens) < len(self.consumed)
        in_step = original(self, tokens)
        fresh = DraftGrammar(pipe.draft_grammar_tokenizer, CONSTRAINTS[name])
        events.append((rolled_back, in_step, original(fresh, tokens) and mask_of(self) == mask_of(fresh)))
        return in_step
    monkeypatch.setattr(DraftGrammar, "follow", spy)
    for algorithm, name in [("slem", "lark"), ("slem", "json_schema"), ("tli", "regex")]:
        config = GenerationConfig(max_new_tokens=48, constraint=CONSTRAINTS[name], repetition_penalty=1.1)
        before = len(events)
        run = pipe.generate("def parse_args(", config, algorithm=algorithm, num_assistant_tokens=4, confidence=0.0,
                            lookup=False)
        assert run.token_ids == pipe.generate("def parse_args(", config, algorithm="none").token_ids
        assert run.extra["draft_grammar_rounds"] == {"masked": len(events) - before, "free": 0}
    assert events and all(in_step and same for _, in_step, same in events), events
    assert any(rolled_back for rolled_back, _, _ in events), events  # respelled ends were met


@pytest.mark.parametrize("algorithm,sampling", HETERO_RUNS, ids=["slem", "tli", "tli-sampled", "slrs-sampled"])
def test_a_round_whose_spelling_is_out_of_step_drafts_freely_and_the_next_is_masked_again(pipes, monkeypatch,
                                                                                           algorithm, sampling):
    """The second round's draft spelling is made one the grammar refuses (a token without text at its end, as a
    draft token that does not line up with the output would be): that round drafts freely, without a distribution
    q (the decode loop cuts it, which would bias rejection sampling of tokens drawn from q), the output is still
    the constrained target alone's, and every later round is masked."""
    from edge_specdec.runtime.grammar import DraftGrammar

    pipe = pipes(OTHER_VOCAB, precision="dq")
    special = int(np.flatnonzero(~pipe.vocab_map.draft.has_text)[0])
    original, calls = DraftGrammar.follow, []

    def spy(self, tokens):
        calls.append(len(calls))
        return original(self, tokens + [special] if len(calls) == 2 else tokens)
    monkeypatch.setattr(DraftGrammar, "follow", spy)
    prompt_ids = pipe.tokenizer.encode("def parse_args(")
    seen = record_proposals(monkeypatch, pipe, prompt_ids, CONSTRAINTS["json_schema"])
    config = GenerationConfig(max_new_tokens=48, constraint=CONSTRAINTS["json_schema"], repetition_penalty=1.1,
                              logprobs=True, **sampling)
    run = pipe.generate(prompt_ids, config, algorithm=algorithm, num_assistant_tokens=4, confidence=0.0,
                        lookup=False)
    assert run.extra["draft_grammar_rounds"] == {"masked": len(calls) - 1, "free": 1} and len(calls) >= 3
    if not sampling:
        alone = pipe.generate(prompt_ids, config, algorithm="none")
        assert run.token_ids == alone.token_ids and bits(run.logprobs) == bits(alone.logprobs)
    else:
        assert bits(run.logprobs) == bits(masked_logprobs(pipe, prompt_ids, run.token_ids, config))
    assert [in_step for _, _, in_step, _ in seen].count(False) == 1  # the free round proposed
    assert all(valid == n if in_step else no_q for n, valid, in_step, no_q in seen), seen


@pytest.mark.slow  # the only test of the fast tier's that would export these targets' bundles
@pytest.mark.parametrize("target", ["llama-metaspace-large", "gpt2-prefixspace-large"])
def test_forced_text_on_a_target_whose_tokenizer_adds_a_space_in_front(pipes, target):
    """llguidance's mask at forced bytes allows only the first token of the grammar tokenizer's spelling of them:
    a target whose encoder puts a SentencePiece dummy space (or a BOS) in front must spell them as a continuation,
    or the mask allows only a token the grammar refuses."""
    pipe = pipes((target, None, "int8", "int8"), precision="dq")
    config = GenerationConfig(max_new_tokens=40, constraint=Constraint.regex(r"result=(yes|no)"))
    result = pipe.generate("x", config, algorithm="none")
    assert result.stop_reason == "grammar" and result.extra["constraint_complete"], result
    assert re.fullmatch(r"result=(yes|no)", result.text), result.text
    assert result.stats.grammar_tokens_proposed == 0  # the target alone: nothing proposed
