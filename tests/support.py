"""What several test modules share: the tiny bundles' specs, the prompts of the exactness checks, the sampling
test, the command line in a subprocess, spies on sessions and folders, and a vocabulary-only GGUF file.

Fixtures are in conftest.py, hostile text in hostile_text.py, starting `edge-specdec serve` in serve_helpers.py.
Test modules import from these, never from one another.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import weakref
from collections import Counter
from pathlib import Path

import numpy as np

from hostile_text import HOSTILE_STRINGS

# bundle_dir(*SPEC): (target, draft, target weights, draft weights), models from conftest.MODELS
SAME_VOCAB = ("qwen2-bytelevel", "qwen2-bytelevel-small", "int8", "int8")  # a draft with the target's tokenizer
OTHER_VOCAB = ("qwen2-bytelevel", "llama-metaspace", "int8", "int8")  # a draft with another tokenizer

# the prompts the exactness checks decode: every non-blank hostile string, code, repetition, plain prose
EXACTNESS_PROMPTS = [s for s in HOSTILE_STRINGS if s.strip()] + [
    "def fib(n):\n    if n < 2:\n        return n\n", "a b a b a b a b", "The quick brown fox"]


def load_target_xml(bundle_dir) -> Path:
    """The target model's IR in the SAME_VOCAB bundle."""
    from edge_specdec.bundle import load_bundle
    return load_bundle(bundle_dir(*SAME_VOCAB)).target.model_xml


# --- the sampling test: do two samplers draw from one distribution? ---------------------------------------------

SAMPLING = {"temperature": 0.3, "top_k": 40, "top_p": 0.95}
N_SAMPLES = 600
QUICK_SAMPLES = 200  # the fast tier's one distribution test (test_runtime.py); the slow tier draws N_SAMPLES
ALPHA = 1e-3  # false-alarm rate of each distribution test


_TARGET_ALONE_SAMPLES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def first_tokens(pipe, algorithm, seeds, config_kwargs, n_tokens=2, confidence=0.0) -> Counter:
    """How often each sequence of the first n_tokens came out, one seeded generation per seed.

    The target alone's sample (algorithm "none", every seed given) is drawn once per pipeline and settings and then
    reused: it is the reference of several distribution tests, and seeded runs of the target alone are
    deterministic. Call it before monkeypatching anything, as the tests do; speculative samples are always drawn."""
    from edge_specdec.runtime import GenerationConfig

    seeds = list(seeds)
    key = None
    if algorithm == "none" and None not in seeds:
        key = (tuple(seeds), tuple(sorted(config_kwargs.items())), n_tokens, confidence)
        cached = _TARGET_ALONE_SAMPLES.get(pipe, {}).get(key)
        if cached is not None:
            return Counter(cached)
    out = Counter()
    for seed in seeds:
        config = GenerationConfig(max_new_tokens=n_tokens, seed=seed, ignore_eos=True, **config_kwargs)
        result = pipe.generate("def f", config, algorithm=algorithm, num_assistant_tokens=3, confidence=confidence)
        out[tuple(result.token_ids)] += 1
    if key is not None:
        _TARGET_ALONE_SAMPLES.setdefault(pipe, {})[key] = Counter(out)
    return out


def homogeneity_pvalue(a: Counter, b: Counter) -> float:
    """Chi-square test that two samples come from one distribution (rare outcomes pooled)."""
    from scipy.stats import chi2_contingency

    keys = sorted(set(a) | set(b), key=lambda k: -(a[k] + b[k]))
    common = [k for k in keys if a[k] + b[k] >= 10]
    table = [[a[k] for k in common] + [sum(a[k] for k in keys if k not in common)],
             [b[k] for k in common] + [sum(b[k] for k in keys if k not in common)]]
    if table[0][-1] + table[1][-1] == 0:
        table = [row[:-1] for row in table]
    return chi2_contingency(np.array(table)).pvalue


def pipeline_cache(bundle_dir, kind=None):
    """get(pair, **options) -> a Pipeline (or `kind`, such as Engine) of the bundle_dir fixture's pair with those
    Engine options, each built once (a test module keeps one of these in a fixture of its scope)."""
    from edge_specdec.runtime import Pipeline

    kind = kind or Pipeline
    cache: dict = {}

    def get(pair, **options):
        key = (pair, tuple(sorted(options.items())))
        if key not in cache:
            cache[key] = kind(bundle_dir(*pair), **options)
        return cache[key]
    return get


