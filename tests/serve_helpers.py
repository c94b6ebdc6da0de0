"""Start `edge-specdec serve`'s app on a loopback port for a test: in this process (a thread) or as a command."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

LOAD_TIMEOUT = 180  # seconds for the engine to load and warm up on a busy 2-core machine


@dataclass
class Running:
    url: str  # http://127.0.0.1:PORT
    server: object = None  # the app's Server (in-process only)
    process: Optional[subprocess.Popen] = None  # the command (subprocess only)

    @property
    def api(self) -> str:
        return self.url + "/v1"


def free_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


def health(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url + "/health", timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def wait_ready(url: str, alive=lambda: True) -> None:
    deadline = time.monotonic() + LOAD_TIMEOUT
    while time.monotonic() < deadline and alive():
        try:
            status, body = health(url)
        except OSError:  # not listening yet
            status, body = 0, {}
        if status == 200:
            return
        if body.get("status") == "error":
            raise RuntimeError(f"the server failed to load: {body.get('error')}")
        time.sleep(0.2)
    raise RuntimeError(f"the server at {url} did not become ready")


@contextmanager
def serve_in_thread(settings, engine=None) -> Iterator[Running]:
    """The app under uvicorn in a thread of this process, on a free loopback port; stopped on exit."""
    import uvicorn

    from edge_specdec.serve import create_app, uvicorn_config

    app = create_app(settings, engine)
    sock = free_socket()
    server = uvicorn.Server(uvicorn_config(app, log_level="warning", timeout_graceful_shutdown=30))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    running = Running(f"http://127.0.0.1:{sock.getsockname()[1]}", server=app.state.server)
    try:
        wait_ready(running.url, thread.is_alive)
        yield running
    finally:
        server.should_exit = True
        thread.join(60)
        sock.close()


@contextmanager
def serve_command(*args: str, env: Optional[dict] = None) -> Iterator[Running]:
    """`edge-specdec serve ARGS --port P` as a process; SIGTERM (then SIGKILL) on exit."""
    sock = free_socket()
    port = sock.getsockname()[1]
    sock.close()  # the server binds it again (SO_REUSEADDR)
    process = subprocess.Popen([sys.executable, "-m", "edge_specdec.cli", "serve", *args, "--port", str(port)],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, **(env or {})})
    running = Running(f"http://127.0.0.1:{port}", process=process)
    try:
        wait_ready(running.url, lambda: process.poll() is None)
        yield running
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


# a ChatML template (Qwen's shape) for tiny bundles, whose tokenizers have none
CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def chat_bundle_copy(bundle: Path, folder: Path) -> Path:
    """A copy of a bundle whose target has the ChatML template: what the chat endpoints need."""
    copy = folder / "pair"
    shutil.copytree(bundle, copy)
    (copy / "target" / "chat_template.jinja").write_text(CHATML)
    return copy


# two tools with bounded arguments (a tiny model fills a free string until max_tokens)
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["city", "unit"],
                   "properties": {"city": {"type": "string", "maxLength": 16},
                                  "unit": {"enum": ["celsius", "fahrenheit"]}}}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "additionalProperties": False, "required": ["zone"],
                                       "properties": {"zone": {"type": "string", "maxLength": 8}}}}}
