"""`edge-specdec serve` against what a hostile client or web page sends, on loopback: raw HTTP (http.client,
sockets) for what a browser or an attacker can forge (Host, Origin, content types, bodies cut short, bodies that
are not quite JSON), OpenAI's client for what normal use looks like. Every server here stops at the end of its
module; each test sends a bounded number of requests."""
from __future__ import annotations

import http.client
import json
import logging
import socket
import time

import pytest

openai = pytest.importorskip("openai", reason="the server tests need the test extra: pip install -e '.[test,serve]'")
pytest.importorskip("uvicorn", reason="the server tests need the serve extra: pip install -e '.[test,serve]'")

from edge_specdec.cli import main  # noqa: E402
from edge_specdec.demo import DEMO_BUNDLE  # noqa: E402
from edge_specdec.runtime import Engine  # noqa: E402
from edge_specdec.serve import ServerSettings  # noqa: E402
from serve_helpers import serve_in_thread  # noqa: E402

pytestmark = pytest.mark.slow

KEY = "s3cret"
COMPLETION = {"prompt": "def f(x):", "max_tokens": 2, "temperature": 0}


@pytest.fixture(scope="module")
def engine():
    return Engine(DEMO_BUNDLE)


@pytest.fixture(scope="module")
def server(engine):
    with serve_in_thread(ServerSettings(slots=1, queue=4, warm_up=False), engine) as running:
        yield running


@pytest.fixture(scope="module")
def keyed(engine):
    """A server with an API key and one CORS origin, as behind a web app."""
    settings = ServerSettings(slots=1, queue=4, warm_up=False, api_key=KEY, cors=["http://app.test"])
    with serve_in_thread(settings, engine) as running:
        yield running


def port(running) -> int:
    return int(running.url.rsplit(":", 1)[1])


def raw(running, method: str, path: str, body: bytes = b"", headers: dict | None = None, host: str | None = None):
    """One request with exactly these headers (Host too: `host`, default the address the server listens on):
    (status, headers, JSON answer or the raw body)."""
    conn = http.client.HTTPConnection("127.0.0.1", port(running), timeout=60)
    try:
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        conn.putheader("Host", f"127.0.0.1:{port(running)}" if host is None else host)
        for name, value in (headers or {}).items():
            conn.putheader(name, value)
        if body or method == "POST":
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body or None)
        response = conn.getresponse()
        data = response.read()
        try:
            data = json.loads(data)
        except ValueError:
            pass
        return response.status, response.headers, data
    finally:
        conn.close()


def post_json(running, body: bytes, path: str = "/v1/completions", **headers):
    return raw(running, "POST", path, body, {"Content-Type": "application/json", **headers})


def metric(running, name: str, **labels) -> float:
    text = raw(running, "GET", "/metrics")[2]
    wanted = "edge_specdec_" + name + ("{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"
                                       if labels else "")
    values = [float(line.split()[-1]) for line in text.decode().splitlines() if line.split(" ")[0] == wanted]
    return values[0] if values else 0.0


def still_serves(running) -> None:
    client = openai.OpenAI(base_url=running.api, api_key=KEY, max_retries=0, timeout=120)
    assert client.completions.create(model="demo", prompt="x = ", max_tokens=2).usage.completion_tokens >= 1


# --- item 2: numbers that are not numbers ---------------------------------------------------------------------------

@pytest.mark.parametrize("body, words", [
    (b'{"prompt": "x", "temperature": NaN}', "NaN, which is not a JSON number"),
    (b'{"prompt": "x", "temperature": Infinity}', "Infinity, which is not a JSON number"),
    (b'{"prompt": "x", "repetition_penalty": -Infinity}', "-Infinity, which is not a JSON number"),
    (b'{"prompt": "x", "top_p": 1e400}', "1e400 in the request body is out of range"),
    (b'{"prompt": "x", "edge_specdec": {"confidence": NaN}}', "NaN, which is not a JSON number"),
    (b'{"prompt": "x", "temperature": 1e-310, "logprobs": 2}', "temperature must be 0 (greedy) or between"),
    (b'{"prompt": "x", "repetition_penalty": 1e-300, "logprobs": 2}', "repetition_penalty must be between"),
])
def test_non_finite_and_denormal_settings_are_400(server, body, words):
    status, _, answer = post_json(server, body)
    assert status == 400 and words in answer["error"]["message"], answer