# --- the command line, spies ------------------------------------------------------------------------------------

def run_cli(*args: str, **kwargs) -> subprocess.CompletedProcess:
    """`edge-specdec ARGS` in a subprocess, the compiled-model cache off, its output captured as text; kwargs go to
    subprocess.run (input=..., timeout=...)."""
    env = {**os.environ, "EDGE_SPECDEC_CACHE_DIR": "off"}
    return subprocess.run([sys.executable, "-m", "edge_specdec.cli", *args], capture_output=True, text=True,
                          env=env, **kwargs)


def interruptible() -> None:
    """A child process's `preexec_fn` for tests that send it SIGINT: Ctrl-C's default action, even where the test
    run itself ignores SIGINT (a shell without job control starts background jobs so: `pytest ... &` in a script),
    since Python leaves an ignored SIGINT ignored and the child would never see its KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def spy_block_sizes(session, monkeypatch) -> list[int]:
    """The number of tokens of every call the session makes to the device from now on."""
    sizes: list[int] = []
    infer = session._infer

    def recording(tokens, rows):
        sizes.append(len(tokens))
        return infer(tokens, rows)
    monkeypatch.setattr(session, "_infer", recording)
    return sizes


def spy_prompt_reuse(monkeypatch) -> list[int]:
    """The prompt tokens each DecodingSession.generate call from now on reused from its KV cache, in call order."""
    from edge_specdec.runtime.pipeline import DecodingSession

    reused: list[int] = []
    real = DecodingSession.generate

    def generate(self, *args, **kwargs):
        result = real(self, *args, **kwargs)
        reused.append(result.stats.prompt_tokens_reused)
        return result

    monkeypatch.setattr(DecodingSession, "generate", generate)
    return reused


def tree_state(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file below folder with its size and mtime: to prove that a failed command changed nothing."""
    return {p.relative_to(folder).as_posix(): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*"))} if folder.exists() else {}


def logprob_bits(result) -> list:
    """A result's logprobs as raw float64 bits: equality here is bit for bit."""
    return [np.float64(lp.logprob).view(np.int64) for lp in result.logprobs]


def bits(logprobs) -> list:
    """Each logprob (and its alternatives) as raw float64 bits, with its token."""
    return [(lp.token, np.float64(lp.logprob).view(np.int64), [(t, np.float64(v).view(np.int64)) for t, v in lp.top])
            for lp in logprobs]


def forced_logprobs(pipe, prompt_ids: list[int], tokens: list[int], config):
    """The target alone's logprobs of `tokens`, computed in one feed from scratch (teacher forcing), in the layouts
    a run on that prompt has (session.py, "One-token sequences")."""
    from edge_specdec.runtime.sampling import penalize, token_logprobs

    session = pipe.target
    session.reset()
    session.end_prompt(prompt_ids)  # the layout a run on that prompt feeds the positions after it in
    rows = session.feed(prompt_ids + tokens, rows=len(tokens) + 1)[:-1]
    session.reset()
    return token_logprobs(penalize(rows, config, prompt_ids, tokens), tokens, config)


# --- files written for tests -------------------------------------------------------------------------------------

def write_vocab_gguf(tokenizer_dir: Path, path: Path, pre: str) -> Path:
    """A GGUF with only the tokenizer fields of a byte-level BPE tokenizer folder, as llama.cpp's converter writes
    them (normal tokens 1, control tokens 3)."""
    import gguf

    spec = json.loads((tokenizer_dir / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = spec["model"]["vocab"]
    tokens = [None] * len(vocab)
    for token, i in vocab.items():
        tokens[i] = token
    special = {t["id"] for t in spec["added_tokens"] if t["special"]}
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    writer = gguf.GGUFWriter(str(path), "gpt2")
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types([3 if i in special else 1 for i in range(len(tokens))])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(min(special))
    writer.add_eos_token_id(min(special))
    writer.add_chat_template("{{ messages[0]['content'] }}")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    return path
