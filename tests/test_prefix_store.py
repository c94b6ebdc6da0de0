"""The server's prefix store (serve --prefix-cache-mb, edge_specdec/serve/prefix_store.py): a slot's caches kept in
host memory when another conversation takes the slot, restored byte for byte when the conversation comes back, in
an LRU that never grows past its bound. The server tests run on loopback and stop by themselves."""
from __future__ import annotations

import urllib.request

import numpy as np
import pytest

from edge_specdec.runtime import Engine, GenerationConfig
from edge_specdec.serve.prefix_store import Entry, KVCopy, PrefixStore, export_cache
from support import OTHER_VOCAB

A = "def parse_args(argv):\n    \"\"\"Read the options, émoji 🙂 included.\"\"\"\n"
B = "class Tree:\n    def __init__(self, children):\n        self.children = children\n"
C = "import os\nimport sys\n\n\ndef main():\n    print(sys.argv)\n"
GREEDY = GenerationConfig(max_new_tokens=8, ignore_eos=True, logprobs=True, top_logprobs=2)


def bits(result) -> list:
    return [(lp.token, np.float64(lp.logprob).view(np.int64),
             [(t, np.float64(v).view(np.int64)) for t, v in lp.top]) for lp in result.logprobs]


@pytest.fixture(scope="module")
def engine(bundle_dir):
    """A different-vocabulary pair: the draft's cache (its own tokens) is stored beside the target's."""
    return Engine(bundle_dir(*OTHER_VOCAB))


def same_bytes(a, b) -> bool:
    return a.tokens == b.tokens and a.blocks.keys() == b.blocks.keys() and all(
        a.blocks[k].tobytes() == b.blocks[k].tobytes() for k in a.blocks)


def test_a_conversation_restored_from_the_store_writes_what_a_fresh_session_writes(engine):
    encode = engine.tokenizer.encode
    store = PrefixStore(64 * 2**20, min_tokens=1)
    slot = engine.session()
    first = slot.generate(A, GREEDY)
    turn2 = encode(A) + first.token_ids + encode("\n    return None\n")  # the conversation's next turn
    before = {"target": export_cache(slot.target), "draft": export_cache(slot.draft)}
    assert before["draft"].tokens, "the draft ran: its cache is stored too"

    assert store.prepare(slot, encode(B)).stored  # another conversation takes the slot: A's caches go to the store
    slot.generate(B, GREEDY)
    assert common(slot.target.tokens, turn2) == 0  # nothing of A is left in the slot

    prepared = store.prepare(slot, turn2)
    assert prepared.restored and prepared.stored and store.hits == 1  # A's back in, B's kept in its place
    assert same_bytes(export_cache(slot.target), before["target"])  # the same bits, target and draft
    assert same_bytes(export_cache(slot.draft), before["draft"])
    restored = slot.generate(turn2, GREEDY)
    fresh = engine.session().generate(turn2, GREEDY)
    assert restored.token_ids == fresh.token_ids and bits(restored) == bits(fresh)
    assert restored.stats.prompt_tokens_reused >= len(encode(A)) - 1


def test_a_cache_stored_from_one_slot_is_restored_into_another_of_a_batching_engine(bundle_dir):
    """Slots of a batching engine share one block pool per model: the copy is taken from one slot's blocks and
    written into another slot's, and that slot then writes what a fresh session writes."""
    engine = Engine(bundle_dir(*OTHER_VOCAB), batching=True)
    encode = engine.tokenizer.encode
    store = PrefixStore(64 * 2**20, min_tokens=1)
    first_slot, second_slot = engine.session(), engine.session()
    assert first_slot.target.pool is second_slot.target.pool, engine.batching_note
    first = first_slot.generate(A, GREEDY)
    second_slot.generate(C, GREEDY)
    turn2 = encode(A) + first.token_ids + encode("\n    return None\n")
    store.prepare(first_slot, encode(B))  # A's caches to the store
    first_slot.generate(B, GREEDY)
    assert store.prepare(second_slot, turn2).restored  # into the other slot, whose blocks are others
    restored = second_slot.generate(turn2, GREEDY)
    fresh = engine.session().generate(turn2, GREEDY)
    assert restored.token_ids == fresh.token_ids and bits(restored) == bits(fresh)
    assert restored.stats.prompt_tokens_reused >= len(encode(A)) - 1
    assert first_slot.generate(B, GREEDY).token_ids == engine.session().generate(B, GREEDY).token_ids  # untouched


def common(a, b) -> int:
    from edge_specdec.runtime.session import common_prefix
    return common_prefix(a, b)


