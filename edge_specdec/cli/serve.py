"""`edge-specdec serve`: the OpenAI-compatible server (edge_specdec.serve) under uvicorn."""
from __future__ import annotations

import argparse
import ipaddress
import logging
import os

from ..demo import DEMO_BUNDLE
from ..errors import EdgeSpecdecError
from ..runtime.settings import CROWDED_DRAFT_TOKENS, DRAFT_MAX_SESSIONS
from .common import add_chat_template_option, add_engine_options, engine_config, say

SERVE_EXAMPLES = """\
examples:
  edge-specdec serve                                  # the demo pair on http://127.0.0.1:8000 (page at /)
  edge-specdec serve bundles/qwen --slots 4 --queue 32
  edge-specdec serve bundles/qwen --host 0.0.0.0 --api-key "$KEY" --cors https://app.example.com

then, from any OpenAI client:
  curl http://127.0.0.1:8000/v1/completions -H 'Content-Type: application/json' \\
      -d '{"prompt": "def fib(n):", "max_tokens": 64, "temperature": 0}'
  python -c 'import openai; c = openai.OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="none"); \\
      print(c.chat.completions.create(model="any", messages=[{"role": "user", "content": "hi"}]))'

endpoints: POST /v1/chat/completions, POST /v1/completions (stream, logprobs, stop, seed, top_k, min_p,
presence_penalty, frequency_penalty, logit_bias, repetition_penalty, ignore_eos, and "edge_specdec": {"algorithm",
"num_assistant_tokens", "confidence", "lookup"}), POST /tokenize and /detokenize (llama-server's), GET /v1/models,
GET /health (503 while loading), GET /metrics (Prometheus), GET / (the page).
A full queue answers 429 with Retry-After; a client that disconnects frees its slot within a round;
Ctrl-C or SIGTERM finishes the requests in flight, then exits. More: edge-specdec docs serving.
"""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def port_number(text: str) -> int:
    """--port's type: a TCP port, so that argparse says what is wrong in one line."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port: give 1 to 65535 (0: any free port)")
    return port


def _cmd_serve(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from ..serve import ServerSettings, create_app, uvicorn_config
    except ImportError as exc:
        raise EdgeSpecdecError(f"serve needs the serve extra ({exc.name} is missing): "
                               f"pip install \"edge-specdec[serve]\"") from None
    api_key = args.api_key or os.environ.get("EDGE_SPECDEC_API_KEY")
    if not is_loopback(args.host) and not api_key:
        raise EdgeSpecdecError(f"--host {args.host} is reachable from other machines: give an --api-key (or set "
                               f"EDGE_SPECDEC_API_KEY) that clients must send, or serve on 127.0.0.1.")
    engine = engine_config(args, prefix_reuse=args.prefix_reuse, crowded_draft_tokens=args.crowded_draft_tokens,
                           draft_max_sessions=None if args.draft_max_sessions == 0 else args.draft_max_sessions,
                           chat_template=args.chat_template)
    settings = ServerSettings(bundle=args.bundle, slots=args.slots, queue=args.queue, api_key=api_key,
                              batching=args.batching, host=args.host, allowed_hosts=args.allowed_host or [],
                              cors=args.cors or [], max_tokens=args.max_tokens, model_name=args.model_name,
                              max_body_bytes=args.max_body_bytes, engine=engine,
                              prefix_cache_mb=args.prefix_cache_mb, idle_timeout=args.idle_timeout,
                              body_timeout=args.body_timeout, context_shift=args.context_shift).check()
    app = create_app(settings)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    server = uvicorn.Server(uvicorn_config(app, host=args.host, port=args.port, log_level="info",
                                           access_log=args.access_log, timeout_graceful_shutdown=None))
    state = app.state.server
    state.on_load_error = lambda message: setattr(server, "should_exit", True)
    say(f"edge-specdec serve: loading {state.bundle}; the API will be at http://{args.host}:{args.port}/v1 and the "
        f"page at http://{args.host}:{args.port}/ (GET /health says when it is ready)")
    server.run()
    if state.load_error:
        raise EdgeSpecdecError(f"the server could not load the bundle: {state.load_error}")
    return 0


def add_parser(sub) -> None:
    """The `serve` subcommand."""
    p = sub.add_parser("serve", help="serve a bundle over OpenAI's HTTP API, with a page that shows the drafting",
                       description="An OpenAI-compatible server (chat and completions, streaming, logprobs) on one "
                                   "loaded bundle: --slots requests decode at once, each as exactly as the target "
                                   "alone would. Needs pip install \"edge-specdec[serve]\".",
                       epilog=SERVE_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bundle", metavar="BUNDLE", nargs="?",
                   help=f"a bundle folder (default: the demo pair that ships with edge-specdec, {DEMO_BUNDLE})")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only; any other needs --api-key)")
    p.add_argument("--port", type=port_number, default=8000, help="port (default 8000)")
    p.add_argument("--slots", type=int, default=2, metavar="N",
                   help="requests generating at once, each on its own decoding session; the weights are loaded "
                        "once (default 2)")
    p.add_argument("--batching", action=argparse.BooleanOptionalAction, default=None,
                   help="verify the blocks of the requests generating at once in one target call (default: on "
                        "with more than one slot, where the target gives the same bits batched as alone, checked "
                        "once per machine)")
    p.add_argument("--draft-max-sessions", type=int, default=DRAFT_MAX_SESSIONS, metavar="N",
                   help=f"with batching, requests draft their full length only while at most N generate; with "
                        f"more, at most --crowded-draft-tokens each (default {DRAFT_MAX_SESSIONS}; 0: always the "
                        f"full length). Outputs are the same either way")
    p.add_argument("--crowded-draft-tokens", type=int, default=CROWDED_DRAFT_TOKENS, metavar="K",
                   help=f"tokens a request drafts per round while more than --draft-max-sessions generate "
                        f"(default {CROWDED_DRAFT_TOKENS}: their rounds verify the target's own tokens together, "
                        f"which pays most when the draft shares the target's CPU; try 1 with the draft on an "
                        f"iGPU or the NPU)")
    p.add_argument("--prefix-reuse", action=argparse.BooleanOptionalAction, default=True,
                   help="each slot keeps its KV caches between requests; a request goes to the free slot whose cache "
                        "shares the longest prefix with its prompt (a conversation's earlier turns, a shared system "
                        "prompt) and prefills only the rest, exactly (default on; --no-prefix-reuse prefills every "
                        "prompt whole)")
    p.add_argument("--prefix-cache-mb", type=float, default=0, metavar="N",
                   help="keep the KV caches of recent conversations in up to N MiB of host memory when their slot is "
                        "taken by another one, least recently used dropped first, and restore one for a request "
                        "that shares more with it than with any slot: a conversation that comes back is not "
                        "prefilled again (default 0: no store)")
    p.add_argument("--queue", type=int, default=16, metavar="M",
                   help="requests that may wait for a slot; more get 429 with Retry-After (default 16)")
    p.add_argument("--api-key", metavar="KEY",
                   help="clients must send 'Authorization: Bearer KEY' (default: $EDGE_SPECDEC_API_KEY, else none; "
                        "required with a --host other than loopback). /health and the page stay open")
    p.add_argument("--allowed-host", action="append", metavar="NAME",
                   help="a host name clients may reach this server by, besides localhost, IP addresses and --host "
                        "(repeatable; e.g. the machine's name on the LAN, or a proxy's). Requests to other names "
                        "get 403: that is what stops a web page from reaching the server by DNS rebinding")
    p.add_argument("--cors", action="append", metavar="ORIGIN",
                   help="let pages from ORIGIN call the API from a browser (repeatable; '*' for any; default: off)")
    p.add_argument("--max-tokens", type=int, default=1024, metavar="N",
                   help="the most tokens one request may generate, and a chat request's default (default 1024; "
                        "completions default to 16, as OpenAI's)")
    p.add_argument("--max-body-bytes", type=int, default=1 << 20, metavar="B",
                   help="the largest request body accepted (default 1 MiB); larger ones get 413")
    p.add_argument("--idle-timeout", type=float, default=15.0, metavar="S",
                   help="seconds a connection may take to send a request head, after it opens and after each answer; "
                        "then it is closed (default 15)")
    p.add_argument("--body-timeout", type=float, default=30.0, metavar="S",
                   help="seconds a request body may take to arrive after its head; then the request gets 408 and "
                        "its connection is closed (default 30)")
    p.add_argument("--context-shift", action="store_true",
                   help="a chat request past the model's context loses its oldest exchanges after the system message "
                        "(down to three quarters of the context) instead of getting a 400; the answer's usage and "
                        "edge_specdec objects say how many messages went")
    p.add_argument("--model-name", metavar="NAME", help="the model id in /v1/models (default: the bundle's folder name)")
    p.add_argument("--access-log", action="store_true", help="log every request (uvicorn's access log)")
    add_chat_template_option(p)
    add_engine_options(p)
    p.set_defaults(func=_cmd_serve)