# --- item 3: text that is not text, JSON that is too deep ---------------------------------------------------------

@pytest.mark.parametrize("body, param", [
    (b'{"prompt": "abc\\ud800", "max_tokens": 2}', "prompt"),
    (b'{"prompt": "x", "stop": ["\\udfff"], "max_tokens": 2}', "stop"),
    (b'{"prompt": "x", "\\ud800": 1}', None),
])
def test_lone_surrogates_are_400(server, body, param):
    status, _, answer = post_json(server, body)
    assert status == 400 and "lone surrogate" in answer["error"]["message"], answer
    assert answer["error"]["param"] == param
    status, _, answer = post_json(server, b'{"messages": [{"role": "user", "content": "\\ud800"}]}',
                                  "/v1/chat/completions")
    assert status == 400 and "messages[0].content holds a lone surrogate" in answer["error"]["message"], answer
    still_serves(server)


def test_a_body_nested_5000_deep_is_400(server):
    for body in (b"[" * 5000 + b"]" * 5000, b'{"prompt": ' + b'{"a": ' * 5000 + b"1" + b"}" * 5001,
                 b'{"prompt": "x", "logit_bias": ' + b"[" * 950 + b"]" * 950 + b"}"):
        status, _, answer = post_json(server, body)
        assert status == 400 and "nests too deeply" in answer["error"]["message"], answer
    still_serves(server)


# --- item 7: cross-site requests -----------------------------------------------------------------------------------

@pytest.mark.parametrize("host", ["evil.example", "evil.example:{port}", "127.0.0.1.evil.example:{port}", ":{port}",
                                  "", "localhost.evil.example"])
def test_a_host_name_the_server_does_not_serve_is_refused(server, host):
    """DNS rebinding: the attacker's page reaches 127.0.0.1 under its own name, same-origin; the Host says so."""
    before = metric(server, "generation_tokens_total")
    for method, path, body in (("POST", "/v1/completions", json.dumps(COMPLETION).encode()),
                               ("GET", "/v1/models", b""), ("GET", "/", b"")):
        status, _, answer = raw(server, method, path, body, {"Content-Type": "application/json"},
                                host=host.format(port=port(server)))
        assert status == 403 and answer["error"]["code"] == "host_not_allowed", answer
    assert metric(server, "generation_tokens_total") == before


@pytest.mark.parametrize("host", ["localhost:{port}", "LOCALHOST:{port}", "app.localhost:{port}", "[::1]:{port}",
                                  "127.0.0.1", "192.168.1.20:{port}"])
def test_the_names_the_server_answers_to(server, host):
    status, _, answer = raw(server, "GET", "/v1/models", host=host.format(port=port(server)))
    assert status == 200 and answer["data"][0]["id"] == "demo_bundle", answer


def test_allowed_hosts_add_names(engine):
    """`serve --allowed-host mybox.lan`: the machine's own name on the LAN, or the name a proxy forwards."""
    with serve_in_thread(ServerSettings(slots=1, warm_up=False, allowed_hosts=["mybox.lan"]), engine) as running:
        assert raw(running, "GET", "/v1/models", host=f"mybox.lan:{port(running)}")[0] == 200
        assert raw(running, "GET", "/v1/models", host=f"other.lan:{port(running)}")[0] == 403


@pytest.mark.parametrize("origin", ["http://evil.example", "null", "http://127.0.0.1:1", "https://app.test"])
def test_a_cross_site_request_is_refused_before_it_generates(server, origin):
    """The forms a page can send without a preflight, with the Origin the browser adds: none generates."""
    before = metric(server, "generation_tokens_total")
    for content_type in ("text/plain", "application/x-www-form-urlencoded", "application/json"):
        status, _, answer = raw(server, "POST", "/v1/completions", json.dumps(COMPLETION).encode(),
                                {"Content-Type": content_type, "Origin": origin})
        assert status == 403 and answer["error"]["code"] == "origin_not_allowed", answer
    status, _, answer = raw(server, "GET", "/v1/models", headers={"Origin": origin})
    assert status == 403
    assert metric(server, "generation_tokens_total") == before


@pytest.mark.parametrize("content_type", ["text/plain", "text/plain;charset=UTF-8", "multipart/form-data; boundary=x",
                                          "application/x-www-form-urlencoded", None])