def test_the_store_stays_within_its_bound_and_evicts_the_least_recently_used(engine):
    slot = engine.session()
    prompts = [A, B, C, A + "x = 1\n", B + "y = 2\n"]
    probe = PrefixStore(2**40, min_tokens=1)
    sizes = []
    for prompt in prompts:  # the size of each conversation's entry
        probe.prepare(slot, [1, 2, 3])
        slot.generate(prompt, GenerationConfig(max_new_tokens=4, ignore_eos=True))
        sizes.append(export_cache(slot.target).nbytes + export_cache(slot.draft).nbytes)
    bound = sizes[0] + sizes[1] + sizes[2] // 2  # room for two entries, not three
    store = PrefixStore(bound, min_tokens=1)
    stored, evicted = [], 0
    slot = engine.session()
    for prompt in [A, B, C, "z"]:
        ids = engine.tokenizer.encode(prompt)
        stored_tokens = list(slot.target.tokens)
        prepared = store.prepare(slot, ids)
        evicted += prepared.evicted
        if prepared.stored:
            stored.append(stored_tokens)
        assert store.nbytes <= bound and store.nbytes == sum(e.nbytes for e in store.entries.values())
        slot.generate(ids, GenerationConfig(max_new_tokens=4, ignore_eos=True))
    assert len(stored) == 3 and evicted == store.evictions == 1
    assert [e.target.tokens for e in store.entries.values()] == stored[1:]  # A's, the oldest, went first

    tiny = PrefixStore(100, min_tokens=1)  # smaller than any entry: nothing is kept, nothing grows
    assert tiny.prepare(slot, [1, 2]).evicted == 1 and len(tiny) == 0 and tiny.nbytes == 0


def test_a_short_drop_stores_nothing(engine):
    slot = engine.session()
    store = PrefixStore(64 * 2**20)  # the default: a request must drop MIN_STORED_TOKENS of the slot's cache
    ids = engine.tokenizer.encode(A)
    slot.generate(ids, GenerationConfig(max_new_tokens=4, ignore_eos=True))
    assert not store.prepare(slot, ids + [5, 6]).stored  # the same conversation, one more turn: nothing dropped
    assert not store.prepare(slot, ids[:-3]).stored  # a few tokens dropped: not worth a copy
    assert store.prepare(slot, ids[:3]).stored and len(store) == 1


def test_a_stored_prefix_is_superseded_by_a_longer_cache():
    def entry(tokens):
        return Entry(KVCopy(tokens, {"key_cache.0": np.zeros(len(tokens), np.uint8)}))

    store = PrefixStore(10**6)
    store._put(entry([1, 2, 3]))
    store._put(entry([4, 5]))
    store._put(entry([1, 2, 3, 4]))  # restoring it gives all [1, 2, 3] gave, and more
    assert [e.target.tokens for e in store.entries.values()] == [[4, 5], [1, 2, 3, 4]]
    assert store.nbytes == sum(e.nbytes for e in store.entries.values())


def test_a_stored_prefix_fed_in_another_layout_is_kept_beside_a_longer_cache():
    """A cache whose tokens a longer one starts with, but whose tokens from 3 on were fed as one-token sequences
    where the longer one fed them in blocks (after a long prompt, session.py): restoring the longer one would give a
    prompt in that layout only 3 tokens, so the shorter one stays; one that agrees in its layout goes."""
    def entry(tokens, layout):
        return Entry(KVCopy(tokens, {"key_cache.0": np.zeros(len(tokens), np.uint8)}, layout))

    store = PrefixStore(10**6)
    store._put(entry([1, 2, 3, 4, 5], (0, 3)))
    store._put(entry([1, 2], (0, None)))
    store._put(entry([1, 2, 3, 4, 5, 6, 7], (0, None)))
    assert [(e.target.tokens, e.target.layout) for e in store.entries.values()] == [
        ([1, 2, 3, 4, 5], (0, 3)), ([1, 2, 3, 4, 5, 6, 7], (0, None))]
    # and a prompt in the first one's layout gets it, not the longer one
    assert store.entries[0].target.shared_prefix([1, 2, 3, 4, 5, 9], (0, 3)) == 5
    assert store.entries[2].target.shared_prefix([1, 2, 3, 4, 5, 9], (0, 3)) == 3


# ---------- the server ----------

def metric(running, name: str) -> float:
    with urllib.request.urlopen(running.url + "/metrics", timeout=10) as response:
        lines = response.read().decode().splitlines()
    return next((float(line.split()[-1]) for line in lines if line.split(" ")[0] == "edge_specdec_" + name), 0.0)


def _server_deps():
    pytest.importorskip("openai", reason="the server tests need the test extra: pip install -e '.[test,serve]'")
    pytest.importorskip("uvicorn", reason="the server tests need the serve extra: pip install -e '.[test,serve]'")


def test_the_metrics_show_the_stores_bound_while_it_is_empty(engine):
    """An empty store has no entries (len 0): the gauges must not read it as no store at all."""
    from edge_specdec.serve import ServerSettings
    from edge_specdec.serve.app import Server

    server = Server(ServerSettings(bundle=str(engine.bundle.path), slots=1, warm_up=False, prefix_cache_mb=64),
                    engine)
    server.load()
    assert server.store is not None and len(server.store) == 0
    gauges = {line.split()[0]: float(line.split()[1]) for line in server.metrics.render().splitlines()
              if line.startswith("edge_specdec_prefix_store")}
    assert gauges["edge_specdec_prefix_store_limit_bytes"] == 64 * 2**20
    assert gauges["edge_specdec_prefix_store_entries"] == 0 and gauges["edge_specdec_prefix_store_bytes"] == 0


