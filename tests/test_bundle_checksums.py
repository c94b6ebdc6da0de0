"""A bundle's sha256 checksums are verified when it is first loaded on a machine and whenever a file changed since.

What was verified is remembered outside the bundle, in the user cache ($EDGE_SPECDEC_CACHE_DIR/verified-bundles),
per file as (size, mtime_ns, sha256): a later load of an unchanged bundle costs only stat() calls.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

import edge_specdec.bundle as bundle_mod
from edge_specdec.bundle import load_bundle
from edge_specdec.errors import BundleError
from support import SAME_VOCAB

WEIGHTS = "target/openvino_model.bin"
HOUR_NS = 3600 * 10**9


@pytest.fixture
def bundle_copy(bundle_dir, tmp_path) -> Path:
    """A private copy of a small bundle whose files were last modified an hour ago (so none is 'just written')."""
    dst = tmp_path / "bundle"
    shutil.copytree(bundle_dir(*SAME_VOCAB), dst)
    old = time.time_ns() - HOUR_NS
    for p in dst.rglob("*"):
        if p.is_file():
            os.utime(p, ns=(old, old))
    return dst


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """A writable user cache for this test only (the suite's default is EDGE_SPECDEC_CACHE_DIR=off)."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("EDGE_SPECDEC_CACHE_DIR", str(folder))
    return folder


@pytest.fixture
def hashed(monkeypatch) -> list[str]:
    """The bundle-relative path of every file that sha256_file hashes, in order. (The manifest, a few kB, is read
    at every load for the record's key, without sha256_file.)"""
    calls: list[str] = []
    real = bundle_mod.sha256_file

    def counting(path, *args, **kwargs):
        path = Path(path)
        calls.append(f"{path.parent.name}/{path.name}" if path.parent.name in bundle_mod.ROLES else path.name)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(bundle_mod, "sha256_file", counting)
    return calls


def flip_a_byte(path: Path) -> None:
    """Same size, one byte changed: only a checksum can see it."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def listed(bundle: Path) -> list[str]:
    return list(json.loads((bundle / "manifest.json").read_text())["files"])


def info_message(bundle: Path) -> str:
    """What `edge-specdec info` (load_bundle with verify=True) says about the bundle."""
    with pytest.raises(BundleError) as exc:
        load_bundle(bundle, verify=True)
    return str(exc.value)


# ---------- a tampered bundle is refused ----------

@pytest.mark.parametrize("remembered", [False, True], ids=["first-load", "after-a-verified-load"])
def test_pipeline_refuses_a_same_size_byte_flip(bundle_copy, cache, remembered):
    from edge_specdec.runtime import Pipeline

    if remembered:
        load_bundle(bundle_copy, verify=None)  # verified and remembered before the damage
    flip_a_byte(bundle_copy / WEIGHTS)
    with pytest.raises(BundleError, match=r"target/openvino_model\.bin does not match its sha256") as exc:
        Pipeline(bundle_copy)
    assert str(exc.value) == info_message(bundle_copy)  # the same words as `edge-specdec info`


def test_pipeline_refuses_a_byte_flip_with_the_cache_off(bundle_copy, monkeypatch):
    from edge_specdec.runtime import Pipeline

    monkeypatch.setenv("EDGE_SPECDEC_CACHE_DIR", "off")
    flip_a_byte(bundle_copy / WEIGHTS)
    with pytest.raises(BundleError, match=r"target/openvino_model\.bin does not match its sha256"):
        Pipeline(bundle_copy)


@pytest.mark.slow
def test_cli_run_refuses_a_same_size_byte_flip(bundle_copy, cache):
    load_bundle(bundle_copy, verify=None)  # remembered as verified: the flip must still be seen
    flip_a_byte(bundle_copy / WEIGHTS)
    proc = subprocess.run([sys.executable, "-m", "edge_specdec.cli", "run", str(bundle_copy), "--prompt", "def f(x):",
                           "--max-new-tokens", "4"], capture_output=True, text=True,
                          env={**os.environ, "EDGE_SPECDEC_CACHE_DIR": str(cache)}, timeout=300)
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout == "" and "Traceback" not in proc.stderr
    assert proc.stderr.splitlines() == [f"edge-specdec: loading {bundle_copy} ... failed.",
                                        f"edge-specdec: error: {info_message(bundle_copy)}"]


# ---------- an unchanged bundle is not hashed again ----------

def test_an_unchanged_bundle_loads_again_without_hashing(bundle_copy, cache, hashed):
    from edge_specdec.runtime import Pipeline

    Pipeline(bundle_copy)
    assert set(listed(bundle_copy)) <= set(hashed)  # the first load on this machine hashes every file
    hashed.clear()
    Pipeline(bundle_copy)
    assert hashed == []  # only stat() calls
    records = list((cache / bundle_mod.CHECKS_DIR).iterdir())
    assert len(records) == 1 and records[0].suffix == ".json"  # one small JSON, no temporary file left behind
    record = json.loads(records[0].read_text())
    assert record["bundle"] == str(bundle_copy.resolve())
    assert set(record["files"]) == set(listed(bundle_copy))
    stat = (bundle_copy / WEIGHTS).stat()
    assert record["files"][WEIGHTS]["size"] == stat.st_size and record["files"][WEIGHTS]["mtime_ns"] == stat.st_mtime_ns


def test_a_touched_file_is_verified_again(bundle_copy, cache, hashed):
    load_bundle(bundle_copy, verify=None)
    hashed.clear()
    st = (bundle_copy / WEIGHTS).stat()
    os.utime(bundle_copy / WEIGHTS, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # same bytes, new mtime
    load_bundle(bundle_copy, verify=None)
    assert WEIGHTS in hashed and "draft/openvino_model.bin" not in hashed
    hashed.clear()
    load_bundle(bundle_copy, verify=None)  # verified again, so remembered again
    assert hashed == []


def test_a_changed_manifest_verifies_everything_again(bundle_copy, cache, hashed):
    load_bundle(bundle_copy, verify=None)
    mpath = bundle_copy / "manifest.json"
    manifest = json.loads(mpath.read_text())
    manifest["created"] = "another export"
    mpath.write_text(json.dumps(manifest))
    hashed.clear()
    load_bundle(bundle_copy, verify=None)
    assert set(listed(bundle_copy)) <= set(hashed)


def test_a_file_written_just_before_verifying_is_not_trusted_later(bundle_copy, cache, hashed, monkeypatch):
    """Its mtime could still be shared by a write that lands after the hash (coarse timestamps): hash it again."""
    mtime = (bundle_copy / WEIGHTS).stat().st_mtime_ns + HOUR_NS  # the other files are an hour older
    os.utime(bundle_copy / WEIGHTS, ns=(mtime, mtime))
    # the verification starts 1 s after the weights were written (a fixed clock, so the test does not race it)
    monkeypatch.setattr(bundle_mod, "time", types.SimpleNamespace(time_ns=lambda: mtime + 10**9))
    load_bundle(bundle_copy, verify=None)
    hashed.clear()
    load_bundle(bundle_copy, verify=None)
    assert hashed == [WEIGHTS]


# ---------- no usable cache: verify every time ----------

@pytest.mark.parametrize("setting", ["off", "a-file"])
def test_without_a_usable_cache_every_load_verifies(bundle_copy, tmp_path, monkeypatch, hashed, setting):
    if setting == "a-file":
        (tmp_path / "a-file").write_text("not a folder")  # the records cannot be written below it
        setting = str(tmp_path / "a-file")
    monkeypatch.setenv("EDGE_SPECDEC_CACHE_DIR", setting)
    for _ in range(2):
        hashed.clear()
        load_bundle(bundle_copy, verify=None)
        assert set(listed(bundle_copy)) <= set(hashed)


# ---------- the explicit settings keep their meaning ----------

def test_verify_true_hashes_every_time_and_false_never(bundle_copy, cache, hashed):
    for _ in range(2):
        hashed.clear()
        load_bundle(bundle_copy, verify=True)
        assert set(listed(bundle_copy)) <= set(hashed)
    hashed.clear()
    flip_a_byte(bundle_copy / WEIGHTS)
    load_bundle(bundle_copy, verify=False)  # sizes only, as before
    assert hashed == []
