"""One engine, many sessions: the models compiled once, sessions decoding in parallel threads, the measurement cache
remembered per machine."""
from __future__ import annotations

import threading

import pytest

import edge_specdec.runtime.session as session_module
from edge_specdec.runtime import DecodingSession, Engine, GenerationConfig, Pipeline
from edge_specdec.runtime.pipeline import WARM_UP_BLOCK
from support import OTHER_VOCAB, SAME_VOCAB, load_target_xml, logprob_bits

PROMPTS = ["def f(x):", "class A:\n    def", "import os\n", "for i in range(", "x = [1, 2,", "# a comment\n"]



@pytest.mark.parametrize("pair,algorithm", [(SAME_VOCAB, "standard"), (OTHER_VOCAB, "slem")])
def test_sessions_decode_in_parallel_threads_exactly_as_one_after_another(bundle_dir, pair, algorithm):
    engine = Engine(bundle_dir(*pair), static_shapes=True)
    config = GenerationConfig(max_new_tokens=24, ignore_eos=True, logprobs=True)
    alone = engine.session()
    expected = {p: alone.generate(p, config, algorithm="none") for p in PROMPTS}
    sessions = [engine.session() for _ in range(3)]
    results: dict = {}
    errors: list = []

    def work(session: DecodingSession, prompts: list[str]) -> None:
        try:
            for prompt in prompts:
                results[prompt] = session.generate(prompt, config, algorithm=algorithm, lookup=False)
        except BaseException as exc:  # handed to the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s, PROMPTS[i::3])) for i, s in enumerate(sessions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    for prompt in PROMPTS:
        assert results[prompt].token_ids == expected[prompt].token_ids, prompt
        assert logprob_bits(results[prompt]) == logprob_bits(expected[prompt]), prompt
        assert results[prompt].stats.draft_tokens_proposed > 0


def test_a_session_compiles_nothing_and_shares_the_weights(bundle_dir, monkeypatch):
    engine = Engine(bundle_dir(*SAME_VOCAB), static_shapes=True)
    engine.compile_static_copies()
    assert engine.target_model.static and engine.draft_model.static
    compiled = []
    monkeypatch.setattr(session_module.ov.Core, "compile_model",
                        lambda self, *a, **k: compiled.append(a) or pytest.fail("a session compiled a model"))
    a, b = engine.session(), engine.session()
    assert a.target.compiled is b.target.compiled is engine.target_model.compiled
    assert a.target.request is not b.target.request  # each session its own infer request and KV cache
    ra = a.generate("def f(", GenerationConfig(max_new_tokens=8), algorithm="standard")
    rb = b.generate("def f(", GenerationConfig(max_new_tokens=8), algorithm="standard")
    assert ra.token_ids == rb.token_ids and not compiled
    assert a.target.static_sizes == b.target.static_sizes == frozenset(engine.target_model.static) != frozenset()


def test_the_load_runs_each_models_first_inference(bundle_dir, tmp_path, monkeypatch):
    """OpenVINO prepares a model on its first inference (seconds for a 1.5B target on the CPU, in every process) and
    on the first call of each kind of block: the engine's load runs a block and a single step of each model, and
    each static copy runs once before it serves, so that a request does not wait for that; warm_up=False leaves
    the models' first calls to the first request. What ran leaves no trace: the first request writes what an
    engine without it writes."""
    bundle = bundle_dir(*OTHER_VOCAB)
    first = Engine(bundle, cache_dir=tmp_path, warm_up=False, static_shapes=True)  # measures exactness, kept
    first.compile_static_copies()
    calls = []
    infer = session_module.PagedSession._infer
    monkeypatch.setattr(session_module.PagedSession, "_infer", lambda self, tokens, rows: calls.append(
        (self.model.compiled, len(tokens), self.model.static.get(len(tokens)))) or infer(self, tokens, rows))
    cold = Engine(bundle, cache_dir=tmp_path, warm_up=False, static_shapes=True)
    cold.compile_static_copies()
    for model in (cold.target_model, cold.draft_model):  # nothing measured again; only each copy's first call
        assert sorted(n for m, n, copy in calls if m is model.compiled) == sorted(model.static)
        assert all(copy is not None for m, n, copy in calls if m is model.compiled)
    calls.clear()
    warm = Engine(bundle, cache_dir=tmp_path, static_shapes=True)
    warm.compile_static_copies()
    for model in (warm.target_model, warm.draft_model):
        sizes = [n for m, n, copy in calls if m is model.compiled]
        assert sizes and sizes[0] >= WARM_UP_BLOCK and min(sizes) <= model.session().least_block, sizes
        assert model.static and set(model.static) <= set(sizes)  # each static copy (a model of its own) ran too
    monkeypatch.undo()
    config = GenerationConfig(max_new_tokens=16, ignore_eos=True, logprobs=True)
    for prompt in PROMPTS[:2]:
        expected = cold.session().generate(prompt, config, algorithm="slem")
        got = warm.session().generate(prompt, config, algorithm="slem")
        assert got.token_ids == expected.token_ids and logprob_bits(got) == logprob_bits(expected)


