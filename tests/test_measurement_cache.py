"""The measurement cache is data from disk: a file or an entry that does not check out is measured again, never
trusted, and never turns a failed exactness check into a pass."""
from __future__ import annotations

import json

import pytest

import edge_specdec.runtime.measurements as measurements
import edge_specdec.runtime.pipeline as pipeline_module
import edge_specdec.runtime.session as session_module
from edge_specdec.runtime import Engine, GenerationConfig
from edge_specdec.runtime.measurements import MeasurementCache
from support import OTHER_VOCAB, SAME_VOCAB, logprob_bits

GUARD = {"mode": False, "interval": 64, "drafting": [2.0, 0.3], "alone": [1.0, 0.1]}
CONFIG = GenerationConfig(max_new_tokens=12, ignore_eos=True, logprobs=True)


@pytest.fixture(autouse=True)
def _warn_every_time(monkeypatch):
    """The cache names a bad file on stderr once per process; each test here starts with none named."""
    monkeypatch.setattr(measurements, "_warned", set())


def entries(cache: MeasurementCache) -> dict:
    return json.loads(cache.path.read_text())["entries"]


def rewrite(cache: MeasurementCache, change) -> None:
    """Edit the file's entries as a hand (or another program) would: the seals stay as they were."""
    data = json.loads(cache.path.read_text())
    change(data["entries"])
    cache.path.write_text(json.dumps(data))


# --- the file and its entries, without a model -----------------------------------------------------------------

@pytest.mark.core
@pytest.mark.parametrize("text", ["[]", "null", '"x"', "1", "", '{"version": 7', '{"entries": []}',
                                  '{"version": 7, "entries": {"target/step": 2}}', '{"target/step": 2}'])
def test_a_file_that_is_not_a_cache_is_measured_again(tmp_path, capsys, text):
    first = MeasurementCache(tmp_path, {"bundle": "b"})
    first.put("target/step", 2)
    first.path.write_text(text)
    again = MeasurementCache(tmp_path, {"bundle": "b"})
    assert again.values == {} and not again.loaded
    assert again.get("target/step", lambda: 3) == 3  # measured, not read
    assert "do not check out" in capsys.readouterr().err
    assert MeasurementCache(tmp_path, {"bundle": "b"}).values == {"target/step": 3}  # the file healed


@pytest.mark.core
@pytest.mark.parametrize("name,value", [
    ("target/step", "x"), ("target/step", 1000), ("target/step", 0), ("target/step", True), ("target/step", 2.0),
    ("target/invariant", {"dq": "no"}), ("target/invariant", {"dq": 1}), ("target/invariant", []),
    ("target/batch_invariant", "yes"), ("draft/fixed_block/4", None),
    ("target/longest_block", {"dq": "256"}), ("target/longest_block", {"dq": True}),
    ("target/longest_block", {"dq": 1}), ("target/longest_block", {"dq": 1 << 20}), ("target/longest_block", 256),
    ("guard/slem", {"mode": False}), ("guard/slem", {**GUARD, "drafting": "fast"}),
    ("guard/slem", {**GUARD, "interval": -1}), ("guard/slem", {**GUARD, "alone": [1.0, float("nan")]}),
    ("guard/slem", {**GUARD, "lost": -1}), ("guard/slem", {**GUARD, "lost": "3"}),
    ("draft_device/GPU,CPU", {"GPU": 1.0}), ("no/such/measurement", True),
    ("target/prefill_ratio", {"bf16": 0}), ("target/prefill_ratio", {"bf16": "0.6"}),
    ("target/prefill_ratio", {"bf16": True}), ("target/prefill_ratio", {"bf16": float("inf")}),
    ("target/prefill_ratio", 0.6),
])
def test_an_entry_of_the_wrong_shape_type_or_range_is_dropped(tmp_path, capsys, name, value):
    """Even sealed as if this module had written it, a value no measurement gives is not read."""
    cache = MeasurementCache(tmp_path, {"bundle": "b"})
    cache.put("draft/step", 2)
    rewrite(cache, lambda e: e.update({name: {"value": value, "seal": cache._seal(name, value)}}))
    again = MeasurementCache(tmp_path, {"bundle": "b"})
    assert name not in again.values and again.values == {"draft/step": 2}
    assert again.dropped == [name] and name in capsys.readouterr().err


