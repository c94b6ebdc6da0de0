"""`edge-specdec serve` as a Ray Serve deployment with 2 replicas on a local Ray instance (loopback only), driven
with OpenAI's client: greedy outputs equal the target's own, streamed and not, and both replicas answer.

Opt-in: EDGE_SPECDEC_RAY_TESTS=1, in an environment with ray[serve] and openai (Ray is not a dependency of the
project: pip install "edge-specdec[serve]" "ray[serve]" openai pytest). Starting Ray takes some seconds.
"""
from __future__ import annotations

import os
import socket
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

if os.environ.get("EDGE_SPECDEC_RAY_TESTS") != "1":
    pytest.skip("Ray Serve tests are opt-in: set EDGE_SPECDEC_RAY_TESTS=1 (needs ray[serve] and openai installed)",
                allow_module_level=True)
# Before Ray is imported (it reads this once): on Linux, Ray replaces a node address of 127.0.0.1 with the
# machine's outward address unless this says "no cluster" (ray/_private/services.py, get_node_ip_address); with
# it, Ray's GCS, raylet, workers and Serve's proxy listen on 127.0.0.1. Each Serve replica still opens its
# inter-deployment gRPC server on [::]:0 (hard-coded in Ray 2.60's replica.py); nothing here talks to it.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
ray = pytest.importorskip("ray", reason='Ray is not installed here: pip install "ray[serve]" to run these tests')
serve = pytest.importorskip("ray.serve", reason='Ray Serve is not installed here: pip install "ray[serve]"')
openai = pytest.importorskip("openai", reason="the openai client is not installed here: pip install openai")

from edge_specdec.demo import DEMO_BUNDLE  # noqa: E402
from edge_specdec.runtime import GenerationConfig, Pipeline  # noqa: E402
from edge_specdec.serve import ServerSettings  # noqa: E402
from edge_specdec.serve.ray_app import REPLICA_HEADER, deployment  # noqa: E402

pytestmark = pytest.mark.slow  # starts Ray and a server: see pyproject.toml

APP = "edge-specdec"
REPLICAS = 2
START_TIMEOUT = 300  # seconds for Ray to start and both replicas to load (a busy 2-core machine)
REQUEST_TIMEOUT = 120  # seconds for one completion
MAX_TOKENS = 32
PROMPTS = ["def parse_args(", "import numpy as np\n", "class Stack:\n    def __init__(self):", "# read a file\n"]
REQUESTS, THREADS = 16, 4


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def health(url: str) -> tuple[int, str]:
    """GET /health: (status, the replica header)."""
    try:
        with urllib.request.urlopen(url + "/health", timeout=10) as response:
            return response.status, response.headers.get(REPLICA_HEADER, "")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get(REPLICA_HEADER, "")