def test_only_json_bodies_are_taken(server, content_type):
    headers = {"Content-Type": content_type} if content_type else {}
    status, _, answer = raw(server, "POST", "/v1/completions", json.dumps(COMPLETION).encode(), headers)
    assert status == 415 and "application/json" in answer["error"]["message"], answer
    status, _, answer = post_json(server, json.dumps(COMPLETION).encode(),
                                  **{"Content-Type": "Application/JSON; charset=utf-8"})
    assert status == 200 and answer["choices"], answer


def test_the_page_keeps_working(server):
    """The page at / is same-origin: its GETs carry no Origin, its POSTs its own; both are served."""
    origin = f"http://127.0.0.1:{port(server)}"
    status, _, page = raw(server, "GET", "/")
    assert status == 200 and b"<html" in page.lower()
    status, _, script = raw(server, "GET", "/static/app.js")
    assert status == 200 and b"application/json" in script  # the page posts JSON
    assert raw(server, "GET", "/v1/models")[0] == 200
    status, _, answer = post_json(server, json.dumps({**COMPLETION, "stream": True}).encode(), Origin=origin,
                                  **{"Sec-Fetch-Site": "same-origin"})
    assert status == 200 and answer.endswith(b"data: [DONE]\n\n")
    status, _, answer = raw(server, "POST", "/v1/completions", json.dumps(COMPLETION).encode(),
                            {"Content-Type": "application/json", "Origin": f"http://localhost:{port(server)}"},
                            host=f"localhost:{port(server)}")
    assert status == 200, answer


def test_a_cors_origin_is_served_and_others_are_not(keyed):
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    status, got, _ = raw(keyed, "POST", "/v1/completions", json.dumps(COMPLETION).encode(),
                         {**headers, "Origin": "http://app.test"})
    assert status == 200 and got["access-control-allow-origin"] == "http://app.test"
    status, got, answer = raw(keyed, "POST", "/v1/completions", json.dumps(COMPLETION).encode(),
                              {**headers, "Origin": "http://evil.test"})
    assert status == 403 and "access-control-allow-origin" not in {k.lower() for k in got}


# --- item 8: metrics and model names ------------------------------------------------------------------------------

def test_metrics_do_not_grow_with_the_paths_clients_choose(server):
    for i in range(20):
        status, _, answer = raw(server, "GET", f"/v1/models/made-up-{i}")
        assert status == 404 and answer["error"]["code"] == "model_not_found"
    text = raw(server, "GET", "/metrics")[2].decode()
    assert "made-up" not in text and "/v1/" not in text
    assert metric(server, "requests_total", endpoint="model", outcome="client_error") >= 20


def test_a_completion_for_another_model_name_is_answered_by_the_served_model(server):
    """One rule, as llama-server's: chat and completions take any model name (a one-model server has nothing to
    choose) and say in `model` which model answered; GET /v1/models/{id} looks the id up and 404s other ids."""
    client = openai.OpenAI(base_url=server.api, api_key="none", max_retries=0, timeout=120)
    out = client.completions.create(model="gpt-4o", prompt="x = ", max_tokens=2)
    assert out.model == "demo_bundle"
    assert client.models.retrieve("demo_bundle").id == "demo_bundle"
    with pytest.raises(openai.NotFoundError, match="does not exist here"):
        client.models.retrieve("gpt-4o")


# --- item 9: a client that leaves mid-upload -----------------------------------------------------------------------

def test_a_client_that_leaves_mid_upload_is_cancelled_not_a_server_error(server, caplog):
    before = {o: metric(server, "requests_total", endpoint="completion", outcome=o)
              for o in ("cancelled", "server_error")}
    with caplog.at_level(logging.INFO):
        sock = socket.create_connection(("127.0.0.1", port(server)))
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 20000\r\n\r\n" + b'{"prompt": "' + b"x" * 500)
        time.sleep(0.3)  # the server is reading the body
        sock.close()
        deadline = time.monotonic() + 30
        while metric(server, "requests_total", endpoint="completion", outcome="cancelled") <= before["cancelled"]:
            assert time.monotonic() < deadline, "the dropped upload was not counted as cancelled"
            time.sleep(0.05)
    assert metric(server, "requests_total", endpoint="completion", outcome="server_error") == before["server_error"]
    assert not [r for r in caplog.records if r.name.startswith("edge_specdec") and r.levelno >= logging.WARNING]
    assert "Traceback" not in caplog.text
    still_serves(server)