@pytest.mark.core
@pytest.mark.parametrize("name,measured,flipped", [
    ("target/invariant", {"dq": False, "f32": True}, {"dq": True, "f32": True}),
    ("target/invariant", {"dq": True}, {"dq": False}),
    ("target/batch_invariant", False, True),
    ("target/longest_block", {"dq": 64}, {"dq": 256}),
    ("target/step", 2, 3),
    ("guard/slem", GUARD, {**GUARD, "mode": True}),
    ("target/prefill_ratio", {"bf16": 0.9}, {"bf16": 0.5}),
])
def test_a_value_edited_on_disk_is_dropped(tmp_path, name, measured, flipped):
    """A valid value that this module did not write for this key (its seal does not match) is measured again."""
    cache = MeasurementCache(tmp_path, {"bundle": "b"})
    cache.put(name, measured)
    assert MeasurementCache(tmp_path, {"bundle": "b"}).values[name] == measured  # as written, it is read
    rewrite(cache, lambda e: e[name].update(value=flipped))
    assert name not in MeasurementCache(tmp_path, {"bundle": "b"}).values


@pytest.mark.core
def test_a_retired_measurement_is_dropped_quietly_and_measured_under_its_new_name(tmp_path, capsys):
    """The copy's timing was kept as target/prefill_time when it was timed on a shorter prompt: after the upgrade a
    file holding it reads as nothing to say about (no warning), keeps its other entries, and loses the old one."""
    cache = MeasurementCache(tmp_path, {"bundle": "b"})
    cache.put("draft/step", 2)
    old = {"bf16": 0.94}
    rewrite(cache, lambda e: e.update({"target/prefill_time": {"value": old, "seal": cache._seal("target/prefill_time",
                                                                                                  old)}}))
    again = MeasurementCache(tmp_path, {"bundle": "b"})
    assert again.values == {"draft/step": 2} and again.dropped == [] and capsys.readouterr().err == ""
    assert "target/prefill_time" not in entries(again)  # the file healed
    assert again.get("target/prefill_ratio", lambda: {"bf16": 0.87}) == {"bf16": 0.87}


@pytest.mark.core
def test_a_guard_verdict_for_every_long_prompt_at_once_is_dropped_quietly(tmp_path, capsys):
    """A drafting guard's verdict after a long prompt was kept for all long prompts under one name; it is kept per
    length now (pipeline.guard_key), and a file holding the old name loses it without a warning, keeping the rest."""
    verdict = {"mode": False, "interval": 64, "drafting": [2.0, 0.3], "alone": [1.0, 0.1]}
    cache = MeasurementCache(tmp_path, {"bundle": "b"})
    cache.put("guard/slem/penalty=1/greedy/free", verdict)
    cache.put("guard/slem/penalty=1/greedy/free/long-prompt-2048", verdict)
    old = "guard/slem/penalty=1/greedy/free/long-prompt"
    rewrite(cache, lambda e: e.update({old: {"value": verdict, "seal": cache._seal(old, verdict)}}))
    again = MeasurementCache(tmp_path, {"bundle": "b"})
    assert sorted(again.values) == ["guard/slem/penalty=1/greedy/free",
                                    "guard/slem/penalty=1/greedy/free/long-prompt-2048"]
    assert again.dropped == [] and capsys.readouterr().err == "" and old not in entries(again)


@pytest.mark.core
def test_an_entry_copied_from_another_key_is_dropped(tmp_path):
    """The seal covers the key: a file renamed to another key's name (another machine's, say) reads as nothing."""
    mine, other = MeasurementCache(tmp_path, {"bundle": "b"}), MeasurementCache(tmp_path, {"bundle": "c"})
    other.put("target/invariant", {"dq": True})
    other.path.rename(mine.path)
    again = MeasurementCache(tmp_path, {"bundle": "b"})
    assert again.values == {} and again.dropped == ["target/invariant"]


@pytest.mark.core
def test_a_bad_file_is_named_once_per_process(tmp_path, capsys):
    MeasurementCache(tmp_path, {"bundle": "b"}).put("target/step", 2)
    path = MeasurementCache(tmp_path, {"bundle": "b"}).path
    path.write_text("[]")
    MeasurementCache(tmp_path, {"bundle": "b"})
    path.write_text("[]")
    MeasurementCache(tmp_path, {"bundle": "b"})
    assert capsys.readouterr().err.count("do not check out") == 1


@pytest.mark.core
def test_the_key_names_the_instruction_sets_and_the_cores(tmp_path, monkeypatch):
    """A VM's CPU name reads the same on AVX2, AVX-512 and AMX hosts: the flags and cores are in the key."""
    core = type("Core", (), {"get_property": lambda self, device, name: "Intel(R) Xeon(R) Processor"})()
    monkeypatch.setattr(measurements, "kernel_flags", lambda: ["avx", "avx2", "fma"])
    monkeypatch.setattr(measurements, "available_cores", lambda: 2)
    avx2 = MeasurementCache(tmp_path, {"machine": measurements.machine_key(core)})
    monkeypatch.setattr(measurements, "kernel_flags", lambda: ["avx", "avx2", "fma", "avx512f", "amx_tile"])
    amx = MeasurementCache(tmp_path, {"machine": measurements.machine_key(core)})
    monkeypatch.setattr(measurements, "available_cores", lambda: 8)
    eight = MeasurementCache(tmp_path, {"machine": measurements.machine_key(core)})
    assert len({avx2.path, amx.path, eight.path}) == 3


