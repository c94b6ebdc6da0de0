"""`edge-specdec run` in a subprocess: bad inputs in one line, --compare against the target alone, the device
fallback it reports, and Ctrl-C with exit code 130 and the statistics."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from support import SAME_VOCAB, interruptible, run_cli

pytestmark = pytest.mark.slow  # starts a server or a process: see pyproject.toml


@pytest.mark.parametrize("args,message", [
    (["--target-device", "TPU"], "unknown device 'TPU'"),
    (["--draft-device", "NPU"], "NPU was asked for the draft, but this machine has only"),
    (["--prompt-file", "/no/such/prompt.txt"], "cannot read --prompt-file"),
    (["--compare", "--algorithm", "none"], "--compare measures speculative decoding against the target alone"),
    (["--threads", "0"], "threads must be at least 1"),
])
def test_cli_run_bad_inputs_are_one_clear_line(bundle_dir, args, message):
    prompt = ["--prompt", "hi"] if "--prompt-file" not in args else []
    proc = run_cli("run", str(bundle_dir(*SAME_VOCAB)), *prompt, *args)
    assert proc.returncode == 1 and message in proc.stderr and "Traceback" not in proc.stderr


def test_cli_compare_runs_the_target_alone_and_reports_the_speedup(bundle_dir):
    args = ["run", str(bundle_dir(*SAME_VOCAB)), "--prompt", "def f(x):", "--max-new-tokens", "12", "--ignore-eos",
            "--compare"]
    proc = run_cli(*args)
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stderr.splitlines() if x.startswith("compare:"))
    # a ratio where it drafted (which may be within the noise band), else the target alone throughout
    assert re.search(r"; (standard \d+\.\d\dx that|standard: no measurable difference \(within \+-\d+ %\)|the "
                     r"target alone throughout: drafting loses on this machine); output identical to the target "
                     r"alone$", line), line
    report = json.loads(run_cli(*args, "--json").stdout)
    alone = json.loads(run_cli(*args[:-1], "--algorithm", "none", "--json").stdout)
    assert report["compare"]["identical"] is True and report["token_ids"] == alone["token_ids"]
    assert report["compare"]["speedup"] == pytest.approx(
        report["stats"]["tokens_per_s"] / report["compare"]["target_alone_tokens_per_s"], rel=1e-2)
    sampled = json.loads(run_cli(*args, "--temperature", "0.8", "--seed", "3", "--json").stdout)
    assert sampled["compare"]["identical"] is None  # sampling: no claim of identical text
    chat = run_cli("run", str(bundle_dir(*SAME_VOCAB)), "--chat", "--compare", input="hi\n")
    assert chat.returncode == 1 and "--compare needs one prompt" in chat.stderr


def test_cli_fallback_says_what_ran_where(bundle_dir):
    proc = run_cli("run", str(bundle_dir(*SAME_VOCAB)), "--prompt", "hi", "--max-new-tokens", "4", "--draft-device",
                   "NPU", "--allow-fallback")
    assert proc.returncode == 0, proc.stderr
    assert "draft: NPU not found, fell back to CPU" in proc.stderr


def test_cli_ctrl_c_stops_cleanly_and_prints_the_statistics(bundle_dir):
    """Ctrl-C during `run`: exit code 130, the statistics line with "stop: interrupted", no traceback.

    The generation waits for the test, not the other way round: the CLI runs under a wrapper whose stdout, once
    the first text is written and flushed, sleeps (at most 120 s) in that write, which the CLI's streaming
    callback makes. The test reads that first text, then sends SIGINT; Python's default handler raises
    KeyboardInterrupt in the sleeping write, inside the callback, so what is tested is the CLI's and generate()'s
    own handling of it. Nothing is left to the machine's speed: however fast the model, the generation cannot
    get past its first text piece before the signal comes. (Before, the test slept 0.05 s after the first byte; a
    machine that wrote all 400 tokens in 0.12 s exited 0 before the signal.)

    It cannot pass if the generation finished before the signal: the run would then end with "stop: length",
    all 400 tokens and exit code 0 (a signal to a finished process changes nothing), and each of the three
    asserts below fails. The 1 s pause before the signal makes that visible: the whole run takes about 0.2 s
    here, so without the wait in the wrapper it would be over by then.
    """
    import re

    wrapper = (
        "import sys, time\n"
        "from edge_specdec.cli import main\n"
        "class FirstTextWaits:\n"
        "    def __init__(self, real):\n"
        "        self.real, self.waited = real, False\n"
        "    def write(self, text):\n"
        "        n = self.real.write(text)\n"
        "        self.real.flush()\n"
        "        if text and not self.waited:\n"
        "            self.waited = True\n"
        "            time.sleep(120)  # the test's SIGINT ends this with KeyboardInterrupt\n"
        "        return n\n"
        "    def __getattr__(self, name):\n"
        "        return getattr(self.real, name)\n"
        "sys.stdout = FirstTextWaits(sys.stdout)\n"
        "sys.exit(main(sys.argv[1:]))\n")
    proc = subprocess.Popen([sys.executable, "-c", wrapper, "run", str(bundle_dir(*SAME_VOCAB)), "--prompt",
                             "def f(x):", "--max-new-tokens", "400", "--ignore-eos", "--algorithm", "none"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "EDGE_SPECDEC_CACHE_DIR": "off"}, preexec_fn=interruptible)
    try:
        first = proc.stdout.read(1)  # generation has started, and now waits in the wrapper's write
        time.sleep(1.0)  # longer than the whole run takes here: a finished run would fail the asserts
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert first and proc.returncode == 130, err
    assert "stop: interrupted" in err and "Traceback" not in err
    stats = re.search(r"^\[none\] (\d+) tokens? in .*; stop: interrupted$", err, re.MULTILINE)
    assert stats and int(stats.group(1)) < 400, err  # the statistics line, for the tokens written before Ctrl-C
