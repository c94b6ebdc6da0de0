"""Hostile settings and prompts outside the server: GenerationConfig's checks (non-finite, denormal and absurd
numbers) and `edge-specdec run`'s prompt reading (bytes that are not UTF-8, whitespace-only prompts)."""
from __future__ import annotations

import io
import math
import sys

import pytest

from edge_specdec.cli import main
from edge_specdec.errors import EdgeSpecdecError
from edge_specdec.runtime.sampling import GenerationConfig

NON_FINITE = (math.nan, math.inf, -math.inf)


@pytest.mark.parametrize("name", ["temperature", "top_p", "repetition_penalty"])
@pytest.mark.parametrize("value", NON_FINITE)
def test_non_finite_settings_are_refused(name, value):
    with pytest.raises(EdgeSpecdecError, match=f"{name} must be a finite number"):
        GenerationConfig(**{name: value}).validate()


@pytest.mark.parametrize("name, value, words", [
    ("temperature", 1e-310, "temperature must be 0 (greedy) or between"),
    ("temperature", 1e-9, "temperature must be 0 (greedy) or between"),
    ("temperature", 1e7, "temperature must be 0 (greedy) or between"),
    ("repetition_penalty", 1e-300, "repetition_penalty must be between"),
    ("repetition_penalty", 1e9, "repetition_penalty must be between"),
    ("temperature", "0.7", "temperature must be a finite number"),
    ("max_new_tokens", 2.5, "max_new_tokens must be an integer"),
    ("top_k", True, "top_k must be an integer"),
])
def test_absurd_settings_are_refused(name, value, words):
    with pytest.raises(EdgeSpecdecError, match=words.replace("(", r"\(").replace(")", r"\)")):
        GenerationConfig(**{name: value}).validate()


def test_sound_settings_pass():
    for config in (GenerationConfig(), GenerationConfig(temperature=1e-6, top_p=1e-300, repetition_penalty=1e-6),
                   GenerationConfig(temperature=1e6, repetition_penalty=1e6, top_k=5, top_logprobs=20)):
        assert config.validate() is config


@pytest.mark.parametrize("option, value", [("--temperature", "nan"), ("--temperature", "1e-310"),
                                           ("--top-p", "inf"), ("--repetition-penalty", "nan")])
def test_run_refuses_non_finite_settings_in_one_line(option, value, capsys):
    assert main(["run", "--prompt", "x", option, value]) == 1
    err = capsys.readouterr().err
    assert err.startswith("edge-specdec: error: ") and err.count("\n") == 1 and ("finite" in err or "between" in err)


# --- prompts that are not text ------------------------------------------------------------------------------------

def test_run_names_the_bad_byte_of_an_argv_prompt(capsys):
    """A non-UTF-8 byte in argv reaches Python as a lone surrogate (surrogateescape)."""
    prompt = b"def f(\xff):".decode("utf-8", "surrogateescape")
    assert main(["run", "--prompt", prompt]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--prompt" in err and "byte 6" in err and "0xff" in err, err


def test_run_names_the_bad_byte_of_a_prompt_file(tmp_path, capsys):
    path = tmp_path / "prompt.txt"
    path.write_bytes("héllo\n".encode() + b"x\xc3(")
    assert main(["run", "--prompt-file", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(path) in err and "byte 8" in err and "0xc3" in err, err


def test_run_names_the_bad_byte_of_stdin(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"ok \xfe\xfe"), encoding="utf-8"))
    assert main(["run", "--prompt", "-"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "stdin" in err and "byte 3" in err and "0xfe" in err, err


def test_run_refuses_a_lone_surrogate_that_is_not_a_byte(capsys):
    """A surrogate that surrogateescape did not make (U+D800) is no byte of the input: said as a character."""
    assert main(["run", "--prompt", "a\ud800b"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "U+D800" in err and "character 1" in err, err


def test_run_accepts_a_whitespace_only_prompt(capsys):
    """Whitespace is text: run generates from it, as the Python API and the server do."""
    assert main(["run", "--prompt", "   \n", "--max-new-tokens", "2", "--json"]) == 0
    assert '"token_ids"' in capsys.readouterr().out