# --- connections that send nothing, or a body that stalls -----------------------------------------------------------

def closed_within(sock: socket.socket, seconds: float) -> bytes:
    """What the server sent before it closed the connection; fails if it is still open after `seconds`."""
    sock.settimeout(seconds)
    received = b""
    try:
        while chunk := sock.recv(4096):
            received += chunk
    except socket.timeout:
        pytest.fail(f"the connection was still open after {seconds} s (received {received[:80]!r})")
    return received


def test_idle_connections_and_stalled_bodies_are_timed_out_and_counted(engine):
    settings = ServerSettings(slots=1, queue=4, warm_up=False, idle_timeout=1.0, body_timeout=1.0)
    with serve_in_thread(settings, engine) as running:
        address = ("127.0.0.1", port(running))
        head = (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                b"Content-Length: 2000\r\n\r\n")
        silent = [socket.create_connection(address) for _ in range(4)]
        stalled = [socket.create_connection(address) for _ in range(4)]
        for sock in stalled:
            sock.sendall(head + b'{"prompt": "' + b"x" * 100)
        trickling = socket.create_connection(address)
        start = time.monotonic()
        for byte in head[:40]:  # a head a byte at a time: never whole
            try:
                trickling.sendall(bytes([byte]))
            except OSError:  # closed by the server: what the test wants
                break
            time.sleep(0.1)
        elapsed = time.monotonic() - start
        assert closed_within(trickling, 10) == b"" and elapsed < 3, elapsed
        for sock in silent:
            assert closed_within(sock, 10) == b""
        for sock in stalled:
            answer = closed_within(sock, 10)
            assert answer.startswith(b"HTTP/1.1 408") and b"--body-timeout" in answer, answer[:300]
        for sock in silent + stalled + [trickling]:
            sock.close()
        assert metric(running, "connections_timed_out_total", phase="idle") == 5
        assert metric(running, "connections_timed_out_total", phase="body") == 4
        status, _, answer = post_json(running, json.dumps(COMPLETION).encode())  # a whole request is served
        assert status == 200, answer


def test_serve_help_shows_the_timeouts(capsys):
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--idle-timeout S" in text and "(default 15)" in text
    assert "--body-timeout S" in text and "(default 30)" in text and "--max-body-bytes B" in text


@pytest.mark.parametrize("field", ["idle_timeout", "body_timeout"])
@pytest.mark.parametrize("value", [0, -1, float("inf"), float("nan")])
def test_a_timeout_must_be_some_seconds(field, value):
    from edge_specdec.errors import EdgeSpecdecError
    with pytest.raises(EdgeSpecdecError, match=f"--{field.replace('_', '-')} must be a number of seconds"):
        ServerSettings(**{field: value}).check()


# --- item 10: the key's scheme, its comparison, the port -----------------------------------------------------------

@pytest.mark.parametrize("header, status", [(f"Bearer {KEY}", 200), (f"bearer {KEY}", 200), (f"BEARER  {KEY}", 200),
                                            (f"Bearer {KEY}x", 401), (f"Basic {KEY}", 401), (KEY, 401),
                                            ("Bearer " + "\u00e9", 401)])
def test_the_bearer_scheme_is_case_insensitive(keyed, header, status):
    got, _, answer = raw(keyed, "POST", "/v1/completions", json.dumps(COMPLETION).encode(),
                         {"Content-Type": "application/json", "Authorization": header})
    assert got == status, answer


def test_the_key_is_compared_in_constant_time(keyed, monkeypatch):
    import hmac

    import edge_specdec.serve.app as app

    calls, real = [], hmac.compare_digest
    monkeypatch.setattr(app.hmac, "compare_digest", lambda a, b: calls.append((a, b)) or real(a, b))
    status, _, _ = raw(keyed, "GET", "/v1/models", headers={"Authorization": "Bearer guess"})
    assert status == 401 and calls == [(b"guess", KEY.encode())]


@pytest.mark.parametrize("value", ["70000", "-1", "http"])
def test_serve_refuses_a_port_that_is_none_in_one_line(value, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--port", value])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "argument --port:" in err and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("edge-specdec serve: error: argument --port:")
