"""Memory given back to the system (spare_memory.py): no page of a mapped weights file stays resident after the
engine's load, a static copy's compile or a probe, and the output keeps every bit; the heap is trimmed once a
probe's KV cache is freed."""
from __future__ import annotations

import mmap
import time
import platform
import weakref
from pathlib import Path

import numpy as np
import pytest

import edge_specdec.runtime.session as session_module
from edge_specdec.runtime import Engine, GenerationConfig
from edge_specdec.runtime.session import open_model
from edge_specdec.runtime.spare_memory import release_mapped as release, releasing_mapped, trim_heap
from support import SAME_VOCAB, load_target_xml, logprob_bits

pytestmark = pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="reads /proc/self/smaps (Linux)")


def resident_kib(path) -> int:
    """KiB of the file `path` resident in this process's mappings of it (/proc/self/smaps)."""
    wanted, current, total = str(Path(path).resolve()), None, 0
    with open("/proc/self/smaps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            if "-" in fields[0] and not fields[0].endswith(":"):  # a mapping's header line
                current = fields[5].strip() if len(fields) == 6 else None
            elif fields[0] == "Rss:" and current == wanted:
                total += int(fields[1])
    return total


def test_release_drops_a_read_only_mapping_s_pages_and_keeps_its_bytes(tmp_path):
    path = tmp_path / "weights.bin"
    data = np.random.default_rng(0).integers(0, 256, 64 * mmap.PAGESIZE, dtype=np.uint8).tobytes()
    path.write_bytes(data)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        assert mapped[:] == data and resident_kib(path) > 0
        assert release(path) == len(data)
        assert resident_kib(path) == 0
        assert mapped[:] == data  # read back from the file


def test_pages_go_back_while_the_block_still_runs(tmp_path):
    path = tmp_path / "weights.bin"
    data = np.random.default_rng(1).integers(0, 256, 64 * mmap.PAGESIZE, dtype=np.uint8).tobytes()
    path.write_bytes(data)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        with releasing_mapped(path, interval=0.01):
            assert mapped[:] == data  # read, as a first inference reads the weights to repack them
            deadline = time.monotonic() + 10
            while resident_kib(path) and time.monotonic() < deadline:
                time.sleep(0.01)
            assert resident_kib(path) == 0  # given back before the block ends
            assert mapped[:] == data
        assert resident_kib(path) == 0


def test_release_leaves_a_writable_mapping_alone(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(bytes(4 * mmap.PAGESIZE))
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) as mapped:
        mapped[:4] = b"kept"  # a private copy of the page, not in the file: dropping it would lose the write
        assert release(path) == 0
        assert mapped[:4] == b"kept" and resident_kib(path) > 0


def test_release_leaves_a_read_only_mapping_alone_that_holds_written_pages(tmp_path):
    import ctypes

    path = tmp_path / "weights.bin"
    path.write_bytes(bytes(4 * mmap.PAGESIZE))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) as mapped:
        mapped[:4] = b"kept"
        address = ctypes.addressof(ctypes.c_char.from_buffer(mapped))
        assert libc.mprotect(address, len(mapped), mmap.PROT_READ) == 0  # now r--p, with a written page
        try:
            assert release(path) == 0
            assert mapped[:4] == b"kept"
        finally:
            libc.mprotect(address, len(mapped), mmap.PROT_READ | mmap.PROT_WRITE)


def test_release_of_a_file_not_mapped_does_nothing(tmp_path):
    assert release(tmp_path / "absent.bin") == 0 and release(None) == 0


def test_an_engine_keeps_no_weights_pages_after_its_load(bundle_dir, monkeypatch):
    # monkeypatch: real compiles (conftest shares compiled models otherwise), so the models map their files here
    engine = Engine(bundle_dir(*SAME_VOCAB))
    for model in (engine.target_model, engine.draft_model):
        assert model.weights_file.exists() and resident_kib(model.weights_file) == 0, model.weights_file


def test_a_static_copy_s_compile_keeps_no_weights_pages(bundle_dir, monkeypatch):
    engine = Engine(bundle_dir(*SAME_VOCAB), static_shapes=True)
    engine.compile_static_copies()
    assert engine.target_model.static
    assert resident_kib(engine.target_model.weights_file) == 0


def test_a_probe_keeps_no_weights_pages(bundle_dir, monkeypatch):
    known: dict = {}  # no verdict known: open_model probes the target
    model = open_model(load_target_xml(bundle_dir), known_invariant=known)
    assert known and model.block_invariant
    assert resident_kib(model.weights_file) == 0


def test_giving_the_pages_back_changes_no_output_bit(bundle_dir, monkeypatch):
    config = GenerationConfig(max_new_tokens=16, ignore_eos=True, logprobs=True)

    def run():
        engine = Engine(bundle_dir(*SAME_VOCAB))
        return [engine.session().generate("def f(x):", config, algorithm=a) for a in ("none", "standard")]
    released = run()
    monkeypatch.setattr(session_module, "release_mapped", lambda path: 0)
    kept = run()
    for a, b in zip(released, kept):
        assert a.token_ids == b.token_ids and logprob_bits(a) == logprob_bits(b)


def test_the_heap_is_trimmed_once_the_probe_s_cache_is_freed(bundle_dir, monkeypatch):
    probed, trimmed = [], []
    real_probe = session_module.passes_block_invariance
    monkeypatch.setattr(session_module, "passes_block_invariance",
                        lambda session: probed.append(weakref.ref(session)) or real_probe(session))
    # at the trim, the probe's session (and with it its KV cache of LONG_PAST tokens) must be gone
    monkeypatch.setattr(session_module, "trim_heap", lambda: trimmed.append([ref() for ref in probed]))
    open_model(load_target_xml(bundle_dir), known_invariant={})
    assert len(probed) == 1 and trimmed == [[None]]


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_trim_heap_asks_glibc():
    assert trim_heap() is True
