"""A bundle's sha256 checksums are verified in full whenever it is opened for generation.

Engine hashes every file in a thread while its models compile (bundle.start_verification) and waits for it before
the load ends, so a file rewritten at the same size with its mtime restored, or bit rot, is refused before anything
is generated. `--no-verify` / Engine(verify_checksums=False) load it for users who accept the risk.
"""
from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path

import pytest

import edge_specdec.bundle as bundle_mod
from edge_specdec.bundle import load_bundle
from edge_specdec.errors import BundleError
from support import SAME_VOCAB, run_cli

WEIGHTS = "target/openvino_model.bin"
HOUR_NS = 3600 * 10**9


@pytest.fixture
def bundle_copy(bundle_dir, tmp_path) -> Path:
    """A private copy of a small bundle whose files were last modified an hour ago."""
    dst = tmp_path / "bundle"
    shutil.copytree(bundle_dir(*SAME_VOCAB), dst)
    old = time.time_ns() - HOUR_NS
    for p in dst.rglob("*"):
        if p.is_file():
            os.utime(p, ns=(old, old))
    return dst


@pytest.fixture
def hashed(monkeypatch) -> list[tuple[str, str]]:
    """(bundle-relative path, thread name) of every file that sha256_file hashes, in order."""
    calls: list[tuple[str, str]] = []
    real = bundle_mod.sha256_file

    def counting(path, *args, **kwargs):
        path = Path(path)
        rel = f"{path.parent.name}/{path.name}" if path.parent.name in bundle_mod.ROLES else path.name
        calls.append((rel, threading.current_thread().name))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(bundle_mod, "sha256_file", counting)
    return calls


def tamper_in_place(path: Path) -> None:
    """Same size, one byte changed, the mtime set back: neither size nor mtime shows it, only a checksum."""
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns


def listed(bundle: Path) -> list[str]:
    return list(json.loads((bundle / "manifest.json").read_text())["files"])


def info_message(bundle: Path) -> str:
    """What `edge-specdec info` (load_bundle with verify=True) says about the bundle."""
    with pytest.raises(BundleError) as exc:
        load_bundle(bundle, verify=True)
    return str(exc.value)


# ---------- a tampered bundle is refused, every time ----------

def test_engine_refuses_a_same_size_rewrite_with_its_mtime_restored(bundle_copy):
    from edge_specdec.runtime import Pipeline

    first = Pipeline(bundle_copy)  # a clean load first: nothing of it may be trusted later
    del first  # its static copies compile only for requests, and it served none: nothing reads the weights now
    tamper_in_place(bundle_copy / WEIGHTS)
    with pytest.raises(BundleError) as exc:
        Pipeline(bundle_copy)
    message = str(exc.value)
    assert "\n" not in message and message == info_message(bundle_copy)  # one line, the words of `info`
    assert f"{bundle_copy / WEIGHTS} does not match its sha256" in message
    assert "--force" in message and "--no-verify" in message and "verify_checksums=False" in message  # the fixes


def test_a_bundle_object_is_verified_too(bundle_copy):
    from edge_specdec.runtime import Engine

    bundle = load_bundle(bundle_copy)  # verified now ...
    tamper_in_place(bundle_copy / WEIGHTS)  # ... damaged before the engine opens it
    with pytest.raises(BundleError, match=r"target/openvino_model\.bin does not match its sha256"):
        Engine(bundle)


def test_verify_checksums_false_loads_it(bundle_copy):
    from edge_specdec.runtime import GenerationConfig, Pipeline

    tamper_in_place(bundle_copy / WEIGHTS)
    pipe = Pipeline(bundle_copy, verify_checksums=False)  # the user accepts the risk
    assert pipe.generate("def f(x):", GenerationConfig(max_new_tokens=3)).token_ids


def test_every_load_hashes_every_file_in_a_thread_beside_the_compile(bundle_copy, hashed):
    from edge_specdec.runtime import Engine

    for _ in range(2):  # nothing is remembered between loads
        hashed.clear()
        Engine(bundle_copy)
        assert sorted(rel for rel, _ in hashed) == sorted(listed(bundle_copy))
        assert {name for _, name in hashed} == {"verify-bundle"}  # not the thread that compiles
    hashed.clear()
    Engine(bundle_copy, verify_checksums=False)
    assert hashed == []


def test_load_bundle_verify_true_hashes_and_false_checks_sizes(bundle_copy, hashed):
    load_bundle(bundle_copy, verify=True)
    assert sorted(rel for rel, _ in hashed) == sorted(listed(bundle_copy))
    hashed.clear()
    tamper_in_place(bundle_copy / WEIGHTS)
    load_bundle(bundle_copy, verify=False)  # sizes only
    assert hashed == []
    with open(bundle_copy / WEIGHTS, "ab") as f:
        f.write(b"x")
    with pytest.raises(BundleError, match=r"has \d+ bytes but the manifest says"):
        load_bundle(bundle_copy, verify=False)


def test_verification_reports_the_first_mismatch_on_wait(bundle_copy):
    tamper_in_place(bundle_copy / WEIGHTS)
    verification = bundle_mod.start_verification(load_bundle(bundle_copy, verify=False))
    with pytest.raises(BundleError, match=r"target/openvino_model\.bin does not match"):
        verification.wait()
    with pytest.raises(BundleError):  # and again: a second wait does not forget it
        verification.wait()


# ---------- the commands that open a bundle ----------

@pytest.mark.slow
def test_cli_run_refuses_it_and_no_verify_loads_it(bundle_copy):
    tamper_in_place(bundle_copy / WEIGHTS)
    proc = run_cli("run", str(bundle_copy), "--prompt", "def f(x):", "--max-new-tokens", "4", timeout=300)
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout == "" and "Traceback" not in proc.stderr
    assert proc.stderr.splitlines() == [f"edge-specdec: loading {bundle_copy} ... failed.",
                                        f"edge-specdec: error: {info_message(bundle_copy)}"]
    proc = run_cli("run", str(bundle_copy), "--prompt", "def f(x):", "--max-new-tokens", "4", "--no-verify",
                   timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip()


@pytest.mark.parametrize("command", ["serve", "check"])
def test_the_other_commands_that_open_a_bundle_take_no_verify(command):
    from edge_specdec.cli import build_parser
    from edge_specdec.cli.common import engine_config

    args = build_parser().parse_args([command, "some/bundle", "--no-verify"])
    assert engine_config(args).verify_checksums is False
    args = build_parser().parse_args([command, "some/bundle"])
    assert engine_config(args).verify_checksums is True