def bounded(work, timeout: float, what: str):
    """Run work() in a thread and return its result; fail the test if it has not returned within timeout."""
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["value"] = work()
        except BaseException as exc:  # handed to the test's thread
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        pytest.fail(f"{what} did not finish within {timeout} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


@pytest.fixture(scope="module")
def ray_app():
    """A local Ray instance on 127.0.0.1 with Serve's HTTP proxy on a free loopback port, running the demo
    bundle as 2 replicas of 1 slot each; shut down at the end. Also records /health right after deployment."""
    port = free_port()
    with pytest.MonkeyPatch.context() as env:
        env.setenv("RAY_USAGE_STATS_ENABLED", "0")  # no usage report (and no attempt to reach the network)
        # address="local": a new instance of our own, never one already running on this machine
        ray.init(address="local", num_cpus=REPLICAS, include_dashboard=False, _node_ip_address="127.0.0.1",
                 log_to_driver=False)
        assert ray.util.get_node_ip_address() == "127.0.0.1"
        try:
            serve.start(http_options={"host": "127.0.0.1", "port": port}, proxy_location="HeadOnly")
            url = f"http://127.0.0.1:{port}"
            app = deployment(ServerSettings(slots=1), replicas=REPLICAS, name=APP, load_timeout=START_TIMEOUT)
            # serve.run returns once every replica has passed its initialization (our lifespan waits for the
            # engine) and its first health check
            bounded(lambda: serve.run(app, name=APP, route_prefix="/"), START_TIMEOUT, "serve.run")
            first_health = [health(url) for _ in range(6)]  # at once, without waiting: every replica is ready
            yield {"url": url, "first_health": first_health}
        finally:
            try:
                serve.shutdown()
            finally:
                ray.shutdown()


@pytest.fixture(scope="module")
def reference() -> dict[str, str]:
    """What the target alone writes for each prompt: greedy, the demo's repetition penalty (the server's
    default for the demo), no drafting."""
    pipeline = Pipeline(str(DEMO_BUNDLE))
    config = GenerationConfig(max_new_tokens=MAX_TOKENS, temperature=0)  # + the demo's recorded defaults
    return {prompt: pipeline.generate(prompt, config, algorithm="none").text for prompt in PROMPTS}


def test_replicas_are_ready_when_deployed(ray_app):
    # The app's own lifespan only starts loading; without ReadyWhenLoaded holding it, Ray would route to a
    # replica whose /health is still 503 "loading".
    assert [status for status, _ in ray_app["first_health"]] == [200] * len(ray_app["first_health"])
    assert all(replica for _, replica in ray_app["first_health"]), "a response without the replica header"
    status = serve.status().applications[APP]
    assert status.status == "RUNNING"
    assert status.deployments[APP].replica_states == {"RUNNING": REPLICAS}


def test_greedy_completions_are_exact_on_both_replicas(ray_app, reference):
    client = openai.OpenAI(base_url=ray_app["url"] + "/v1", api_key="unused", timeout=REQUEST_TIMEOUT,
                           max_retries=0)
    models = client.models.list()
    assert [m.id for m in models.data] == [DEMO_BUNDLE.name]

    def complete(i: int) -> tuple[int, str, str, str, int]:
        """Request i: (i, its prompt, the text it got, the replica that answered, the tokens the draft wrote and
        the target accepted); odd ones are streamed."""
        prompt = PROMPTS[i % len(PROMPTS)]
        arguments = dict(model=DEMO_BUNDLE.name, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0)
        if i % 2:
            text, drafted = "", 0
            with client.completions.with_streaming_response.create(stream=True, **arguments) as response:
                replica = response.headers.get(REPLICA_HEADER, "")
                for chunk in response.parse():
                    text += chunk.choices[0].text if chunk.choices else ""
                    source = (chunk.model_extra or {}).get("edge_specdec", {})
                    drafted += source.get("tokens", 0) if source.get("source") == "draft" else 0
        else:
            response = client.completions.with_raw_response.create(**arguments)
            replica = response.headers.get(REPLICA_HEADER, "")
            completion = response.parse()
            text = completion.choices[0].text
            drafted = completion.model_extra["edge_specdec"]["draft_tokens_accepted"]
        return i, prompt, text, replica, drafted

    started = time.monotonic()
    with ThreadPoolExecutor(THREADS) as pool:
        results = bounded(lambda: list(pool.map(complete, range(REQUESTS))), REQUEST_TIMEOUT * 4,
                          f"{REQUESTS} completions")
    seconds = time.monotonic() - started
    served: dict[str, int] = {}
    assert all(reference.values()), "a reference text is empty: the comparison below would prove little"
    for i, prompt, text, replica, _ in results:
        assert text == reference[prompt], f"request {i} ({'streamed' if i % 2 else 'not streamed'}) on {replica}"
        served[replica] = served.get(replica, 0) + 1
    drafted = [d for *_, d in results]
    print(f"\n{REQUESTS} completions of {MAX_TOKENS} tokens from {THREADS} threads in {seconds:.2f} s; "
          f"requests per replica: {served}; draft tokens accepted per request: {drafted}")
    # the outputs above came through speculative decoding, not the target alone
    assert sum(drafted[0::2]) > 0 and sum(drafted[1::2]) > 0, "no drafted token was accepted"
    assert "" not in served, "a response without the replica header"
    assert len(served) == REPLICAS, f"not every replica served: {served}"


def test_a_bundle_that_fails_to_load_fails_its_replica_with_the_reason(ray_app):
    # num_cpus 0: the two replicas above hold both of the instance's CPUs. One attempt, not Ray's default retries.
    app = deployment(ServerSettings(bundle="/nonexistent/bundle"), replicas=1, num_cpus=0, name="broken",
                     max_constructor_retry_count=1)
    try:
        with pytest.raises(RuntimeError, match="broken"):
            bounded(lambda: serve.run(app, name="broken", route_prefix="/broken"), START_TIMEOUT, "serve.run")
        status = serve.status().applications["broken"]
        assert status.status == "DEPLOY_FAILED"
        assert "loading /nonexistent/bundle failed" in status.deployments["broken"].message
    finally:
        serve.delete("broken")
    # the working app was not disturbed
    assert health(ray_app["url"])[0] == 200
