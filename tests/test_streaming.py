"""Streaming and stopping in Python: the stream iterator, leaving it early, a callback that stops, errors in the
caller's thread, Ctrl-C in a callback, and calls from several threads at once."""
from __future__ import annotations

import threading

import pytest

from edge_specdec.errors import EdgeSpecdecError
from edge_specdec.runtime import GenerationConfig, Pipeline
from support import SAME_VOCAB


@pytest.fixture(scope="module")
def pipe(bundle_dir):
    return Pipeline(bundle_dir(*SAME_VOCAB))


def test_stream_iterator_yields_the_text_and_keeps_the_result(pipe):
    config = GenerationConfig(max_new_tokens=20, ignore_eos=True)
    reference = pipe.generate("def f(x):", config)
    it = pipe.stream("def f(x):", config)
    pieces = list(it)
    assert len(pieces) > 1 and "".join(pieces) == reference.text
    assert it.result.token_ids == reference.token_ids and it.result.stats.new_tokens == 20


def test_leaving_the_stream_early_stops_generation(pipe):
    it = pipe.stream("def f(x):", GenerationConfig(max_new_tokens=200, ignore_eos=True), algorithm="none")
    for _ in it:
        break
    it_list = list(it)  # exhausted: the loop above closed it
    assert it_list == []
    assert it.result.stop_reason == "stopped" and it.result.stats.new_tokens < 200


def test_callback_returning_true_stops(pipe):
    result = pipe.generate("x = ", GenerationConfig(max_new_tokens=50, ignore_eos=True), on_text=lambda text: True)
    assert result.stop_reason == "stopped" and 1 <= result.stats.new_tokens < 50


def test_stream_reraises_errors_in_the_callers_thread(pipe):
    with pytest.raises(EdgeSpecdecError, match="the prompt is empty"):
        list(pipe.stream(""))


def test_ctrl_c_returns_what_was_generated(pipe):
    seen = []

    def interrupt_after_some_text(text):
        seen.append(text)
        if len(seen) == 3:
            raise KeyboardInterrupt

    result = pipe.generate("def f(x):", GenerationConfig(max_new_tokens=100, ignore_eos=True),
                           on_text=interrupt_after_some_text)
    assert result.stop_reason == "interrupted" and result.text.startswith("".join(seen))
    assert 3 <= result.stats.new_tokens < 100


def test_calls_from_several_threads_are_serialized_and_correct(pipe):
    prompts = ["def f(x):", "a b a b", "The quick brown fox", "import os\n"]
    config = GenerationConfig(max_new_tokens=16, ignore_eos=True)
    expected = {p: pipe.generate(p, config).token_ids for p in prompts}
    got, errors = {}, []

    def work(p):
        try:
            got[p] = pipe.generate(p, config).token_ids
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(p,)) for p in prompts * 2]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and got == expected
