"""Chat out of the box: the packaged demo's chat template, and `edge-specdec chat` from a pipe and on a terminal,
whose answers are what the pipeline writes for the same conversation."""
from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time

import pytest

from edge_specdec.bundle import load_bundle
from edge_specdec.demo import DEMO_BUNDLE
from edge_specdec.runtime.chat import ChatTemplate
from support import SAME_VOCAB, interruptible, run_cli

TOKENS = 12  # per answer: enough to tell answers apart, cheap on a busy machine


@pytest.fixture(scope="module")
def demo_pipe():
    from edge_specdec.runtime import Pipeline

    return Pipeline(str(DEMO_BUNDLE))


def expected_answers(pipe, turns: list[str]) -> list[str]:
    """The demo's greedy answers (with the demo's repetition penalty, as `chat` gives it) to a conversation of
    these user turns, through Pipeline.chat_prompt and generate: what `chat` must print."""
    from edge_specdec.runtime import GenerationConfig

    config = GenerationConfig(max_new_tokens=TOKENS)  # + the demo's recorded defaults, as `chat` applies them
    messages, answers = [], []
    for turn in turns:
        messages.append({"role": "user", "content": turn})
        answers.append(pipe.generate(pipe.chat_prompt(messages), config).text)
        messages.append({"role": "assistant", "content": answers[-1]})
    return answers


def test_the_demo_has_a_chat_template_for_a_code_model_and_its_manifest_lists_it():
    template = ChatTemplate.from_model_folder(DEMO_BUNDLE / "target")
    assert template is not None
    text = template.render([{"role": "system", "content": "You write Python."},
                            {"role": "user", "content": "Parse the arguments.\nThen print them."},
                            {"role": "assistant", "content": "\ndef main():\n    pass\n"},
                            {"role": "user", "content": "Now test it."}])
    # each message a comment, each answer the code after it as the model wrote it (so the next turn's prompt
    # starts with the answer's own tokens): text as the demo's training corpus reads
    assert text == ("# You write Python.\n\n# Parse the arguments.\n# Then print them.\n\n"
                    "\ndef main():\n    pass\n\n\n\n# Now test it.\n\n")
    bundle = load_bundle(DEMO_BUNDLE, verify=True)  # the template's sha256 and size, as the exporter records them
    assert "target/chat_template.jinja" in bundle.manifest["files"]
    assert bundle.manifest["target"]["size_bytes"] == sum(
        p.stat().st_size for p in (DEMO_BUNDLE / "target").iterdir() if p.is_file())


def test_the_training_script_writes_the_same_template_for_the_next_rebuild():
    sys.path.insert(0, str(DEMO_BUNDLE.parents[2] / "models"))
    try:
        import train_demo_pair
    finally:
        sys.path.pop(0)
    shipped = (DEMO_BUNDLE / "target" / "chat_template.jinja").read_text(encoding="utf-8")
    assert train_demo_pair.CHAT_TEMPLATE == shipped


@pytest.mark.slow
def test_chat_from_a_pipe_prints_only_the_answers(demo_pipe):
    """No bundle: the demo. One user turn per line (blank lines skipped), /reset starts over; stdout holds the
    answers and nothing else, each the pipeline's own answer to the conversation so far."""
    first, second = "Parse command line arguments.", "Read a config file."
    proc = run_cli("chat", "--max-new-tokens", str(TOKENS), input=f"{first}\n\n{second}\n/reset\n{second}\n",
                   timeout=300)
    assert proc.returncode == 0, proc.stderr
    together = expected_answers(demo_pipe, [first, second])
    alone = expected_answers(demo_pipe, [second])
    assert together[1] != alone[0]  # the second answer depends on the first turn: the test can tell
    assert proc.stdout == "".join(answer + "\n" for answer in together + alone)
    assert proc.stderr.count(" target pass") == 3 and ">" not in proc.stdout  # three statistics lines


@pytest.mark.slow
def test_chat_refuses_a_bundle_without_a_chat_template(bundle_dir):
    proc = run_cli("chat", str(bundle_dir(*SAME_VOCAB)), input="hello\n", timeout=300)
    assert proc.returncode == 1 and "has no chat template" in proc.stderr and "Traceback" not in proc.stderr


def _read_until(fd: int, needle: bytes, seen: bytearray, timeout: float = 180) -> None:
    """Read the terminal into `seen` until what was read since this call began holds `needle`."""
    deadline, start = time.monotonic() + timeout, len(seen)
    while needle not in seen[start:]:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            raise AssertionError(f"no {needle!r} on the terminal after {timeout} s; got {bytes(seen)!r}")
        seen += os.read(fd, 4096)


@pytest.mark.slow
@pytest.mark.parametrize("leave", ["ctrl-d", "ctrl-c"])
def test_chat_on_a_terminal_shows_a_prompt_streams_answers_and_exits_cleanly(leave):
    """On a pseudo-terminal: the greeting, the prompt marker, an answer, the marker again; then Ctrl-D (end of
    input) or Ctrl-C (SIGINT at the prompt) ends the chat with exit status 0 and no traceback."""
    main, terminal = os.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "edge_specdec.cli", "chat", "--max-new-tokens", str(TOKENS)],
                            stdin=terminal, stdout=terminal, stderr=subprocess.PIPE,
                            env={**os.environ, "EDGE_SPECDEC_CACHE_DIR": "off", "TERM": "dumb"},
                            preexec_fn=interruptible)
    os.close(terminal)
    seen = bytearray()
    try:
        _read_until(main, b"> ", seen)
        os.write(main, b"Parse command line arguments.\n")
        start = len(seen)
        _read_until(main, b"\n> ", seen)  # the answer, then the marker again on a line of its own
        assert len(seen) > start + len("Parse command line arguments.") + 4  # the echo and an answer
        if leave == "ctrl-d":
            os.write(main, b"\x04")  # the terminal's end of input
        else:
            # at the prompt: give the process a moment to be waiting in input(). A SIGINT in the instant between
            # readline printing "> " and it waiting for a key is kept until the next key (CPython's readline loop),
            # so on a loaded machine (two test workers) the chat sat there and this test timed out
            time.sleep(1)
            proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(main)
    assert proc.returncode == 0, err
    assert b"Traceback" not in err and b"/reset" in err  # the greeting names the commands
    assert b"tokens/s" in err  # the answer's statistics
