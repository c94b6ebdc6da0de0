"""What a user touches: device placement, concurrent drafting, streaming iterator, threads, chat, Ctrl-C."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from edge_specdec.errors import EdgeSpecdecError
from edge_specdec.runtime import GenerationConfig, Pipeline
from edge_specdec.runtime.chat import ChatTemplate
from edge_specdec.runtime.devices import DeviceError, DeviceInfo, compile_config, place
from hostile_text import HOSTILE_STRINGS
from test_runtime import ALPHA, N_SAMPLES, SAME_VOCAB, SAMPLING, first_tokens, homogeneity_pvalue

CPU = DeviceInfo("CPU")
IGPU = DeviceInfo("GPU.0", "integrated")
DGPU = DeviceInfo("GPU.1", "discrete")
NPU = DeviceInfo("NPU")
HETERO = ("qwen2-bytelevel", "llama-metaspace", "int8", "int8")
PROMPTS = [s for s in HOSTILE_STRINGS if s.strip()][:10] + ["def fib(n):\n    if n < 2:\n        return n\n",
                                                            "a b a b a b a b"]
CHAT = "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>\n{% endfor %}" \
       "{% if add_generation_prompt %}<assistant>{% endif %}"


# --- placement, against faked device lists -------------------------------------------------------------------

@pytest.mark.parametrize("devices,target,draft", [
    ([CPU], "CPU", "CPU"),                          # this machine
    ([CPU, IGPU], "CPU", "GPU.0"),                  # a laptop: the draft on the iGPU
    ([CPU, NPU], "CPU", "NPU"),                     # an AI PC without a usable iGPU
    ([CPU, IGPU, NPU], "CPU", "GPU.0"),             # the iGPU first, then the NPU
    ([CPU, DGPU], "GPU.1", "CPU"),                  # a discrete GPU takes the target
    ([CPU, IGPU, DGPU], "GPU.1", "GPU.0"),
])
def test_automatic_placement_follows_the_design(devices, target, draft):
    placement = place(devices, "AUTO", "AUTO")
    assert (placement.target, placement.draft) == (target, draft)
    assert placement.describe().startswith(f"target on {target}, draft on {draft} (")


def test_explicit_devices_are_honoured_and_named_exactly():
    assert (place([CPU, IGPU, NPU], "CPU", "NPU").draft) == "NPU"
    assert place([CPU, DeviceInfo("GPU", "integrated")], "CPU", "GPU.0").draft == "GPU"  # a lone GPU is "GPU"
    assert place([CPU, IGPU, DGPU], "gpu", "cpu").target == "GPU.0"  # case-insensitive; GPU = the first GPU
    assert place([CPU], "CPU", None).draft is None  # a target-only bundle


def test_absent_device_is_an_error_unless_fallback_is_allowed():
    with pytest.raises(DeviceError, match=r"NPU was asked for the draft, but this machine has only: CPU.*--allow-fallback"):
        place([CPU], "CPU", "NPU")
    placement = place([CPU], "GPU.1", "NPU", allow_fallback=True)
    assert (placement.target, placement.draft) == ("CPU", "CPU")
    assert "target: GPU.1 not found, fell back to CPU" in placement.describe()


@pytest.mark.parametrize("bad", ["TPU", "GPU.x", "CUDA:0", ""])
def test_unknown_device_names_are_refused(bad):
    with pytest.raises(DeviceError, match="unknown device"):
        place([CPU], bad, "CPU")


def test_device_configs(tmp_path):
    assert compile_config("GPU", None)["KV_CACHE_PRECISION"] == "f16"  # a GPU's per-block int8 cache is not exact
    assert "NPUW_LLM" not in compile_config("NPU", None)  # NPUW's properties depend on the model (test_npu.py)
    assert compile_config("GPU.0", tmp_path)["CACHE_DIR"] == str(tmp_path)
    assert compile_config("CPU", None, threads=1)["INFERENCE_NUM_THREADS"] == 1


def test_small_models_get_one_cpu_thread_unless_told(bundle_dir, monkeypatch):
    def threads(pipe):
        return [s.compiled.get_property("INFERENCE_NUM_THREADS") for s in (pipe.target, pipe.draft)]
    bundle = bundle_dir(*SAME_VOCAB)
    assert threads(Pipeline(bundle, cache_dir="off")) == [1, 1]  # the tiny test models are far under 32 MB
    assert threads(Pipeline(bundle, cache_dir="off", threads=2)) == [2, 2]
    monkeypatch.setattr("edge_specdec.runtime.pipeline.SMALL_MODEL_BYTES", 0)  # as if both were big
    if (os.cpu_count() or 1) > 1:
        assert 1 not in threads(Pipeline(bundle, cache_dir="off"))
    with pytest.raises(EdgeSpecdecError, match="threads must be at least 1"):
        Pipeline(bundle, threads=0)


def test_this_machine_runs_auto_on_the_cpu_and_caches_compiled_models(bundle_dir, tmp_path):
    pipe = Pipeline(bundle_dir(*SAME_VOCAB), cache_dir=tmp_path / "cache")
    assert (pipe.placement.target, pipe.placement.draft) == ("CPU", "CPU") and not pipe.concurrent
    assert any((tmp_path / "cache").iterdir())
    with pytest.raises(DeviceError, match="this machine has only"):
        Pipeline(bundle_dir(*SAME_VOCAB), draft_device="NPU")


# --- concurrent drafting -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def concurrent_pipes(bundle_dir):
    return {pair: (Pipeline(bundle_dir(*pair), concurrent=False), Pipeline(bundle_dir(*pair), concurrent=True))
            for pair in (SAME_VOCAB, HETERO)}


@pytest.mark.parametrize("pair,algorithm,k", [(SAME_VOCAB, "standard", 3), (SAME_VOCAB, "standard", 1),
                                              (HETERO, "slem", 3), (HETERO, "tli", 2), (HETERO, "slrs", 4)])
def test_concurrent_mode_is_token_identical_to_sequential(concurrent_pipes, pair, algorithm, k):
    sequential, concurrent = concurrent_pipes[pair]
    assert concurrent.concurrent and not sequential.concurrent
    used = 0
    for prompt in PROMPTS:
        config = GenerationConfig(max_new_tokens=24, ignore_eos=True)
        base = sequential.generate(prompt, config, algorithm="none")
        seq = sequential.generate(prompt, config, algorithm=algorithm, num_assistant_tokens=k, confidence=0.0)
        conc = concurrent.generate(prompt, config, algorithm=algorithm, num_assistant_tokens=k, confidence=0.0)
        assert conc.token_ids == seq.token_ids == base.token_ids, (algorithm, prompt)
        used += conc.stats.drafted_ahead_used
    if pair == SAME_VOCAB:  # the random different-vocabulary pair rarely agrees on a whole round
        assert used > 0, "no round ever used a proposal drafted during the previous target pass"


def test_concurrent_sampling_keeps_the_target_distribution(concurrent_pipes):
    sequential, concurrent = concurrent_pipes[SAME_VOCAB]
    base = first_tokens(sequential, "none", range(N_SAMPLES), SAMPLING, n_tokens=3)
    conc = first_tokens(concurrent, "standard", range(30_000, 30_000 + N_SAMPLES), SAMPLING, n_tokens=3)
    assert homogeneity_pvalue(base, conc) > ALPHA


# --- streaming, stopping, threads ----------------------------------------------------------------------------

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


# --- chat ----------------------------------------------------------------------------------------------------

def test_chat_prompt_uses_the_template(pipe):
    pipe.__dict__["chat_template"] = ChatTemplate(CHAT)
    try:
        ids = pipe.chat_prompt([{"role": "user", "content": "hi there"}])
        assert ids == pipe.tokenizer.encode("<user>hi there</user>\n<assistant>")
    finally:
        del pipe.__dict__["chat_template"]


def test_chat_without_template_is_a_clear_error(pipe):
    assert pipe.chat_template is None
    with pytest.raises(EdgeSpecdecError, match="has no chat template"):
        pipe.chat_prompt([{"role": "user", "content": "hi"}])


def run_cli(*args, **kwargs):
    env = {**os.environ, "EDGE_SPECDEC_CACHE_DIR": "off"}
    return subprocess.run([sys.executable, "-m", "edge_specdec.cli", "run", *args], capture_output=True, text=True,
                          env=env, **kwargs)


def test_cli_chat_session_over_stdin(bundle_dir, tmp_path):
    bundle = tmp_path / "bundle"
    shutil.copytree(bundle_dir(*SAME_VOCAB), bundle)
    (bundle / "target" / "chat_template.jinja").write_text(CHAT)
    proc = run_cli(str(bundle), "--chat", "--max-new-tokens", "6", input="hello\nand again\n\n")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("tokens/s") == 2 and "target on CPU, draft on CPU" in proc.stderr
    single = run_cli(str(bundle), "--chat", "--prompt", "hello", "--max-new-tokens", "6", "--json")
    assert single.returncode == 0, single.stderr
    no_template = run_cli(str(bundle_dir(*SAME_VOCAB)), "--chat", input="hello\n")
    assert no_template.returncode == 1 and "has no chat template" in no_template.stderr


@pytest.mark.parametrize("args,message", [
    (["--target-device", "TPU"], "unknown device 'TPU'"),
    (["--draft-device", "NPU"], "NPU was asked for the draft, but this machine has only"),
    (["--prompt-file", "/no/such/prompt.txt"], "cannot read --prompt-file"),
    (["--compare", "--algorithm", "none"], "--compare measures speculative decoding against the target alone"),
    (["--threads", "0"], "threads must be at least 1"),
])
def test_cli_run_bad_inputs_are_one_clear_line(bundle_dir, args, message):
    proc = run_cli(str(bundle_dir(*SAME_VOCAB)), *(["--prompt", "hi"] if "--prompt-file" not in args else []), *args)
    assert proc.returncode == 1 and message in proc.stderr and "Traceback" not in proc.stderr


def test_cli_compare_runs_the_target_alone_and_reports_the_speedup(bundle_dir):
    args = [str(bundle_dir(*SAME_VOCAB)), "--prompt", "def f(x):", "--max-new-tokens", "12", "--ignore-eos", "--compare"]
    proc = run_cli(*args)
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stderr.splitlines() if x.startswith("compare:"))
    assert "x that; output identical to the target alone" in line, line
    report = json.loads(run_cli(*args, "--json").stdout)
    alone = json.loads(run_cli(*args[:-1], "--algorithm", "none", "--json").stdout)
    assert report["compare"]["identical"] is True and report["token_ids"] == alone["token_ids"]
    assert report["compare"]["speedup"] == pytest.approx(
        report["stats"]["tokens_per_s"] / report["compare"]["target_alone_tokens_per_s"], rel=1e-2)
    sampled = json.loads(run_cli(*args, "--temperature", "0.8", "--seed", "3", "--json").stdout)
    assert sampled["compare"]["identical"] is None  # sampling: no claim of identical text
    chat = run_cli(str(bundle_dir(*SAME_VOCAB)), "--chat", "--compare", input="hi\n")
    assert chat.returncode == 1 and "--compare needs one prompt" in chat.stderr


def test_cli_fallback_says_what_ran_where(bundle_dir):
    proc = run_cli(str(bundle_dir(*SAME_VOCAB)), "--prompt", "hi", "--max-new-tokens", "4", "--draft-device",
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
                            env={**os.environ, "EDGE_SPECDEC_CACHE_DIR": "off"})
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
    stats = re.search(r"^\[none\] (\d+) tokens in .*; stop: interrupted$", err, re.MULTILINE)
    assert stats and int(stats.group(1)) < 400, err  # the statistics line, for the tokens written before Ctrl-C