@pytest.mark.core
def test_kernel_flags_reads_this_cpu():
    flags = measurements.kernel_flags()
    assert flags and all(isinstance(flag, str) for flag in flags)


@pytest.mark.core
def test_a_failed_save_leaves_no_temp_file(tmp_path, monkeypatch):
    cache = MeasurementCache(tmp_path, {"bundle": "b"})
    cache.put("target/step", 2)

    def refuse(*args):
        raise OSError("disk full")

    monkeypatch.setattr(measurements.os, "replace", refuse)
    cache.put("target/step", 3)  # the save fails: no error, the value kept in this process
    assert cache.values["target/step"] == 3
    assert [p.name for p in (tmp_path / "plans").iterdir()] == [cache.path.name]
    assert entries(MeasurementCache(tmp_path, {"bundle": "b"}))["target/step"]["value"] == 2


# --- an engine reading a bad cache: measured again, the output a cache-off engine's -------------------------------


@pytest.fixture(scope="module")
def cache_off(bundle_dir):
    """What an engine that reads no cache writes: (token ids, logprob bits) per algorithm."""
    engine = Engine(bundle_dir(*OTHER_VOCAB), cache_dir="off", static_shapes=False)
    out = {}
    for algorithm in ("none", "auto"):
        result = engine.session().generate("def f(x):", CONFIG, algorithm=algorithm)
        out[algorithm] = (result.token_ids, logprob_bits(result), result.exact)
    return out


def spy_checks(monkeypatch) -> list:
    """Counts the block-invariance checks (the exactness verdict) that engines run."""
    checks = []
    check = session_module.passes_block_invariance
    monkeypatch.setattr(session_module, "passes_block_invariance", lambda s: checks.append(1) or check(s))
    return checks


BAD_ENTRIES = {
    "longest call edited": ("target/longest_block", {"dq": 16}),
    "invariant flipped to false": ("target/invariant", {"dq": False}),
    "invariant as a string": ("target/invariant", {"dq": "no"}),
    "invariant not a dict": ("target/invariant", True),
    "step as a string": ("target/step", "x"),
    "step out of range": ("target/step", 1000),
    "guard of another shape": ("guard/slem/penalty=1/greedy/free", {"mode": True}),
    "guard without its rates": ("guard/slem/penalty=1/greedy/free", {"mode": False, "interval": 32}),
}


@pytest.mark.core
@pytest.mark.parametrize("kind", BAD_ENTRIES)
def test_an_engine_measures_a_bad_entry_again_and_writes_what_a_cache_off_engine_writes(
        bundle_dir, tmp_path, monkeypatch, capsys, cache_off, kind):
    name, value = BAD_ENTRIES[kind]
    bundle = bundle_dir(*OTHER_VOCAB)
    first = Engine(bundle, cache_dir=tmp_path, static_shapes=False)
    first.session().generate("def f(x):", CONFIG, algorithm="none")  # measures the target's step
    first.session().generate("def f(x):", CONFIG, algorithm="auto")
    assert "target/invariant" in first.measurements.values and "target/step" in first.measurements.values
    rewrite(first.measurements, lambda e: e.update({name: {"value": value, "seal": "0" * 24}}))
    checks, steps = spy_checks(monkeypatch), []
    step = pipeline_module.cheapest_step
    monkeypatch.setattr(pipeline_module, "cheapest_step", lambda s: steps.append(1) or step(s))

    engine = Engine(bundle, cache_dir=tmp_path, static_shapes=False)
    assert name in engine.measurements.dropped and "do not check out" in capsys.readouterr().err
    for algorithm in ("none", "auto"):
        result = engine.session().generate("def f(x):", CONFIG, algorithm=algorithm)
        assert (result.token_ids, logprob_bits(result), result.exact) == cache_off[algorithm], algorithm
    if name in ("target/invariant", "target/longest_block"):  # a verdict is read only with its longest call
        assert checks and engine.target_model.precision == first.target_model.precision  # measured again
        assert engine.target_model.longest_block == first.target_model.longest_block
    if name == "target/step":
        assert steps and engine.measurements.values["target/step"] in (1, 2, 3)


