"""The server's sampling knobs (min_p, presence_penalty, frequency_penalty, logit_bias) in OpenAI's wire format, and
llama-server's /tokenize and /detokenize, on loopback."""
from __future__ import annotations

import http.client
import json

import pytest

from edge_specdec.runtime import Engine, GenerationConfig
from edge_specdec.runtime.text import PromptTokenizer
from edge_specdec.serve.protocol import RequestError, parse_detokenize, parse_request, parse_tokenize
from support import OTHER_VOCAB

KEY = "s3cret"


# --- request parsing --------------------------------------------------------------------------------------------

def test_the_knobs_reach_the_generation_config():
    body = {"prompt": "x", "min_p": 0.05, "presence_penalty": 1.5, "frequency_penalty": -0.5,
            "logit_bias": {"15": -100, "3": 2.5}}
    config = parse_request(body, "completion").config
    assert (config.min_p, config.presence_penalty, config.frequency_penalty) == (0.05, 1.5, -0.5)
    assert config.logit_bias == {15: -100.0, 3: 2.5}
    chat = parse_request({"messages": [{"role": "user", "content": "hi"}], "presence_penalty": 2}, "chat").config
    assert chat.presence_penalty == 2
    plain = parse_request({"prompt": "x", "presence_penalty": None, "logit_bias": None}, "completion").config
    assert (plain.min_p, plain.presence_penalty, plain.frequency_penalty, plain.logit_bias) == (0.0, 0.0, 0.0, {})


@pytest.mark.parametrize("field, value, words", [
    ("min_p", 1.5, "min_p must be at least 0.0 and at most 1.0"),
    ("min_p", -0.1, "min_p must be at least 0.0"),
    ("presence_penalty", 2.5, "presence_penalty must be at least -2.0 and at most 2.0, not 2.5"),
    ("frequency_penalty", -2.1, "frequency_penalty must be at least -2.0 and at most 2.0, not -2.1"),
    ("frequency_penalty", "1", "frequency_penalty must be a finite number"),
    ("logit_bias", [1], "logit_bias must be an object of token ids to numbers"),
    ("logit_bias", {"abc": 1}, "logit_bias keys must be token ids"),
    ("logit_bias", {"-1": 1}, "logit_bias keys must be token ids"),
    ("logit_bias", {"5": 101}, "logit_bias[5] must be a number from -100 to 100, not 101"),
    ("logit_bias", {"5": True}, "logit_bias[5] must be a number"),
    ("logit_bias", {"5": "1"}, "logit_bias[5] must be a number"),
])
def test_bad_knob_values_are_a_400_naming_the_field(field, value, words):
    with pytest.raises(RequestError) as caught:
        parse_request({"prompt": "x", field: value}, "completion")
    assert caught.value.status == 400 and caught.value.param == field and words in str(caught.value)


def test_tokenize_and_detokenize_bodies_are_checked():
    assert parse_tokenize({"content": "hi"}) == ("hi", False)  # add_special: false by default, as llama-server
    assert parse_tokenize({"content": "", "add_special": True}) == ("", True)
    assert parse_detokenize({"tokens": [0, 5]}, 10) == [0, 5]
    for call, body, param in ((parse_tokenize, {"content": 5}, "content"),
                              (parse_tokenize, {"content": "x", "add_special": "yes"}, "add_special"),
                              (parse_tokenize, {"content": "x", "with_pieces": True}, "with_pieces"),
                              (parse_detokenize, {"tokens": "1 2"}, "tokens"),
                              (parse_detokenize, {"tokens": [1, True]}, "tokens"),
                              (parse_detokenize, {"tokens": [10]}, "tokens")):
        with pytest.raises(RequestError) as caught:
            call(body, 10) if call is parse_detokenize else call(body)
        assert caught.value.status == 400 and caught.value.param == param


def test_add_special_leaves_out_the_bos_the_tokenizer_puts_first(bundle_dir):
    """The llama-style tokenizer puts a BOS before every text; without add_special the text's own ids remain."""
    from edge_specdec.bundle import load_bundle
    draft = load_bundle(bundle_dir(*OTHER_VOCAB)).draft
    tokenizer = PromptTokenizer(draft.tokenizer_xml)
    bos = draft.special_tokens["bos_token_id"]
    with_bos = tokenizer.encode("hello world")
    assert with_bos[0] == bos and len(with_bos) > 1
    assert tokenizer.encode("hello world", add_special=False) == with_bos[1:]
    assert tokenizer.encode("", add_special=False) == []


