"""The drafting guard: a run never slower than the target alone, measured as it runs; the output untouched."""
from __future__ import annotations

import dataclasses
import functools

import pytest

from edge_specdec.errors import EdgeSpecdecError
from edge_specdec.runtime import GenerationConfig, Pipeline
from edge_specdec.runtime.drafters import MOST_LOST, DraftingGuard, DraftLength
from support import OTHER_VOCAB


# a prompt whose answer repeats it: free copies carry most of the answer
REPEATING = "one two three four five six seven eight nine ten. " * 4


def simulate(guard: DraftingGuard, rounds: int, drafting=(3, 0.25), alone=(1, 0.1)) -> list[bool]:
    """Rounds on a made-up machine: (tokens, seconds) per drafting round and per round of the target alone; a
    third figure for drafting rounds gives the draft's part of their seconds."""
    modes = []
    for i in range(rounds):
        mode = guard.drafting()
        tokens, seconds, *draft_seconds = drafting if mode else alone
        guard.update(mode, tokens, seconds, first=i == 0, draft_seconds=draft_seconds[0] if draft_seconds else None)
        modes.append(mode)
    return modes


def simulate_rounds(guard: DraftingGuard, drafting: list[tuple[int, float]], alone=(1, 0.1),
                    draft_seconds: float = 0.04) -> list[bool]:
    """Like simulate, with each round's (tokens, seconds) had it drafted, in turn: what drafting gives changes from
    round to round; the target alone's does not."""
    modes = []
    for i, (tokens, seconds) in enumerate(drafting):
        mode = guard.drafting()
        guard.update(mode, *((tokens, seconds) if mode else alone), first=i == 0,
                     draft_seconds=draft_seconds if mode else None)
        modes.append(mode)
    return modes


def rounds_that_keep_nothing(guard: DraftingGuard, rounds: int) -> list[bool]:
    """Rounds of a draft length under `guard` on a prompt the draft does not know: a drafting round costs a 0.04 s
    draft and a 0.12 s block and keeps nothing; the target alone takes 0.1 s a token. Whether each round drafted."""
    length = DraftLength(8, guard=guard)
    modes = []
    for i in range(rounds):
        drafting = length.round_k() > 0
        modes.append(drafting)
        length.update(0, 1, 0.04, 0.12, drafted=True, first=i == 0) if drafting else \
            length.update(0, 0, 0.0, 0.1, drafted=False, first=i == 0)
    return modes


def test_a_draft_whose_tokens_the_target_rejects_stops_within_a_few_rounds_whatever_the_prior():
    """A prompt the draft does not know (a translation): its rounds keep almost no drafted token, so each costs
    the draft's seconds for nothing. A prior from prompts where drafting won (its verdict checked again only 65
    rounds on) must not keep a short answer drafting to its end: the run's own rounds stop it."""
    won = {"mode": True, "interval": 64, "drafting": [20.0, 0.2], "alone": [1.8, 0.06]}  # another prompt's
    for prior in (None, won):
        guard = DraftingGuard(prior=prior)
        modes = rounds_that_keep_nothing(guard, 64)
        assert all(modes[:4]) and not any(modes[4:36])  # the first round and 3 measured ones, then the target alone
        # the loss was this prompt's: the next request starts from what the guard knew before it (the prior's
        # verdict), counting one run lost; with nothing known before, from this run's own verdict
        learned = guard.learned()
        assert learned["lost"] == 1
        assert learned["mode"] is False if prior is None else (learned["mode"], learned["interval"]) == (True, 64)


def test_after_a_sure_loss_drafting_is_checked_again_half_as_often_within_the_request():
    """A translation the draft does not know: after its sure loss (3 measured rounds) and the 2 rounds that measure
    the target alone, the target alone runs 2 * recheck rounds before drafting is measured again: each check costs
    the draft's catch-up on the tokens written meanwhile and a few losing rounds."""
    guard = DraftingGuard()
    modes = rounds_that_keep_nothing(guard, 80)
    checks = [i for i in range(1, len(modes)) if modes[i] and not modes[i - 1]]  # drafting measured again
    assert all(modes[:4]) and checks[0] == 4 + guard.probe + 2 * guard.recheck, modes


def test_a_prompt_whose_drafts_miss_does_not_keep_the_next_prompt_from_drafting():
    """A translation the draft does not know, then a prompt on which drafting wins: the first stops drafting after a
    few rounds, and the second, starting from the verdict the first leaves, drafts from its start."""
    won = {"mode": True, "interval": 64, "drafting": [20.0, 0.2], "alone": [1.8, 0.06]}
    translation = DraftingGuard(prior=won)
    modes = simulate(translation, 40, drafting=(1, 0.16, 0.04), alone=(1, 0.1))
    assert sum(modes) <= 4 + 4  # (the first round, 3 lost ones, and one probe of 4 rounds 32 rounds on)
    code = simulate(DraftingGuard(prior=translation.learned()), 64, drafting=(3, 0.2, 0.04), alone=(1, 0.1))
    assert code[0] and sum(not m for m in code) <= 2  # at most one probe of the target alone (the prior's rate)


