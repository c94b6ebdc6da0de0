"""The server's slots keep their caches: a request goes to the free slot whose cache shares the longest prefix with
its prompt, prefills only the rest, writes what a fresh session writes, and says how many tokens were cached
(OpenAI's usage.prompt_tokens_details.cached_tokens). On loopback; every server stops by itself."""
from __future__ import annotations

import urllib.request

import pytest

openai = pytest.importorskip("openai", reason="the server tests need the test extra: pip install -e '.[test,serve]'")
pytest.importorskip("uvicorn", reason="the server tests need the serve extra: pip install -e '.[test,serve]'")

from edge_specdec.runtime import Engine, GenerationConfig  # noqa: E402
from edge_specdec.serve import ServerSettings  # noqa: E402
from serve_helpers import chat_bundle_copy, serve_in_thread  # noqa: E402

pytestmark = pytest.mark.slow
OTHER_VOCAB = ("qwen2-bytelevel", "llama-metaspace")
A = "def parse_args(argv):\n    \"\"\"Read the options.\"\"\"\n"
B = "class Tree:\n    def __init__(self, children):\n"


@pytest.fixture(scope="module")
def chat_bundle(bundle_dir, tmp_path_factory):
    """A tiny different-vocabulary pair whose target has a chat template."""
    return chat_bundle_copy(bundle_dir(*OTHER_VOCAB), tmp_path_factory.mktemp("serve-prefix"))


@pytest.fixture(scope="module")
def engine(chat_bundle):
    return Engine(chat_bundle, batching=True)


def client(running) -> "openai.OpenAI":
    return openai.OpenAI(base_url=running.api, api_key="none", max_retries=0, timeout=120)


def complete(c, prompt: str):
    return c.completions.create(model="x", prompt=prompt, max_tokens=8, temperature=0,
                                extra_body={"ignore_eos": True})


def metric(running, name: str) -> float:
    with urllib.request.urlopen(running.url + "/metrics", timeout=10) as response:
        lines = response.read().decode().splitlines()
    return next((float(line.split()[-1]) for line in lines if line.split(" ")[0] == "edge_specdec_" + name), 0.0)


def test_a_request_goes_to_the_slot_that_holds_its_prefix(chat_bundle, engine):
    """Two conversations on two slots: each follow-up finds its own earlier request's cache, whichever slot was
    free the longest."""
    with serve_in_thread(ServerSettings(bundle=str(chat_bundle), slots=2, queue=4), engine) as running:
        c = client(running)
        first_a, first_b = complete(c, A), complete(c, B)
        assert first_a.usage.prompt_tokens_details.cached_tokens == 0
        reused_before = metric(running, "prompt_tokens_reused_total")
        for prompt, first in ((B, first_b), (A, first_a)):
            follow = prompt + first.choices[0].text + "\n    return None\n"
            out = complete(c, follow)
            cached = out.usage.prompt_tokens_details.cached_tokens
            assert cached >= len(engine.tokenizer.encode(prompt)) - 1, prompt
            fresh = engine.session().generate(follow, GenerationConfig(max_new_tokens=8, ignore_eos=True))
            assert out.choices[0].text == fresh.text
        assert metric(running, "prompt_tokens_reused_total") > reused_before
        assert metric(running, "slot_prefix_hits_total") >= 2


def test_a_chat_turn_reuses_the_conversation(chat_bundle, engine):
    with serve_in_thread(ServerSettings(bundle=str(chat_bundle), slots=1, queue=4), engine) as running:
        c = client(running)
        messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "write a loop"}]
        first = c.chat.completions.create(model="x", messages=messages, max_tokens=10, temperature=0)
        messages += [{"role": "assistant", "content": first.choices[0].message.content},
                     {"role": "user", "content": "now in reverse"}]
        second = c.chat.completions.create(model="x", messages=messages, max_tokens=10, temperature=0, stream=True,
                                           stream_options={"include_usage": True})
        chunks = list(second)
        usage = chunks[-1].usage
        assert usage.prompt_tokens_details.cached_tokens > len(engine.chat_prompt(messages[:2])) - 1
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        assert text == engine.session().generate(engine.chat_prompt(messages), GenerationConfig(max_new_tokens=10)).text


def test_no_prefix_reuse_prefills_every_prompt(chat_bundle):
    engine = Engine(chat_bundle, prefix_reuse=False)
    with serve_in_thread(ServerSettings(bundle=str(chat_bundle), slots=1, queue=4), engine) as running:
        c = client(running)
        complete(c, A)
        assert complete(c, A).usage.prompt_tokens_details.cached_tokens == 0
        assert metric(running, "prompt_tokens_reused_total") == 0
        assert metric(running, "prompt_tokens_prefilled_total") == 2 * len(engine.tokenizer.encode(A))