def test_the_measurement_cache_is_remembered_for_the_next_process(bundle_dir, tmp_path, monkeypatch):
    """A second engine on the same bundle, machine and settings reads the measurement cache instead of measuring;
    other settings get a cache file of their own."""
    import edge_specdec.runtime.pipeline as pipeline_module
    checks, probes = [], []
    invariant = session_module.passes_block_invariance
    monkeypatch.setattr(session_module, "passes_block_invariance", lambda s: checks.append(1) or invariant(s))
    step = pipeline_module.cheapest_step
    monkeypatch.setattr(pipeline_module, "cheapest_step", lambda s: probes.append(1) or step(s))
    config = GenerationConfig(max_new_tokens=12, ignore_eos=True)

    first = Engine(bundle_dir(*SAME_VOCAB), cache_dir=tmp_path, static_shapes=False)
    expected = first.session().generate("def f(", config, algorithm="none")
    assert checks and probes and first.measurements.path.is_file()
    checks.clear(), probes.clear()

    second = Engine(bundle_dir(*SAME_VOCAB), cache_dir=tmp_path, static_shapes=False)
    assert second.measurements.loaded and second.target_model.block_invariant
    assert second.session().generate("def f(", config, algorithm="none").token_ids == expected.token_ids
    assert not checks and not probes  # nothing measured again

    other = Engine(bundle_dir(*SAME_VOCAB), cache_dir=tmp_path, static_shapes=False, precision="f32")
    assert other.measurements.path != first.measurements.path and checks


def test_pipeline_is_an_engine_with_a_session_of_its_own(bundle_dir):
    pipe = Pipeline(bundle_dir(*SAME_VOCAB))
    config = GenerationConfig(max_new_tokens=10, ignore_eos=True)
    own = pipe.generate("def f(", config, algorithm="standard")
    assert pipe.session().generate("def f(", config, algorithm="standard").token_ids == own.token_ids
    assert pipe.target.compiled is pipe.target_model.compiled
    assert "".join(pipe.session().stream("def f(", config)) == own.text


def test_requests_compile_nothing_whatever_their_draft_length(bundle_dir, monkeypatch):
    """Static copies are compiled after the load for the default draft length; a request with another length runs its
    blocks on the dynamic model, so no client can make the engine compile (and hold) another copy."""
    engine = Engine(bundle_dir(*SAME_VOCAB), static_shapes=True)
    engine.compile_static_copies()
    loaded = (set(engine.target_model.static), set(engine.draft_model.static))
    assert loaded[0] and loaded[1]
    monkeypatch.setattr(session_module.ov.Core, "compile_model",
                        lambda self, *a, **k: pytest.fail("a request compiled a model"))
    expected = engine.session().generate("def f(", GenerationConfig(max_new_tokens=12, ignore_eos=True),
                                         algorithm="none").token_ids
    for k in (1, 2, 5, 11, 64):
        result = engine.session().generate("def f(", GenerationConfig(max_new_tokens=12, ignore_eos=True),
                                           algorithm="standard", num_assistant_tokens=k)
        assert result.token_ids == expected, k
    assert (set(engine.target_model.static), set(engine.draft_model.static)) == loaded


def test_static_copies_are_checked_once_not_on_every_call(bundle_dir, monkeypatch):
    """A small target's copies are compiled and checked for invariance once, after the load; calls neither
    compile nor check again."""
    engine = Engine(bundle_dir(*SAME_VOCAB), static_shapes=True)
    engine.compile_static_copies()
    session = engine.session()
    config = GenerationConfig(max_new_tokens=6, ignore_eos=True)
    session.generate("def f(", config, algorithm="standard", num_assistant_tokens=3)
    assert engine.target_model.static
    checks = []
    invariant = session_module.passes_block_invariance
    monkeypatch.setattr(session_module, "passes_block_invariance", lambda s: checks.append(1) or invariant(s))
    for _ in range(2):
        session.generate("def f(", config, algorithm="standard", num_assistant_tokens=3)
    assert checks == []


def test_paged_blob_import_still_fails(bundle_dir):
    """OpenVINO's CPU plugin drops the runtime info of the PagedAttention nodes from a compiled blob, so a paged
    model cannot come back from the compiled-model cache, and open_model compiles it without one. When this test
    fails, OpenVINO imports such blobs: give paged models the cache again (session.open_model)."""
    from openvino._offline_transformations import paged_attention_transformation

    core = session_module.ov.Core()
    model = core.read_model(str(load_target_xml(bundle_dir)))
    paged_attention_transformation(model)
    blob = core.compile_model(model, "CPU").export_model()
    with pytest.raises(RuntimeError, match="k_head_size"):
        core.import_model(blob, "CPU")


def test_a_paged_model_writes_no_blob_to_the_cache(bundle_dir, tmp_path):
    """A blob that can never be imported would be written again by every process (see the test above)."""
    Engine(bundle_dir(*SAME_VOCAB), cache_dir=tmp_path, static_shapes=False)
    assert not list(tmp_path.rglob("*.blob"))
    assert list((tmp_path / "plans").glob("*.json"))  # the cache folder itself is still used