def test_a_pair_whose_drafts_miss_on_every_prompt_learns_to_run_the_target_alone():
    """Sure losses run after run (a draft that knows none of the prompts, as the demo pair with its repetition
    penalty): the first is taken as the prompt's, the next ones as the pair's, so later runs start on the target
    alone and measure drafting less and less often, instead of drafting the first rounds of every run."""
    won = {"mode": True, "interval": 64, "drafting": [20.0, 0.2], "alone": [1.8, 0.06]}
    prior, drafted = won, []
    for run in range(8):
        guard = DraftingGuard(prior=prior)
        drafted.append(sum(simulate(guard, 64, drafting=(1, 0.16, 0.04), alone=(1, 0.1))))
        prior = guard.learned()
    assert drafted[0] >= 4 and drafted[1] >= 4  # a prompt's loss, then a second: both drafted their first rounds
    assert prior["mode"] is False and prior["lost"] == MOST_LOST
    # a 64-round run no longer checks drafting every time: at most one probe of drafting (its catch-up round and
    # 2 * probe rounds) every other run
    assert drafted[-1] == 0 and sum(drafted[-4:]) <= 2 * (2 * guard.probe + 1)


def test_a_draft_that_keeps_enough_is_never_cut_short():
    """kept * t >= rounds * d: the kept tokens pay for the draft's seconds; the stretch runs its course."""
    guard = DraftingGuard(prior={"mode": True, "interval": 64, "drafting": [20.0, 0.4], "alone": [1.8, 0.2]})
    modes = simulate(guard, 66, drafting=(2, 0.15, 0.03), alone=(1, 0.11))  # 1 kept of 2 drafted a round
    assert all(modes[:65])
    guard = DraftingGuard()
    guard.stretch = [3, 1, 0.03, 0.12]  # 1 kept in 3 rounds: 0.12 > 3 * 0.03 - not a sure loss
    assert not guard.sure_loss()
    guard.stretch = [3, 0, 0.01, 0.36]
    assert guard.sure_loss()


def test_a_few_rounds_that_keep_nothing_inside_a_winning_stretch_do_not_stop_drafting():
    """Inside an answer on which drafting wins (15 tokens/s against the target alone's 10), five rounds in a row
    keep nothing (6 tokens/s): the stretch as a whole still wins, so drafting goes on. A rate that forgets within a
    few rounds would judge those five alone, and run the target alone for the rest of the answer."""
    guard = DraftingGuard(prior={"mode": True, "interval": 64, "drafting": [15.0, 1.0], "alone": [10.0, 1.0]})
    assert all(simulate_rounds(guard, [(3, 0.2)] * 12 + [(1, 0.16)] * 5 + [(3, 0.2)] * 12))


def test_a_probe_compares_the_target_alone_with_the_whole_stretch_of_drafting_before_it():
    """A stretch of drafting that wins as a whole (about 12 tokens/s against 10) ends in five rounds that keep
    nothing, just before its probe of the target alone: the probe's verdict weighs the whole stretch, so drafting
    runs again after it."""
    guard = DraftingGuard(prior={"mode": True, "interval": 12, "left": 12, "drafting": [15.0, 1.0],
                                 "alone": [10.0, 1.0]})
    modes = simulate_rounds(guard, [(3, 0.2)] * 8 + [(1, 0.16)] * 5 + [(3, 0.2)] * 10)
    assert modes[:13] == [True] * 13 and not any(modes[13:15])  # the stretch, then the probe
    assert all(modes[15:])


def test_a_prior_that_drafting_wins_is_checked_once_drafting_loses_on_this_request():
    """Drafting keeps some tokens (no sure loss) but its rate falls under the target alone's: the stretch the
    prior granted (65 rounds) ends after `warmup` rounds, and the target alone is measured again."""
    prior = {"mode": True, "interval": 64, "drafting": [3.0, 0.3], "alone": [1.8, 0.18]}
    modes = simulate(DraftingGuard(prior=prior), 40, drafting=(2, 0.3, 0.03), alone=(1, 0.1))  # 6.7 vs 10 a s
    assert not all(modes[:20]) and sum(modes) < 20


