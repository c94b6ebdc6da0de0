"""Batched verification (runtime/batching.py): several sessions' blocks in one target call, bit for bit what each
session computes alone, and generations that join and leave a batch unchanged by it."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from edge_specdec.runtime import Engine, GenerationConfig
from edge_specdec.errors import EdgeSpecdecError
from edge_specdec.runtime.batching import Call, ModelQueue, batch_invariant
from edge_specdec.runtime.drafters import DraftLength
from edge_specdec.runtime.session import BlockPool, open_model

SAME = ("qwen2-bytelevel", "qwen2-bytelevel-small")
HETERO = ("qwen2-bytelevel", "llama-metaspace")
PROMPTS = ["def f(x):", "x = ", "import os\n", "class A:", "for i in", "print(", "a"]  # "a": a one-token prompt


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["dq", "f32"])
def test_batched_rows_equal_single_rows_over_random_mixes(bundle_dir, precision):
    """Sessions sharing a pool, fed random blocks together, against twin sessions fed the same blocks alone (each
    its own pool, the path every unbatched run takes): random prompt lengths, block sizes 2-9, random subsets of
    the sessions per call, and rollbacks of part of each block, as verification does."""
    model = open_model(bundle_dir(*SAME) / "target" / "openvino_model.xml", precision=precision)
    assert model.block_invariant
    rng = np.random.default_rng(1)
    pool = BlockPool(model.compiled)
    batched = [model.session(pool) for _ in range(5)]
    alone = [model.session() for _ in range(5)]
    queue = ModelQueue(batched[0])
    vocab = model.vocab_size
    for b, a in zip(batched, alone):
        prompt = rng.integers(0, vocab, int(rng.integers(2, 60))).tolist()
        assert np.array_equal(b.feed(prompt), a.feed(prompt))
    compared = 0
    for _ in range(25):
        chosen = sorted(rng.choice(5, size=int(rng.integers(2, 6)), replace=False))
        blocks = {i: rng.integers(0, vocab, int(rng.integers(2, 10))).tolist() for i in chosen}
        rows = {i: int(rng.integers(1, len(blocks[i]) + 1)) for i in chosen}
        together = queue.together([Call(batched[i], blocks[i], rows[i]) for i in chosen])
        for i, got in zip(chosen, together):
            batched[i].tokens.extend(blocks[i])  # together() writes the cache; the session records its tokens
            want = alone[i].feed(blocks[i], rows=rows[i])[-rows[i]:]  # feed gives a block-invariant session 2 or more
            assert np.array_equal(got, want), (i, len(blocks[i]), rows[i])
            compared += 1
            back = int(rng.integers(0, len(blocks[i])))
            batched[i].rollback(back)
            alone[i].rollback(back)
    assert compared > 50 and queue.calls == 25


@pytest.mark.slow
def test_a_failed_probe_turns_batching_off(bundle_dir, monkeypatch):
    """The probe compares for real: noise in one batched row fails it, and an engine then does not batch."""
    real = ModelQueue.together

    def noisy(self, calls):
        out = real(self, calls)
        out[-1][0, 0] += 1e-3
        return out
    monkeypatch.setattr(ModelQueue, "together", noisy)
    model = open_model(bundle_dir(*SAME) / "target" / "openvino_model.xml")
    assert batch_invariant(model) is False
    engine = Engine(bundle_dir(*SAME), batching=True)
    assert engine.scheduler is None and "one by one" in engine.batching_note
    monkeypatch.setattr(ModelQueue, "together", real)
    assert batch_invariant(model) is True


def run_clients(engine, jobs, join_running: bool = False, **options):
    """jobs: (prompt, config, algorithm) per client thread, all started at once; with join_running, one after
    another, each once the one before has had its first model call computed, so that it joins a batch that is
    running however fast the machine (a clock-based stagger can outlast a tiny model's whole generation).
    options go to generate(). The engine's static copies are compiled first: a client that compiled one at its first
    call would start late and run alone."""
    engine.compile_static_copies()
    sessions = [engine.session() for _ in jobs]
    results: list = [None] * len(jobs)
    errors: list[BaseException] = []
    called = [threading.Event() for _ in jobs]
    index: dict[int, int] = {}  # thread ident -> client
    if join_running:
        infer = engine.scheduler.infer

        def infer_and_tell(session, tokens, rows, **layout):
            out = infer(session, tokens, rows, **layout)
            called[index[threading.get_ident()]].set()
            return out
        engine.scheduler.infer = infer_and_tell

    def client(i):
        index[threading.get_ident()] = i
        try:
            prompt, config, algorithm = jobs[i]
            results[i] = sessions[i].generate(prompt, config, algorithm=algorithm, **options)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
        finally:
            called[i].set()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(jobs))]
    for i, t in enumerate(threads):
        t.start()
        if join_running:
            called[i].wait(60)
    for t in threads:
        t.join(300)
    assert not errors, errors
    return results


# a draft of each kind in the exactness core, the other algorithms in the slow tier
@pytest.mark.parametrize("pair,algorithm", [pytest.param(SAME, "none", marks=pytest.mark.slow),
                                            pytest.param(SAME, "standard", marks=pytest.mark.core),
                                            pytest.param(SAME, "prompt-lookup", marks=pytest.mark.slow),
                                            pytest.param(HETERO, "slem", marks=pytest.mark.core),
                                            pytest.param(HETERO, "tli", marks=pytest.mark.slow)])
def test_concurrent_batched_generations_equal_sequential_ones(bundle_dir, pair, algorithm):
    """Clients with different prompts and budgets, started one after another (each joining a running batch) and
    finishing at different times (leaving it): each output, logprob bits included, equals an unbatched run."""
    jobs = [(p, GenerationConfig(max_new_tokens=12 + 9 * i, ignore_eos=True, logprobs=True, top_logprobs=2),
             algorithm) for i, p in enumerate(PROMPTS)]
    alone = Engine(bundle_dir(*pair)).session()
    want = [alone.generate(p, c, algorithm=a) for p, c, a in jobs]
    engine = Engine(bundle_dir(*pair), batching=True)
    assert engine.scheduler is not None, engine.batching_note
    got = run_clients(engine, jobs, join_running=True)
    for w, g in zip(want, got):
        assert g.token_ids == w.token_ids and g.exact
        assert [(lp.logprob, lp.top) for lp in g.logprobs] == [(lp.logprob, lp.top) for lp in w.logprobs]
    stats = engine.scheduler.stats()
    assert stats["batched_calls"] > 0 and stats["mean_sequences_per_batched_call"] >= 2


def test_seeded_sampling_reproduces_under_batching(bundle_dir):
    config = GenerationConfig(max_new_tokens=24, temperature=0.9, top_k=30, seed=5, ignore_eos=True)
    jobs = [(p, config, "tli") for p in PROMPTS[:4]]
    alone = Engine(bundle_dir(*HETERO)).session()
    want = [alone.generate(p, c, algorithm=a).token_ids for p, c, a in jobs]
    got = run_clients(Engine(bundle_dir(*HETERO), batching=True), jobs)
    assert [g.token_ids for g in got] == want


def test_a_lone_session_does_not_wait_for_anyone(bundle_dir):
    """With one session generating, every call runs at once: no call waits out max_wait."""
    engine = Engine(bundle_dir(*SAME), batching=True, batch_wait=5.0)
    start = time.perf_counter()
    result = engine.session().generate("x = ", GenerationConfig(max_new_tokens=20, ignore_eos=True),
                                       algorithm="standard")
    assert len(result.token_ids) == 20 and time.perf_counter() - start < 5.0


def test_sessions_fall_into_step_draft_first_then_verify_together(monkeypatch):
    """The scheduler's policy with stand-in models: sessions that draft different numbers of steps each round
    still verify in one call per round, because a round's draft calls run before its target calls while every
    session waits for a call."""
    from edge_specdec.runtime.batching import Scheduler

    batches: dict[str, list[int]] = {"draft": [], "target": []}

    class Pool:
        def __init__(self, name):
            self.name = name

    class StandIn:
        def __init__(self, pool):
            self.pool = pool

    def fake_init(self, session, rank=0):
        self.rank, self.pending, self.running, self.name = rank, [], False, session.pool.name

    def fake_run(self, batch):
        time.sleep(0.005)  # a model call
        batches[self.name].append(len(batch))
        for call in batch:
            call.logits = np.zeros((call.rows, 1))

    monkeypatch.setattr(ModelQueue, "__init__", fake_init)
    monkeypatch.setattr(ModelQueue, "run", fake_run)
    draft_pool, target_pool = Pool("draft"), Pool("target")
    scheduler = Scheduler(max_wait=1.0, order=(draft_pool, target_pool))
    rounds, clients = 6, 4

    def client(i: int) -> None:
        draft, target = StandIn(draft_pool), StandIn(target_pool)
        with scheduler.generating():
            start.wait()  # all four are generating before the first call
            for r in range(rounds):
                for _ in range(1 + (i + r) % 4):  # 1 to 4 draft steps, different per client and round
                    scheduler.infer(draft, [1, 2], 1)
                scheduler.infer(target, [1, 2, 3], 3)

    start = threading.Barrier(clients)
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert batches["target"] == [clients] * rounds  # every round verified in one call
    assert sum(batches["draft"]) == sum(1 + (i + r) % 4 for i in range(clients) for r in range(rounds))


def test_crowded_sessions_draft_less_and_stay_exact(bundle_dir):
    """With draft_max_sessions=1, sessions generating together draft at most crowded_draft_tokens per round (0:
    the target's own tokens alone) and their full length again once alone; greedy outputs are unchanged, and a
    seeded sampled run keeps its full length."""
    jobs = [(p, GenerationConfig(max_new_tokens=16 + 12 * i, ignore_eos=True), "standard")
            for i, p in enumerate(PROMPTS[:4])]
    full_length = dict(num_assistant_tokens=4, confidence=0.0, lookup=False)  # 4 model tokens every round
    alone = Engine(bundle_dir(*SAME)).session()
    want = [alone.generate(p, c, algorithm=a, **full_length) for p, c, a in jobs]
    proposed = {}
    for crowded in (0, 1):
        got = run_clients(Engine(bundle_dir(*SAME), batching=True, draft_max_sessions=1,
                                 crowded_draft_tokens=crowded), jobs, **full_length)
        assert [g.token_ids for g in got] == [w.token_ids for w in want], crowded
        proposed[crowded] = [g.stats.draft_tokens_proposed for g in got]
        assert proposed[crowded][-1] > 0  # the longest run drafted once it was alone
    full = [w.stats.draft_tokens_proposed for w in want]
    assert sum(proposed[0]) < sum(proposed[1]) < sum(full)

    seeded = GenerationConfig(max_new_tokens=20, temperature=0.8, seed=3, ignore_eos=True)
    jobs = [(p, seeded, "standard") for p in PROMPTS[:3]]
    want = [alone.generate(p, c, algorithm=a, **full_length) for p, c, a in jobs]
    got = run_clients(Engine(bundle_dir(*SAME), batching=True, draft_max_sessions=1, crowded_draft_tokens=0), jobs,
                      **full_length)
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    assert [g.stats.draft_tokens_proposed for g in got] == [w.stats.draft_tokens_proposed for w in want]


def test_the_draft_cap_bounds_each_round():
    caps = iter([None, 1, 0, 9])
    length = DraftLength(5, cap=lambda: next(caps))
    assert [length.round_k() for _ in range(4)] == [5, 1, 0, 5]
    with pytest.raises(EdgeSpecdecError, match="crowded_draft_tokens must be 0"):
        Engine.__init__(object.__new__(Engine), "unused", crowded_draft_tokens=-1)


def test_measurements_run_alone_on_a_batching_engine(bundle_dir, monkeypatch):
    """fixed_block_pays and cheapest_step time this session's own calls, never a batch with others' blocks."""
    from edge_specdec.runtime import batching
    from edge_specdec.runtime.probes import cheapest_step, fixed_block_pays

    engine = Engine(bundle_dir(*SAME), batching=True)
    session = engine.session().target
    submitted = []
    monkeypatch.setattr(batching.Scheduler, "infer", lambda self, *a: submitted.append(a))
    fixed_block_pays(session, 4, reps=1)
    cheapest_step(session, reps=1)
    assert not submitted and session.scheduler is engine.scheduler


def test_a_session_that_goes_leaves_its_shared_pool_as_it_found_it(bundle_dir):
    """A pool shared by an engine's sessions outlives them: one that goes gives back its blocks and its requests,
    which the pool would otherwise keep alive and bind to its tensors each time they grow."""
    import gc
    model = open_model(bundle_dir(*SAME) / "target" / "openvino_model.xml")
    pool = BlockPool(model.compiled)
    keeper = model.session(pool)
    keeper.feed([1, 2, 3])
    requests, held = len(pool.requests), pool.capacity - len(pool.free)
    for _ in range(3):
        session = model.session(pool)
        session.feed(list(range(2, 40)))
        assert len(pool.requests) == requests + 1
        del session
        gc.collect()
        assert len(pool.requests) == requests and pool.capacity - len(pool.free) == held