@pytest.mark.core
def test_an_engine_keeps_the_longest_call_with_its_verdict(bundle_dir, tmp_path, monkeypatch):
    """The longest exact call is measured once per cache key, beside the verdict measured with it, and a later
    engine reads both without probing."""
    bundle = bundle_dir(*SAME_VOCAB)
    first = Engine(bundle, cache_dir=tmp_path, static_shapes=False)
    assert first.measurements.values["target/longest_block"] == {"dq": first.target_model.longest_block}
    assert first.target_model.longest_block > session_module.LONGEST_BLOCK  # the tiny model: the longest size tried
    checks, longest = spy_checks(monkeypatch), []
    probe = session_module.longest_exact_call
    monkeypatch.setattr(session_module, "longest_exact_call", lambda s: longest.append(1) or probe(s))
    engine = Engine(bundle, cache_dir=tmp_path, static_shapes=False)
    assert not checks and not longest
    assert engine.target_model.longest_block == first.target_model.longest_block and engine.target_model.block_invariant


@pytest.mark.core
def test_an_engine_in_a_test_that_patches_measures_for_itself(bundle_dir, monkeypatch):
    """conftest.py shares cache-off engines' measurements within a test run, but not with a test that uses
    monkeypatch: its engines run the probes, as a patched probe needs (and none of its verdicts are shared)."""
    checks = spy_checks(monkeypatch)
    Engine(bundle_dir(*SAME_VOCAB), cache_dir="off", static_shapes=False)
    assert checks


@pytest.mark.core
def test_a_u8_cache_stays_not_exact_whatever_its_entry_says(bundle_dir, tmp_path, monkeypatch):
    """u8 fails the check; an entry that says it passes is not one this module wrote, and is measured again."""
    bundle = bundle_dir(*SAME_VOCAB)
    first = Engine(bundle, cache_dir=tmp_path, static_shapes=False, kv_cache="u8")
    assert not first.target_model.block_invariant
    verdicts = first.measurements.values["target/invariant"]
    assert verdicts and not any(verdicts.values())
    rewrite(first.measurements, lambda e: e["target/invariant"].update(value={k: True for k in verdicts}))
    checks = spy_checks(monkeypatch)
    engine = Engine(bundle, cache_dir=tmp_path, static_shapes=False, kv_cache="u8")
    assert checks and not engine.target_model.block_invariant
    assert not engine.session().generate("def f(x):", CONFIG, algorithm="standard").exact


@pytest.mark.core
def test_a_verdict_from_another_instruction_set_or_core_count_is_not_read(bundle_dir, tmp_path, monkeypatch):
    bundle = bundle_dir(*SAME_VOCAB)
    Engine(bundle, cache_dir=tmp_path, static_shapes=False)
    checks = spy_checks(monkeypatch)
    Engine(bundle, cache_dir=tmp_path, static_shapes=False)
    assert not checks  # the same machine: read from the cache
    flags = measurements.kernel_flags()
    monkeypatch.setattr(measurements, "kernel_flags", lambda: flags + ["amx_fp16"] if "amx_fp16" not in flags
                        else flags[:-1])
    Engine(bundle, cache_dir=tmp_path, static_shapes=False)
    assert len(checks) == 1
    monkeypatch.setattr(measurements, "available_cores", lambda: measurements.os.cpu_count() + 7)
    Engine(bundle, cache_dir=tmp_path, static_shapes=False)
    assert len(checks) == 2


@pytest.mark.slow
def test_serve_starts_and_answers_with_bad_entries_in_its_cache(bundle_dir, tmp_path):
    """Every entry of every cache file the server wrote, made bad in one of the ways above (and one file not a cache
    at all): the server still loads and writes what it wrote before."""
    import urllib.request

    from serve_helpers import serve_command

    body = json.dumps({"prompt": "def f(x):", "max_tokens": 16, "temperature": 0}).encode()

    def complete(url: str) -> str:
        request = urllib.request.Request(url + "/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as response:
            return json.load(response)["choices"][0]["text"]

    args = (str(bundle_dir(*OTHER_VOCAB)), "--cache-dir", str(tmp_path))
    with serve_command(*args) as running:
        expected = complete(running.url)
    files = sorted((tmp_path / "plans").glob("*.json"))
    assert files
    bad = iter(BAD_ENTRIES.values())
    for path in files:
        data = json.loads(path.read_text())
        for name in data["entries"]:
            data["entries"][name] = {"value": next(bad, ("", "x"))[1], "seal": "0" * 24}
        data["entries"]["guard/slem/penalty=1/greedy/free"] = {"value": {"mode": True}, "seal": "0" * 24}
        path.write_text(json.dumps(data))
    files[0].write_text("[]")
    with serve_command(*args) as running:
        assert complete(running.url) == expected