def test_drafting_that_loses_is_paused_and_retried_now_and_then():
    modes = simulate(DraftingGuard(), 200, drafting=(2, 0.3), alone=(1, 0.1))  # 6.7 against 10 tokens/s
    assert all(modes[:5]) and not any(modes[5:7])  # warm-up rounds (the first too), then the probe
    assert sum(modes[7:]) <= 4 * (200 // 32 + 1)  # drafting again only in its re-checks
    assert not modes[-1] or not modes[-5]


def test_drafting_that_wins_keeps_drafting_bar_the_probes():
    modes = simulate(DraftingGuard(), 200, drafting=(3, 0.2), alone=(1, 0.1))  # 15 against 10 tokens/s
    assert sum(not m for m in modes) <= 2 * (200 // 32 + 1)
    assert modes[-1]


def test_a_machine_whose_load_changes_is_followed():
    guard = DraftingGuard()
    first = simulate(guard, 100, drafting=(3, 0.2), alone=(1, 0.1))
    later = simulate(guard, 200, drafting=(3, 0.6), alone=(1, 0.1))  # the draft slows down (a busy machine)
    assert first[-1] and sum(later[-100:]) <= 4 * (100 // 32 + 1)


def test_the_guard_leaves_the_output_alone_and_says_how_often_it_paused(bundle_dir, monkeypatch):
    pipe = Pipeline(bundle_dir(*OTHER_VOCAB))
    config = GenerationConfig(max_new_tokens=40, ignore_eos=True)
    alone = pipe.generate("def f(x):", config, algorithm="none")
    # a guard that finds drafting always slower: it pauses after its warm-up, the output is the same
    monkeypatch.setattr(DraftingGuard, "_faster", lambda self: False)
    guarded = pipe.generate("def f(x):", config, lookup=False)  # the guard governs the draft model's rounds
    assert guarded.token_ids == alone.token_ids and guarded.stats.rounds_drafting_paused > 0
    explicit = pipe.generate("def f(x):", config, algorithm="slem")  # an algorithm asked for by name: no guard
    assert explicit.stats.rounds_drafting_paused == 0 and explicit.token_ids == alone.token_ids


def test_a_seeded_sampled_run_is_not_guarded(bundle_dir):
    pipe = Pipeline(bundle_dir(*OTHER_VOCAB))
    config = GenerationConfig(max_new_tokens=8, temperature=0.8, seed=1)
    assert pipe.generate("def f(x):", config).stats.rounds_drafting_paused == 0
    with pytest.raises(EdgeSpecdecError, match="reproduce"):
        pipe.generate("def f(x):", config, guard=True)


def test_a_paused_run_steps_as_the_target_alone_steps(bundle_dir, monkeypatch):
    """With fixed blocks a drafting round widens the target's block to k + 1 tokens; a round the guard runs
    alone must not: it steps with the target alone's own block, or pausing would cost more than it saves."""
    from support import spy_block_sizes

    pipe = Pipeline(bundle_dir(*OTHER_VOCAB), fixed_blocks=True)
    monkeypatch.setattr(DraftingGuard, "_faster", lambda self: False)
    sizes = spy_block_sizes(pipe.target, monkeypatch)
    result = pipe.generate("def f(x):", GenerationConfig(max_new_tokens=30, ignore_eos=True), lookup=False)
    alone_step = pipe.block_shapes(0, False)["target"]
    assert result.stats.rounds_drafting_paused > 10 and alone_step < pipe.block_shapes(8, True)["target"]
    assert sizes[-10:] == [alone_step] * 10  # the last rounds, all paused


def test_free_copies_go_on_while_the_guard_pauses_the_draft_model(bundle_dir, monkeypatch):
    """The guard pauses the draft model, whose rounds cost draft time; a copy of text the request holds costs none,
    so a paused run still copies (the output unchanged), and a run the batching cap leaves no token does not."""
    pipe = Pipeline(bundle_dir(*OTHER_VOCAB))
    monkeypatch.setattr(DraftingGuard, "drafting", lambda self: False)  # the model paused in every round
    config = GenerationConfig(max_new_tokens=40, ignore_eos=True)
    alone = pipe.generate(REPEATING, config, algorithm="none")
    paused = pipe.generate(REPEATING, config)  # auto: the guard on, free copies first
    assert paused.token_ids == alone.token_ids
    assert paused.stats.draft_tokens_proposed == 0 and paused.stats.suffix_tokens_accepted > 0
    assert paused.stats.rounds < alone.stats.rounds
    monkeypatch.setattr(DraftLength, "copies_allowed", lambda self: False)  # a cap of 0 tokens a round
    capped = pipe.generate(REPEATING, config)
    assert capped.token_ids == alone.token_ids and capped.stats.suffix_tokens_accepted == 0


def test_a_paused_run_verifies_its_copies_in_the_fixed_block(bundle_dir, monkeypatch):
    """Where fixed blocks pay (the target verifies in a static block of k + 1 tokens), a copy that goes out while
    the guard pauses the draft model is verified in that block too, never in a block of its own length, which would
    run on the dynamic model: on a small target such a call costs several of its steps."""
    from support import spy_block_sizes

    pipe = Pipeline(bundle_dir(*OTHER_VOCAB), fixed_blocks=True)
    monkeypatch.setattr(DraftingGuard, "drafting", lambda self: False)  # the model paused in every round
    config = GenerationConfig(max_new_tokens=40, ignore_eos=True)
    alone = pipe.generate(REPEATING, config, algorithm="none")
    sizes = spy_block_sizes(pipe.target, monkeypatch)
    paused = pipe.generate(REPEATING, config)
    fixed, step = pipe.block_shapes(8, True)["target"], pipe.block_shapes(0, False)["target"]
    assert paused.token_ids == alone.token_ids and paused.stats.suffix_tokens_accepted > 0
    assert fixed > step and set(sizes[1:]) <= {fixed, step} and fixed in sizes[1:]  # (the first: the prompt)


def test_where_fixed_blocks_do_not_pay_copies_keep_their_length(bundle_dir, monkeypatch):
    """A target whose cheapest single step is a block of 2 and on which fixed blocks do not pay (the real 1.5B on
    the CPU): every round's block is at least 2 tokens, drafting or not, and a copy is not cut to fit a fixed block
    that does not exist."""
    from edge_specdec.runtime import pipeline as pipeline_module

    monkeypatch.setattr(pipeline_module, "fixed_block_pays", lambda session, size: False)
    monkeypatch.setattr(pipeline_module, "cheapest_step", lambda session: 2)
    pipe = Pipeline(bundle_dir(*OTHER_VOCAB))
    assert pipe.block_shapes(8, True)["target"] == pipe.block_shapes(0, False)["target"] == 2
    monkeypatch.setattr(DraftingGuard, "drafting", lambda self: False)  # the model paused: copies alone
    config = GenerationConfig(max_new_tokens=40, ignore_eos=True)
    alone = pipe.generate(REPEATING, config, algorithm="none")
    paused = pipe.generate(REPEATING, config)
    assert paused.token_ids == alone.token_ids
    copied = paused.stats.suffix_tokens_accepted + paused.stats.pool_tokens_accepted
    assert paused.stats.rounds <= 40 // 3 and copied >= 20, (paused.stats.rounds, copied)


@pytest.mark.slow
def test_the_server_keeps_the_guard_of_auto(bundle_dir, monkeypatch):
    """A request that names no algorithm runs `auto` with its guard, as `run` does; one that names the algorithm
    auto would pick runs without it (the guard is auto's)."""
    openai = pytest.importorskip("openai")
    pytest.importorskip("uvicorn")
    import edge_specdec.runtime.pipeline as pipeline
    from edge_specdec.runtime import Engine
    from edge_specdec.serve import ServerSettings
    from serve_helpers import serve_in_thread

    made = []

    class Spy(DraftingGuard):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(pipeline, "DraftingGuard", Spy)
    engine = Engine(bundle_dir(*OTHER_VOCAB))
    with serve_in_thread(ServerSettings(str(engine.bundle.path), slots=1, warm_up=False), engine) as running:
        c = openai.OpenAI(base_url=running.url + "/v1", api_key="none", max_retries=0, timeout=120)
        answer = c.completions.create(model="x", prompt="def f(", max_tokens=8, temperature=0)
        assert answer.model_extra["edge_specdec"]["algorithm"] == "slem" and len(made) == 1
        c.completions.create(model="x", prompt="def f(", max_tokens=8, temperature=0,
                             extra_body={"edge_specdec": {"algorithm": "slem"}})
        assert len(made) == 1


def test_a_prior_verdict_skips_the_warm_up_and_is_still_checked():
    """A pair on which drafting loses on every prompt: each run starts where the last ended, the target alone, and
    measures drafting again later the more runs in a row found it losing, up to 4 * recheck rounds."""
    losing = dict(drafting=(2, 0.3), alone=(1, 0.1))
    fresh = DraftingGuard()
    fresh_modes = simulate(fresh, 200, **losing)
    prior = fresh.learned()
    assert prior is not None and prior["mode"] is False and prior["lost"] == 1
    waits = []  # the rounds each later run runs the target alone before it drafts again
    for _ in range(7):
        guard = DraftingGuard(prior=prior)
        carried = simulate(guard, 200, **losing)
        waits.append(carried.index(True))
        assert sum(carried) < sum(fresh_modes)
        prior = guard.learned()
    assert waits[0] <= 4 + 1  # after one run that lost: within the warm-up's rounds
    assert waits == sorted(waits) and waits[-1] > 20 and max(waits) <= 4 * 32 + 1
    assert prior["lost"] == MOST_LOST
    # a prompt on which drafting wins after runs on which it lost: the guard follows within the run
    winning = simulate(DraftingGuard(prior=prior), 200, drafting=(3, 0.2), alone=(1, 0.1))
    assert not winning[0] and all(winning[-20:])


def test_after_one_prompt_on_which_drafting_lost_the_next_prompt_drafts_within_a_few_rounds():
    """Drafting lost on one prompt by its rate (not a sure loss: the draft guessed some prose, too little to pay):
    the next prompt, on which drafting wins, runs the target alone for at most the warm-up's rounds, not for the
    countdown the lost prompt left (here 32 rounds, a whole short answer), and its win clears the count."""
    guard = DraftingGuard()
    simulate(guard, 60, drafting=(2, 0.3), alone=(1, 0.1))
    prior = guard.learned()
    assert prior["mode"] is False and prior["lost"] == 1 and prior["left"] > 8
    guard = DraftingGuard(prior=prior)
    modes = simulate(guard, 40, drafting=(3, 0.2), alone=(1, 0.1))
    assert not any(modes[:5]) and modes.index(True) <= 4 + 1 and sum(modes) >= 30
    assert guard.learned()["mode"] is True and "lost" not in guard.learned()


def test_the_round_in_which_the_draft_catches_up_is_not_drafting_s_price():
    """A run that starts on the target alone (an earlier prompt lost) and then checks drafting: the first drafting
    round feeds the draft the prompt and every token written meanwhile, a prefill drafting pays once, not each
    round. Counted as a round, it would make drafting that wins (here 2 tokens in 0.15 s against 1 in 0.1 s)
    look like a loss, and the run would go on alone to its end."""
    prior = {"mode": False, "interval": 32, "left": 20, "lost": 2, "drafting": [2.0, 0.3], "alone": [1.0, 0.1]}
    guard = DraftingGuard(prior=prior)
    modes, drafted_before = [], False
    for i in range(60):
        mode = guard.drafting()
        if mode and not drafted_before:  # the catch-up: 0.5 s of the draft's prefill, then its usual round
            guard.update(True, 2, 0.65, first=i == 0, draft_seconds=0.53)
        elif mode:
            guard.update(True, 2, 0.15, first=i == 0, draft_seconds=0.03)
        else:
            guard.update(False, 1, 0.1, first=i == 0)
        drafted_before = mode
        modes.append(mode)
    start = modes.index(True)
    assert start <= 8 + 1  # two runs lost: drafting is checked after twice the warm-up's rounds
    assert sum(modes[start:]) >= len(modes[start:]) - 4  # then it drafts, bar a probe of the target alone
    assert guard.learned()["mode"] is True


def test_after_a_long_prompt_a_verdict_for_the_target_alone_keeps_its_whole_countdown():
    """After a long prompt a check of drafting costs the draft's prefill of its window: the runs there wait out the
    countdown the verdict carries (here 50 rounds), as many runs lost as it counts, and still count them."""
    prior = {"mode": False, "interval": 64, "left": 50, "lost": 1, "drafting": [2.0, 0.3], "alone": [1.0, 0.1]}
    guard = DraftingGuard(prior=prior, quick_recheck=False)
    modes = simulate(guard, 60, drafting=(2, 0.3), alone=(1, 0.1))
    assert not any(modes[:51]) and any(modes[51:])
    assert guard.learned()["lost"] == 2


@pytest.mark.parametrize("quick_recheck,waits", [(True, 128), (False, 256)])
def test_after_a_long_prompt_a_countdown_may_run_to_the_whole_interval(quick_recheck, waits):
    """A verdict that kept winning its checks has an interval of 8 * recheck rounds. A verdict for the target alone
    checks drafting within 4 * recheck rounds after a short prompt, and only after the whole interval after a long
    one, where each check pays the draft's prefill of its window; a verdict for drafting probes the target alone
    (which costs no prefill) within 4 * recheck rounds either way."""
    prior = {"mode": False, "interval": 256, "left": 256, "lost": 6, "drafting": [2.0, 0.3], "alone": [1.0, 0.1]}
    modes = simulate(DraftingGuard(prior=prior, quick_recheck=quick_recheck), 300, drafting=(2, 0.3), alone=(1, 0.1))
    assert modes.index(True) == waits + 1  # (+ the run's first round)
    prior = {**prior, "mode": True, "drafting": [3.0, 0.2]}
    modes = simulate(DraftingGuard(prior=prior, quick_recheck=quick_recheck), 300, drafting=(3, 0.2), alone=(1, 0.1))
    assert modes.index(False) == 128 + 1


def test_a_run_after_a_long_prompt_checks_drafting_only_when_the_countdown_runs_out(bundle_dir, monkeypatch):
    from edge_specdec.runtime import pipeline as pipeline_module

    monkeypatch.setattr(pipeline_module, "SEQUENCES_AFTER", 40)  # prompts of 40 tokens and more are long here
    made, original = [], DraftingGuard.__init__

    def recording(self, **options):
        made.append(options)
        original(self, **options)
    monkeypatch.setattr(DraftingGuard, "__init__", recording)
    pipe = Pipeline(bundle_dir(*OTHER_VOCAB))
    config = GenerationConfig(max_new_tokens=4, ignore_eos=True)
    pipe.generate("def f(x):\n    return x\n" * 8, config)  # a long prompt here
    pipe.generate("def f(x):", config)
    assert [options["quick_recheck"] for options in made] == [False, True]


def test_a_run_too_short_to_measure_drafting_keeps_the_count_of_runs_lost():
    prior = {"mode": False, "interval": 64, "left": 60, "lost": 3, "drafting": [2.0, 0.3], "alone": [1.0, 0.1]}
    guard = DraftingGuard(prior=prior)
    assert not any(simulate(guard, 6))  # a 6-token answer: the countdown (16 rounds after 3 runs lost) not run out
    assert guard.learned()["lost"] == 3 and guard.learned()["left"] == 16 + 1 - 6


def test_a_verdict_is_checked_again_across_requests_shorter_than_its_interval():
    """Each request shorter than the verdict's interval (a busy moment made the target alone win): the countdown
    to the next check goes on from one request to the next, so drafting is measured again and wins back, where
    each request restarting the countdown would run the target alone for ever."""
    guard = DraftingGuard()
    simulate(guard, 12, drafting=(2, 0.3), alone=(1, 0.1))  # drafting lost on a busy machine
    prior, drafted = guard.learned(), []
    assert prior["mode"] is False
    for request in range(6):  # 30-token answers on the machine, quiet again: drafting wins
        guard = DraftingGuard(prior=prior)
        drafted.append(sum(simulate(guard, 30, drafting=(3, 0.2), alone=(1, 0.1))))
        prior = guard.learned()
    assert drafted[0] + drafted[1] > 0 and drafted[-1] >= 28 and prior["mode"] is True


def test_nothing_is_learned_before_both_modes_ran():
    guard = DraftingGuard()
    simulate(guard, 3)  # still in its warm-up: only drafting measured
    assert guard.learned() is None


def test_the_next_run_of_an_engine_starts_from_the_guards_verdict(bundle_dir, monkeypatch):
    pipe = Pipeline(bundle_dir(*OTHER_VOCAB))
    config = GenerationConfig(max_new_tokens=30, ignore_eos=True)
    alone = pipe.generate("def f(x):", config, algorithm="none")
    monkeypatch.setattr(DraftingGuard, "_faster", lambda self: False)  # drafting always loses here, by its rate
    # (a sure loss speaks of the prompt, and carries nothing over: the test above)
    monkeypatch.setattr(DraftingGuard, "sure_loss", lambda self: False)
    first = pipe.generate("def f(x):", config, lookup=False)  # the guard governs the draft model's rounds
    second = pipe.generate("def f(x):", config, lookup=False)
    assert first.token_ids == second.token_ids == alone.token_ids
    drafted = [r.stats.rounds - r.stats.rounds_drafting_paused for r in (first, second)]
    # the first run drafts its warm-up rounds; the second starts where it ended, the target alone, and drafts only
    # when the first run's countdown to the next check runs out: one probe of drafting (the round in which the draft
    # catches up, then 2 * probe rounds)
    assert drafted[0] >= 5 and drafted[1] <= 5 and second.stats.rounds_drafting_paused > drafted[1]
    # another kind of request (a repetition penalty moves acceptance) does not take this verdict
    priors = []
    built = DraftingGuard.__init__
    monkeypatch.setattr(DraftingGuard, "__init__", lambda self, *a, **kw: (priors.append(kw.get("prior")),
                                                                          built(self, *a, **kw))[1])
    pipe.generate("def f(x):", config, lookup=False)
    pipe.generate("def f(x):", dataclasses.replace(config, repetition_penalty=1.3), lookup=False)
    assert priors[0]["mode"] is False and priors[1] is None


@pytest.mark.parametrize("other", ["def f(x):", "def f(x):\n    return x\n" * 20], ids=["short", "twice-as-long"])
def test_a_long_prompts_verdict_does_not_start_a_run_after_a_prompt_of_another_length(bundle_dir, monkeypatch,
                                                                                       other):
    """After a long prompt a target step and a verification block cost other times (a longer past, another call
    layout), and a verification block reads the past once per token, so drafting that wins after 2048 tokens can
    lose after 4096: the verdict learned there carries over to long prompts between the same powers of two only. A
    short prompt, and a prompt of the next band, start from their own."""
    from edge_specdec.runtime import pipeline as pipeline_module

    monkeypatch.setattr(pipeline_module, "SEQUENCES_AFTER", 40)  # prompts of 40 tokens and more are long here
    pipe = Pipeline(bundle_dir(*OTHER_VOCAB))
    config = GenerationConfig(max_new_tokens=30, ignore_eos=True)
    long_prompt = "def f(x):\n    return x\n" * 8
    length, other_length = (len(pipe.tokenizer.encode(prompt)) for prompt in (long_prompt, other))
    assert length >= 40 and (other_length < 40 or other_length.bit_length() > length.bit_length())
    monkeypatch.setattr(DraftingGuard, "_faster", lambda self: False)  # drafting loses after the long prompt
    monkeypatch.setattr(DraftingGuard, "sure_loss", lambda self: False)
    pipe.generate(long_prompt, config, lookup=False)
    again = pipe.generate(long_prompt, config, lookup=False)  # starts from the long prompt's verdict: alone
    monkeypatch.setattr(DraftingGuard, "_faster", lambda self: True)  # drafting wins after the other prompt
    monkeypatch.setattr(DraftingGuard, "_stretch_faster", lambda self: True)
    after_other = pipe.generate(other, config, lookup=False)
    assert again.stats.rounds_drafting_paused > again.stats.rounds // 2
    assert after_other.stats.rounds_drafting_paused < 5  # its own first run: it drafts but for a probe of alone


def test_a_long_prompts_verdict_is_kept_per_band_of_lengths_from_a_power_of_two_to_the_next():
    from edge_specdec.runtime.algorithms import REGISTRY
    from edge_specdec.runtime.pipeline import guard_key

    key = functools.partial(guard_key, REGISTRY["slem"], GenerationConfig())
    assert key(1023) == key(10) != key(1024) == key(2047) != key(2048) == key(4095) != key(4096) == key(8191)
    assert key(8192) != key(4096) and key(2048).startswith(key(10) + "/")


def test_a_verdict_learned_with_the_drafts_static_copies_does_not_steer_an_engine_without_them(bundle_dir, tmp_path):
    """The Python API and serve run a small draft on static copies of its call sizes, `run` and `chat` do not: the
    copies make the draft's calls cheaper, so drafting can win on one engine and lose on the other. Each keeps its
    own verdicts in the shared measurement cache, and a later process of the same kind reads them back."""
    from edge_specdec.runtime.pipeline import Engine

    folder = bundle_dir(*OTHER_VOCAB)
    with_copies = Engine(folder, cache_dir=tmp_path, static_shapes=True, warm_up=False)
    key = with_copies.default_guard_key()
    verdict = {"mode": False, "interval": 64, "drafting": [2.0, 0.3], "alone": [1.0, 0.1]}
    with_copies.remember_guard(key, verdict)
    without = Engine(folder, cache_dir=tmp_path, static_shapes=False, warm_up=False)  # reads the file written above
    assert without.measurements.path == with_copies.measurements.path and without.measurements.loaded
    assert without.guard_prior(key) is None
    without.remember_guard(key, {**verdict, "mode": True})
    again = Engine(folder, cache_dir=tmp_path, static_shapes=True, warm_up=False)
    assert again.guard_prior(key) == verdict
    assert Engine(folder, cache_dir=tmp_path, static_shapes=False, warm_up=False).guard_prior(key)["mode"] is True


def test_the_verdict_is_kept_on_disk_for_the_next_process(tmp_path):
    from edge_specdec.runtime.measurements import MeasurementCache
    plan = MeasurementCache(tmp_path, {"bundle": "b"})
    verdict = {"mode": False, "interval": 64, "drafting": [2.0, 0.3], "alone": [1.0, 0.1]}
    plan.put("guard/slem", verdict)
    assert MeasurementCache(tmp_path, {"bundle": "b"}).values["guard/slem"] == verdict
    plan.put("guard/slem", {**verdict, "left": 7})  # with the countdown to its next check
    assert MeasurementCache(tmp_path, {"bundle": "b"}).values["guard/slem"]["left"] == 7
    plan.put("guard/slem", {**verdict, "lost": 2})  # with the runs in a row that found drafting losing
    assert MeasurementCache(tmp_path, {"bundle": "b"}).values["guard/slem"]["lost"] == 2


def test_a_verdict_is_written_to_disk_only_when_its_mode_interval_or_runs_lost_change(tmp_path, monkeypatch):
    from edge_specdec.runtime.pipeline import Engine
    from edge_specdec.runtime.measurements import MeasurementCache

    writes = []
    monkeypatch.setattr(MeasurementCache, "save", lambda self: writes.append(dict(self.values)))
    engine = Engine.__new__(Engine)  # only its plan is used here
    engine.measurements = MeasurementCache(tmp_path, {"bundle": "b"})
    verdict = {"mode": False, "interval": 64, "drafting": [2.0, 0.3], "alone": [1.0, 0.1]}
    engine.remember_guard("slem", verdict)
    engine.remember_guard("slem", {**verdict, "alone": [1.1, 0.1]})  # new rates, the same verdict: memory only
    assert len(writes) == 1 and engine.guard_prior("slem")["alone"] == [1.1, 0.1]
    engine.remember_guard("slem", {**verdict, "interval": 128})
    assert len(writes) == 2
    engine.remember_guard("slem", {**verdict, "interval": 128, "lost": 2})  # one more run that found drafting losing
    assert len(writes) == 3 and engine.guard_prior("slem")["lost"] == 2


def test_one_shot_processes_get_drafting_back_after_a_verdict_for_the_target_alone(tmp_path):
    """Each `edge-specdec run` is a process of its own, which starts from the verdict on disk. A verdict for the
    target alone must carry its countdown there as it runs down, or runs shorter than it would each start from the
    same countdown and never check drafting again, even where it now wins."""
    from edge_specdec.runtime.measurements import MeasurementCache
    from edge_specdec.runtime.pipeline import Engine

    def fresh_engine() -> Engine:
        engine = Engine.__new__(Engine)  # only its measurement cache is used here, read from disk
        engine.measurements = MeasurementCache(tmp_path, {"bundle": "b"})
        return engine
    verdict = {"mode": False, "interval": 256, "left": 200, "lost": MOST_LOST, "drafting": [2.0, 0.3],
               "alone": [1.0, 0.1]}
    fresh_engine().remember_guard("slem", verdict)
    drafted = []
    for process in range(8):  # 40-token answers, on which drafting now wins
        engine = fresh_engine()
        guard = DraftingGuard(prior=engine.guard_prior("slem"))
        drafted.append(sum(simulate(guard, 40, drafting=(3, 0.2), alone=(1, 0.1))))
        engine.remember_guard("slem", guard.learned())
    assert drafted[:3] == [0, 0, 0] and drafted[-1] >= 35 and fresh_engine().guard_prior("slem")["mode"] is True


def test_the_benchmarks_guard_row_runs_the_default_with_its_guard(bundle_dir, monkeypatch):
    """`bench`'s rows name their algorithm, which turns the guard off; its -conf-guard row is the default as `auto`
    runs it, guard on (opt-in, not a default row), with the output unchanged."""
    from edge_specdec.benchmark.setups import candidate_specs

    specs = {s.name: s for s in candidate_specs("heterogeneous", [3])}
    row = specs["ours-slem-conf-guard"]
    assert not row.default and row.speculative().guard is True and specs["ours-slem-conf"].speculative().guard is None
    pipe = Pipeline(bundle_dir(*OTHER_VOCAB))
    config = GenerationConfig(max_new_tokens=30, ignore_eos=True)
    monkeypatch.setattr(DraftingGuard, "_faster", lambda self: False)  # drafting always loses here
    guarded = pipe.generate("def f(x):", config, row.speculative())
    plain = pipe.generate("def f(x):", config, specs["ours-slem-conf"].speculative())
    assert guarded.stats.rounds_drafting_paused > 0 and plain.stats.rounds_drafting_paused == 0
    assert guarded.token_ids == plain.token_ids


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_the_default_guard_key_is_the_one_a_run_of_the_default_keeps_its_verdict_under(bundle_dir, monkeypatch,
                                                                                       temperature):
    """Benchmarks and tests steer the default through its verdict (Engine.default_guard_key): the key must be the
    one a run of the default, greedy or sampled, hands to remember_guard, or their verdicts steer nothing."""
    from edge_specdec.runtime.pipeline import Engine

    kept = []
    monkeypatch.setattr(Engine, "remember_guard", lambda self, key, learned: kept.append(key))
    pipe = Pipeline(bundle_dir(*OTHER_VOCAB))
    config = GenerationConfig(max_new_tokens=12, ignore_eos=True, temperature=temperature)
    pipe.generate("def f(x):", config)
    assert kept == [pipe.default_guard_key(config)]
