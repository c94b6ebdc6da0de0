"""A long prompt's prefill, fed in several calls: on_prefill hears its progress between them, and a run cancelled
there stops before its first token (a server's client that left, a user's stop); the cache keeps the prompt's tokens
fed so far, and a later run on the prompt reuses them and writes what a fresh session writes."""
from __future__ import annotations

import io
import re
import sys
import threading

import pytest

from edge_specdec.runtime import PrefillProgress
from support import OTHER_VOCAB, SAME_VOCAB, bits
from test_long_prompt_prefill import PRECISION
from test_sequences_generate import GREEDY, PROMPT, engines, small_threshold  # noqa: F401 (fixtures)

LONG = PROMPT * 3  # several calls on the tiny models, on the prefill copy and without it


def prefill_calls(engine) -> int:
    """How many calls the target's session feeds LONG's prompt in (its watch reports between them)."""
    heard: list[PrefillProgress] = []
    engine.session().generate(LONG, GREEDY, algorithm="none", on_prefill=heard.append)
    return sum(0 < p.done < p.total for p in heard) + 1


@pytest.mark.parametrize("copy", [False, True], ids=["blocks", "prefill-copy"])
def test_on_prefill_hears_the_prefills_start_its_calls_and_its_end(engines, small_threshold, copy):
    engine = engines(SAME_VOCAB, **({"long_prompt_precision": PRECISION} if copy else {}))
    prompt = engine.tokenizer.encode(LONG)
    heard: list[PrefillProgress] = []
    session = engine.session()
    result = session.generate(prompt, GREEDY, algorithm="standard", on_prefill=heard.append)
    calls = prefill_calls(engine)
    assert calls >= 2 and len(heard) == calls + 1, heard  # the start, between each two calls, the end
    assert all(p.total == len(prompt) and p.cached == 0 for p in heard)
    done, seconds = [p.done for p in heard], [p.seconds for p in heard]
    assert done[0] == 0 and done[-1] == len(prompt) and done == sorted(set(done))
    assert seconds == sorted(seconds) and seconds[-1] < result.stats.seconds
    alone = engine.session().generate(prompt, GREEDY, algorithm="standard")  # no watch: the same run
    assert result.token_ids == alone.token_ids and bits(result.logprobs) == bits(alone.logprobs)
    # a run whose prompt starts with what the cache holds: those tokens are cached, and done from the start
    session = engine.session()
    session.generate(prompt[:64], GREEDY, algorithm="none")
    again: list[PrefillProgress] = []
    reused = session.generate(prompt, GREEDY, algorithm="standard", on_prefill=again.append).stats.prompt_tokens_reused
    assert reused > 0 and all(p.cached == reused for p in again) and len(again) >= 3
    assert again[0].done == reused and again[-1].done == len(prompt)
    # a short prompt, in one call: its start and its end
    short: list[PrefillProgress] = []
    engine.session().generate(prompt[:20], GREEDY, algorithm="standard", on_prefill=short.append)
    assert [(p.done, p.total) for p in short] == [(0, 20), (20, 20)]


@pytest.mark.parametrize("pair,algorithm,copy", [(SAME_VOCAB, "none", True), (SAME_VOCAB, "standard", False),
                                                 (OTHER_VOCAB, "slem", True)])
def test_a_run_cancelled_during_its_prefill_stops_and_the_next_reuses_what_was_fed(engines, small_threshold, pair,
                                                                                 algorithm, copy):
    engine = engines(pair, **({"long_prompt_precision": PRECISION} if copy else {}))
    prompt = engine.tokenizer.encode(LONG)
    cancel, at = threading.Event(), []

    def stop_after_the_first_call(progress):
        if progress.done > progress.cached:
            at.append(progress.done)
            cancel.set()
    session = engine.session()
    stopped = session.generate(prompt, GREEDY, algorithm=algorithm, cancel=cancel,
                               on_prefill=stop_after_the_first_call)
    assert stopped.stop_reason == "stopped" and stopped.token_ids == [] and len(at) == 1
    assert session.target.tokens == prompt[:at[0]]  # the calls made, nothing more
    assert stopped.stats.prompt_tokens_prefilled == at[0]
    again = session.generate(prompt, GREEDY, algorithm=algorithm)
    fresh = engine.session().generate(prompt, GREEDY, algorithm=algorithm)
    assert again.stats.prompt_tokens_reused == at[0] > 0
    assert again.stats.prompt_tokens_prefilled == len(prompt) - at[0]
    assert again.token_ids == fresh.token_ids and bits(again.logprobs) == bits(fresh.logprobs)


def test_a_run_cancelled_before_it_starts_stops_before_its_prefill(engines, small_threshold):
    """A request whose client left while it waited for its slot: not one call of its prompt."""
    engine = engines(SAME_VOCAB)
    cancel = threading.Event()
    cancel.set()
    session = engine.session()
    session.generate(LONG[:200], GREEDY, algorithm="none")  # a cache to keep
    kept = list(session.target.tokens)
    heard: list[PrefillProgress] = []
    stopped = session.generate(LONG, GREEDY, algorithm="none", cancel=cancel, on_prefill=heard.append)
    assert stopped.stop_reason == "stopped" and stopped.token_ids == [] and stopped.stats.prompt_tokens_prefilled == 0
    reused = stopped.stats.prompt_tokens_reused
    assert reused > 0 and session.target.tokens == kept[:reused]  # the prefix it kept, nothing computed
    assert [(p.done, p.cached) for p in heard] == [(reused, reused)]  # the start, reported


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.slow  # opens the demo's engine
def test_run_on_a_terminal_shows_the_prefills_line_then_erases_it_before_the_text(monkeypatch):
    from edge_specdec.cli import main
    screen = Terminal()  # stdout and stderr on one terminal: what comes in which order
    monkeypatch.setattr(sys, "stderr", screen)
    monkeypatch.setattr(sys, "stdout", screen)
    prompt = "def parse(text):\n    words = []\n    for w in text.split():\n        words.append(w)\n" * 30 + "def "
    assert main(["run", "--prompt", prompt, "--max-new-tokens", "4", "--algorithm", "none"]) == 0
    shown = screen.getvalue()
    lines = re.findall(r"\r\x1b\[Kprefilling the prompt: (\d+) of (\d+) tokens \((\d+) %\)", shown)
    assert len(lines) >= 2 and len({total for _, total, _ in lines}) == 1, shown
    assert [int(done) for done, _, _ in lines] == sorted(int(done) for done, _, _ in lines)
    last = shown.rindex("prefilling the prompt")
    erased = shown.index("\r\x1b[K", last)
    text = shown[erased + len("\r\x1b[K"):shown.index("[none]", erased)]
    assert text.strip() and "\x1b" not in text  # the line erased, then the text, then the statistics line


def test_the_prefills_line_is_only_for_a_terminal(monkeypatch):
    from edge_specdec.cli.common import PrefillLine, prefill_line
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    with prefill_line() as none:
        assert none is None  # a log or a pipe keeps no rewritten line
    out = Terminal()
    line = PrefillLine(out)
    line.clear()  # nothing shown: nothing to erase
    line(PrefillProgress(64, 512, 64, 0.0))  # the start: not shown (most prompts take one call)
    line(PrefillProgress(128, 512, 64, 1.5))
    line(PrefillProgress(512, 512, 64, 3.0))  # done: erased
    line.clear()
    assert out.getvalue() == "\r\x1b[Kprefilling the prompt: 128 of 512 tokens (25 %)\r\x1b[K"
