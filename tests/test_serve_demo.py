"""`edge-specdec serve` with no bundle (the demo) out of the box: chat completions (serve --help's own example, run
as printed), the page's icon, and the page's script clearing its prompt after Send (run under node with a stub
DOM, where node is installed)."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from edge_specdec.cli.serve import SERVE_EXAMPLES  # noqa: E402
from serve_helpers import TIME, WEATHER, serve_in_thread  # noqa: E402

pytestmark = pytest.mark.slow  # starts a server or a process: see pyproject.toml

STATIC = Path(__file__).resolve().parent.parent / "edge_specdec" / "serve" / "static"


@pytest.fixture(scope="module")
def default_server():
    from edge_specdec.serve import ServerSettings

    with serve_in_thread(ServerSettings()) as running:
        yield running


def test_the_default_server_answers_chat_completions_as_the_pipeline_does(default_server):
    openai = pytest.importorskip("openai")
    from edge_specdec.demo import DEMO_BUNDLE
    from edge_specdec.runtime import GenerationConfig, Pipeline

    client = openai.OpenAI(base_url=default_server.api, api_key="none")
    messages = [{"role": "user", "content": "Parse command line arguments."}]
    reply = client.chat.completions.create(model="any", messages=messages, max_tokens=16, temperature=0)
    pipe = Pipeline(str(DEMO_BUNDLE))
    expected = pipe.generate(pipe.chat_prompt(messages),
                             GenerationConfig(max_new_tokens=16))
    assert reply.choices[0].message.content == expected.text


def test_serve_help_example_works_against_the_default_server(default_server):
    """The Python line of serve --help's examples, run as printed (only the address is the test server's)."""
    match = re.search(r"^  (python -c '.*?')$", SERVE_EXAMPLES, re.MULTILINE | re.DOTALL)
    assert match and "chat.completions.create" in match.group(1)
    command = match.group(1).replace("http://127.0.0.1:8000", default_server.url).replace("python ", "", 1)
    code = command[len("-c '"):-1]
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "ChatCompletion(" in proc.stdout and "finish_reason=" in proc.stdout


def test_the_page_has_an_icon(default_server):
    with urllib.request.urlopen(default_server.url + "/favicon.ico", timeout=30) as response:
        assert response.status == 200 and response.headers["content-type"].startswith("image/svg+xml")
        assert response.read().startswith(b"<svg")
    page = (STATIC / "index.html").read_text(encoding="utf-8")
    assert 'rel="icon" href="static/favicon.svg"' in page  # the page names it, relative like its other files


# The page's script under node: a stub of the few DOM calls it makes, fetch answering /v1/models and one streamed
# completion, then send() as the Send button calls it.
PAGE_DRIVER = r"""
const fs = require("fs"), vm = require("vm");
const elements = {};
function stub(id) {
  return elements[id] ||= { id, value: "", textContent: "", hidden: false, disabled: false, dataset: {},
    classList: { add() {} }, scrollTop: 0, scrollHeight: 0, clientHeight: 0,
    append() {}, replaceChildren() {}, focus() {}, addEventListener() {} };
}
const sse = (objects) => objects.map((o) => "data: " + JSON.stringify(o) + "\n\n").join("") + "data: [DONE]\n\n";
const context = {
  console, TextDecoder, AbortController, JSON, Number, Math, Boolean, Error, setTimeout,
  performance: { now: () => 0 },
  sessionStorage: { getItem: () => null, setItem() {} },
  document: { getElementById: stub, createElement: () => stub("element-" + Math.random()), addEventListener() {} },
  fetch: async (url) => url === "v1/models"
    ? new Response(JSON.stringify({ data: [{ id: "demo", edge_specdec: { chat_template: CHAT } }] }))
    : new Response(sse([{ choices: [{ text: "x = 1", delta: { content: "x = 1" }, finish_reason: null }] },
                        { choices: [{ text: "", delta: {}, finish_reason: "length" }], edge_specdec: {} }])),
};
vm.createContext(context);
vm.runInContext(fs.readFileSync(process.argv[2], "utf8"), context);
(async () => {
  await vm.runInContext("loadModel()", context);
  stub("prompt").value = "def parse_args(";
  await vm.runInContext('send($("prompt").value)', context);
  console.log(JSON.stringify({ prompt: stub("prompt").value, status: stub("status").dataset.state,
                               error: stub("error").textContent }));
})();
"""


@pytest.mark.parametrize("chat", [False, True], ids=["completion", "chat"])
def test_the_page_clears_its_prompt_after_send(tmp_path, chat):
    node = shutil.which("node")
    if node is None:
        pytest.skip("needs node to run the page's script")
    driver = tmp_path / "driver.js"
    driver.write_text(PAGE_DRIVER.replace("CHAT", json.dumps(chat)), encoding="utf-8")
    proc = subprocess.run([node, str(driver), str(STATIC / "app.js")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    after = json.loads(proc.stdout.strip().splitlines()[-1])
    assert after["status"] == "done", after  # the reply streamed to its end
    assert after["prompt"] == "", after  # and the box is empty for the next prompt


# bounded arguments: the demo's tiny code model fills a free string with code until max_tokens


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
def test_the_demo_answers_a_tools_request_with_a_valid_call(default_server, choice):
    """The demo's chat template describes tools in the format the runtime reads, so with tool_choice required or a
    named function (whose grammar forces the call) the demo calls a tool whose arguments fit its schema."""
    openai = pytest.importorskip("openai")
    jsonschema = pytest.importorskip("jsonschema")

    client = openai.OpenAI(base_url=default_server.api, api_key="none", max_retries=0, timeout=120)
    answer = client.chat.completions.create(
        model="any", messages=[{"role": "user", "content": "What is the weather in Paris?"}], max_tokens=80,
        temperature=0, tools=[WEATHER, TIME], tool_choice=choice, parallel_tool_calls=False)
    reply = answer.choices[0]
    assert reply.finish_reason == "tool_calls" and len(reply.message.tool_calls or []) == 1, reply
    call = reply.message.tool_calls[0]
    tool = {"get_weather": WEATHER, "get_time": TIME}[call.function.name]
    jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])
    if isinstance(choice, dict):
        assert call.function.name == "get_time"