# --- on loopback ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def engine(bundle_dir):
    return Engine(bundle_dir(*OTHER_VOCAB))


@pytest.fixture(scope="module")
def server(engine):
    pytest.importorskip("uvicorn", reason="the server tests need the serve extra: pip install -e '.[test,serve]'")
    from edge_specdec.serve import ServerSettings
    from serve_helpers import serve_in_thread

    settings = ServerSettings(bundle=str(engine.bundle.path), slots=1, queue=4, warm_up=False, api_key=KEY)
    with serve_in_thread(settings, engine) as running:
        yield running


def call(running, path: str, body: dict, key: str | None = KEY, host: str | None = None):
    """POST a JSON body with exactly these headers: (status, JSON answer)."""
    port = int(running.url.rsplit(":", 1)[1])
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    data = json.dumps(body).encode()
    try:
        conn.putrequest("POST", path, skip_host=True, skip_accept_encoding=True)
        conn.putheader("Host", host or f"127.0.0.1:{port}")
        conn.putheader("Content-Type", "application/json")
        if key:
            conn.putheader("Authorization", f"Bearer {key}")
        conn.putheader("Content-Length", str(len(data)))
        conn.endheaders(data)
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


KNOBS = {"presence_penalty": 1.5, "frequency_penalty": 0.5, "min_p": 0.1, "logit_bias": {"40": 5.0}}


@pytest.mark.slow
def test_a_completion_with_the_knobs_is_the_target_alones(server, engine):
    """Speculative (auto: slem on this pair), with every knob on: the target alone's text and logprobs."""
    prompt = "def fib(n):\n    if n < 2:\n        return n\n"
    config = GenerationConfig(max_new_tokens=24, ignore_eos=True, logprobs=True, presence_penalty=1.5,
                              frequency_penalty=0.5, min_p=0.1, logit_bias={40: 5.0})
    session = engine.session()
    alone = session.generate(prompt, config, algorithm="none")
    plain = session.generate(prompt, GenerationConfig(max_new_tokens=24, ignore_eos=True), algorithm="none")
    assert alone.token_ids != plain.token_ids  # the knobs change this output
    status, answer = call(server, "/v1/completions", {"prompt": prompt, "max_tokens": 24, "temperature": 0,
                                                      "ignore_eos": True, "logprobs": 0, **KNOBS})
    assert status == 200, answer
    assert answer["choices"][0]["text"] == alone.text
    assert answer["choices"][0]["logprobs"]["token_logprobs"] == [lp.logprob for lp in alone.logprobs]
    assert answer["edge_specdec"]["algorithm"] == "slem"


@pytest.mark.slow
def test_a_logit_bias_for_a_token_the_target_lacks_is_a_400(server, engine):
    vocabulary = len(engine.vocab_map.target)
    status, answer = call(server, "/v1/completions", {"prompt": "x", "logit_bias": {str(vocabulary): 1}})
    assert status == 400 and answer["error"]["param"] == "logit_bias", answer
    assert f"token id {vocabulary}" in answer["error"]["message"]


@pytest.mark.slow
def test_tokenize_and_detokenize_as_llama_server(server, engine):
    text = "def fib(n):\n    return n  # é 😀"
    status, answer = call(server, "/tokenize", {"content": text})
    assert status == 200 and set(answer) == {"tokens"}, answer
    tokens = answer["tokens"]
    assert tokens == engine.tokenizer.encode(text, add_special=False) and len(tokens) > 5
    status, answer = call(server, "/detokenize", {"tokens": tokens})
    assert status == 200 and answer == {"content": text}
    status, answer = call(server, "/detokenize", {"tokens": [len(engine.vocab_map.target)]})
    assert status == 400 and answer["error"]["param"] == "tokens"


@pytest.mark.slow
def test_tokenize_and_detokenize_keep_the_key_and_host_checks(server):
    for path, body in (("/tokenize", {"content": "hi"}), ("/detokenize", {"tokens": [1]})):
        status, answer = call(server, path, body, key=None)
        assert status == 401 and answer["error"]["code"] == "invalid_api_key", answer
        status, answer = call(server, path, body, key="wrong")
        assert status == 401
        status, answer = call(server, path, body, host="evil.example")
        assert status == 403 and answer["error"]["code"] == "host_not_allowed", answer