@pytest.mark.slow
def test_the_server_restores_a_conversation_whose_slot_was_taken(engine):
    _server_deps()
    import openai
    from edge_specdec.serve import ServerSettings
    from serve_helpers import serve_in_thread

    settings = ServerSettings(bundle=str(engine.bundle.path), slots=1, queue=4, prefix_cache_mb=64)
    with serve_in_thread(settings, engine) as running:
        c = openai.OpenAI(base_url=running.api, api_key="none", max_retries=0, timeout=120)

        def complete(prompt: str):
            return c.completions.create(model="x", prompt=prompt, max_tokens=8, temperature=0,
                                        extra_body={"ignore_eos": True})

        first_a = complete(A)
        complete(B)  # the one slot goes to another conversation: A's caches go to the store
        assert metric(running, "prefix_store_entries") == 1
        assert 0 < metric(running, "prefix_store_bytes") <= metric(running, "prefix_store_limit_bytes") == 64 * 2**20
        follow = A + first_a.choices[0].text + "\n    return None\n"
        out = complete(follow)
        assert out.usage.prompt_tokens_details.cached_tokens >= len(engine.tokenizer.encode(A)) - 1
        assert metric(running, "prefix_store_hits_total") == 1
        assert metric(running, "slot_prefix_hits_total") == 0  # the slot held B: the reuse came from the store
        assert out.choices[0].text == engine.session().generate(follow, GenerationConfig(
            max_new_tokens=8, ignore_eos=True)).text


@pytest.mark.slow
def test_no_prefix_reuse_feeds_everything_even_with_a_store(bundle_dir):
    _server_deps()
    import openai
    from edge_specdec.serve import ServerSettings
    from serve_helpers import serve_in_thread

    engine = Engine(bundle_dir(*OTHER_VOCAB), prefix_reuse=False)
    settings = ServerSettings(bundle=str(engine.bundle.path), slots=1, queue=4, prefix_cache_mb=64)
    with serve_in_thread(settings, engine) as running:
        c = openai.OpenAI(base_url=running.api, api_key="none", max_retries=0, timeout=120)
        for prompt in (A, B, A):
            out = c.completions.create(model="x", prompt=prompt, max_tokens=4, temperature=0)
            assert out.usage.prompt_tokens_details.cached_tokens == 0
        assert metric(running, "prompt_tokens_reused_total") == 0
        assert metric(running, "prompt_tokens_prefilled_total") == metric(running, "prompt_tokens_total")
        assert metric(running, "prefix_store_hits_total") == 0 and metric(running, "prefix_store_bytes") == 0


def test_serve_takes_prefix_cache_mb():
    from edge_specdec.cli import build_parser
    from edge_specdec.errors import EdgeSpecdecError
    from edge_specdec.serve import ServerSettings

    assert build_parser().parse_args(["serve", "--prefix-cache-mb", "256"]).prefix_cache_mb == 256
    assert build_parser().parse_args(["serve"]).prefix_cache_mb == 0
    for bad in (-1, float("nan"), float("inf")):
        with pytest.raises(EdgeSpecdecError, match="--prefix-cache-mb"):
            ServerSettings(prefix_cache_mb=bad).check()


def test_after_a_long_prompt_the_store_keeps_the_whole_cache_and_its_layout(engine, monkeypatch):
    """After a prompt of SEQUENCES_AFTER tokens or more (made small here) the tokens after it were fed as one-token
    sequences (session.py): the copy holds them all, with the layout; a plain-text prompt is one turn, so the next
    one keeps the tokens up to the old prompt's end (where its layout agrees) and writes what a fresh session writes."""
    import edge_specdec.runtime.session as session_module

    monkeypatch.setattr(session_module, "SEQUENCES_AFTER", 16)
    encode = engine.tokenizer.encode
    store = PrefixStore(64 * 2**20, min_tokens=1)
    slot = engine.session()
    first = slot.generate(A, GREEDY)
    prompt = encode(A)
    assert len(prompt) >= 16 and slot.target.cache_layout == (0, len(prompt))
    whole = list(slot.target.tokens)
    assert len(whole) > len(prompt) and export_cache(slot.target).tokens == whole
    turn2 = prompt + first.token_ids + encode("\n    return None\n")
    assert store.prepare(slot, encode(B)).stored
    slot.generate(B, GREEDY)
    assert store.prepare(slot, turn2).restored
    assert slot.target.tokens == whole and slot.target.cache_layout == (0, len(prompt))
    restored = slot.generate(turn2, GREEDY)
    fresh = engine.session().generate(turn2, GREEDY)
    assert restored.token_ids == fresh.token_ids and bits(restored) == bits(fresh)
    assert restored.stats.prompt_tokens_reused == len(prompt)
