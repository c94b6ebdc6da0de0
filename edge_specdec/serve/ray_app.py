"""Ray Serve: the `edge-specdec serve` app as a deployment of N replicas, each loading its own engine.

    serve run edge_specdec.serve.ray_app:app_builder bundle=bundles/qwen replicas=2 slots=1

or from Python:

    from ray import serve
    from edge_specdec.serve import ServerSettings
    from edge_specdec.serve.ray_app import deployment
    serve.run(deployment(ServerSettings(bundle="bundles/qwen", slots=1), replicas=2))

Every replica is a Ray actor that runs the same ASGI app as `edge-specdec serve` (create_app) and loads the bundle
itself, so each holds its own copy of the weights. Ray's proxy spreads requests over the replicas; within one
replica, `slots` sessions decode in parallel and the rest wait in its queue, as in a single server.

How the app sits in Ray Serve (read from Ray 2.60's source, ray/serve/api.py and _private/replica.py):
`serve.ingress()` without an app plus a `__serve_build_asgi_app__` method builds the app inside the replica, after
the constructor; Ray then runs the app's ASGI lifespan (uvicorn's LifespanOn) and an initial `check_health` before
it routes any request to the replica. The app's lifespan only starts the engine loading in a thread (so that
`edge-specdec serve` answers /health 503 meanwhile); `ReadyWhenLoaded` holds the lifespan's startup until that
load has ended, so a replica gets no traffic before its engine is loaded and warmed up, and a load that failed
fails the replica's initial health check with the load's own message (Ray shows it in `serve status` and in
serve.run's error). Streamed responses (SSE) go through Ray's proxy chunk by chunk.

Ray is imported only here: `edge_specdec.serve` works without it.
"""
from __future__ import annotations

import asyncio
import os
import socket
import time
from typing import Any, Optional

try:
    from ray import serve
except ImportError as exc:  # the `serve` extra does not bring Ray: it is only for this module
    raise ImportError('edge_specdec.serve.ray_app needs Ray Serve: pip install "ray[serve]"') from exc

from ..runtime.settings import EngineConfig
from .app import ServerSettings, create_app

REPLICA_HEADER = "x-edge-specdec-replica"  # host:pid of the replica that answered
LOAD_TIMEOUT = 1800.0  # seconds a replica may take to load and warm up its engine before Ray is told it failed
LOAD_POLL = 0.2  # seconds between looks at whether the engine has loaded


class ReadyWhenLoaded:
    """An ASGI wrapper around create_app's app for Ray Serve.

    Lifespan: the app's startup starts the engine loading in a background thread and completes at once; this
    wrapper passes its "startup.complete" on only when the load has ended (loaded or failed) or `load_timeout`
    has passed, because Ray routes requests to a replica as soon as its lifespan startup is complete (and its
    first health check passes). It does not send "startup.failed" on a failed load: Ray would then report only
    "ASGI lifespan startup failed"; the replica's check_health reports the load's own error instead.

    HTTP: every response carries `x-edge-specdec-replica: host:pid`, so a client (and the tests) can tell which
    replica answered.
    """

    def __init__(self, app, load_timeout: float = LOAD_TIMEOUT):
        self.app = app
        self.server = app.state.server
        self.load_timeout = load_timeout
        self.started = time.monotonic()
        self.replica = f"{socket.gethostname()}:{os.getpid()}".encode()

    @property
    def state(self):  # the Starlette app's state, for code that reads app.state.server
        return self.app.state

    def add_exception_handler(self, exc_class, handler) -> None:
        # Ray adds handlers for its own back-pressure errors to an app that has this method (a Starlette app);
        # they go to the wrapped app.
        self.app.add_exception_handler(exc_class, handler)

    def loading(self) -> bool:
        return self.server.engine is None and self.server.load_error is None

    def health_error(self) -> Optional[str]:
        """Why this replica cannot serve, or None when its engine is loaded."""
        if self.server.engine is not None:
            return None
        if self.server.load_error:
            return f"edge-specdec: loading {self.server.bundle} failed: {self.server.load_error}"
        return (f"edge-specdec: the engine for {self.server.bundle} is still loading after "
                f"{time.monotonic() - self.started:.0f} s (the limit is {self.load_timeout:.0f} s: load_timeout)")

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            async def send_when_loaded(message) -> None:
                if message["type"] == "lifespan.startup.complete":
                    deadline = self.started + self.load_timeout
                    while self.loading() and time.monotonic() < deadline:
                        await asyncio.sleep(LOAD_POLL)  # the loader thread runs meanwhile; the loop stays free
                await send(message)
            await self.app(scope, receive, send_when_loaded)
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_replica(message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (REPLICA_HEADER.encode(),
                                                                                 self.replica)]}
            await send(message)
        await self.app(scope, receive, send_with_replica)


@serve.ingress()
class EdgeSpecdecReplica:
    """One replica: the app on its own engine. Ray calls the constructor, then `__serve_build_asgi_app__`, then
    runs the app's lifespan (which waits for the engine, see ReadyWhenLoaded), then `check_health`."""

    def __init__(self, settings: ServerSettings, load_timeout: float = LOAD_TIMEOUT):
        self.settings = settings.check()
        self.load_timeout = load_timeout
        self.wrapped: Optional[ReadyWhenLoaded] = None

    async def __serve_build_asgi_app__(self):
        self.wrapped = ReadyWhenLoaded(create_app(self.settings), self.load_timeout)
        return self.wrapped

    async def check_health(self) -> None:
        """Ray calls this before the replica's first request and then every health_check_period_s; raising marks
        the replica unhealthy (Ray replaces it)."""
        error = self.wrapped.health_error() if self.wrapped else "edge-specdec: the app was not built"
        if error:
            raise RuntimeError(error)


def deployment(settings: Optional[ServerSettings] = None, replicas: int = 2, *, num_cpus: float = 1,
               max_ongoing_requests: Optional[int] = None, max_queued_requests: int = -1,
               load_timeout: float = LOAD_TIMEOUT, name: str = "edge-specdec", **options: Any):
    """The Ray Serve application for `serve.run`: `replicas` copies of the app, each with its own engine.

    num_cpus: the CPUs Ray reserves for each replica (Ray schedules no more replicas than the cluster's CPUs
    allow; OpenVINO's threads per model are set by the engine, see Engine's `threads`). max_ongoing_requests:
    requests Ray sends one replica at once; the default, slots + queue, is what a replica takes before it answers
    429, so the rest wait in Ray's router for the replica that frees first. max_queued_requests: how many wait
    there (-1: no limit; past it Ray answers 503). load_timeout: seconds a replica may take to load its engine.
    `options` go to Deployment.options as they are (autoscaling_config, health_check_period_s, ...).
    """
    settings = (settings or ServerSettings()).check()
    if replicas < 1:
        raise ValueError(f"replicas must be at least 1, not {replicas}.")
    options = {"num_replicas": replicas, "ray_actor_options": {"num_cpus": num_cpus},
               "max_ongoing_requests": max_ongoing_requests or settings.slots + max(settings.queue, 0),
               "max_queued_requests": max_queued_requests, "name": name, **options}
    if "autoscaling_config" in options:  # Ray refuses num_replicas beside autoscaling unless it is "auto"
        options.pop("num_replicas")
    return serve.deployment(EdgeSpecdecReplica).options(**options).bind(settings, load_timeout)


# `serve run edge_specdec.serve.ray_app:app_builder KEY=VALUE ...`: the keys, with how each value is read.
BUILDER_KEYS = {
    "bundle": str, "replicas": int, "slots": int, "queue": int, "max_tokens": int, "api_key": str,
    "model_name": str, "cors": lambda v: [o for o in str(v).split(",") if o],
    "allowed_hosts": lambda v: [h for h in str(v).split(",") if h], "num_cpus": float,
    "max_ongoing_requests": int, "max_queued_requests": int, "load_timeout": float, "prefix_cache_mb": float,
    # Engine options
    "target_device": str, "draft_device": str, "threads": int,
}
ENGINE_KEYS = {"target_device", "draft_device", "threads"}
DEPLOYMENT_KEYS = {"replicas", "num_cpus", "max_ongoing_requests", "max_queued_requests", "load_timeout"}


def app_builder(args: dict[str, Any]):
    """The application `serve run` builds from KEY=VALUE arguments (strings; read with BUILDER_KEYS). No bundle:
    the packaged demo pair. Unknown keys are an error that lists the known ones."""
    unknown = sorted(set(args) - set(BUILDER_KEYS))
    if unknown:
        raise ValueError(f"unknown argument(s) {', '.join(unknown)}; edge-specdec's Ray app takes "
                         f"{', '.join(BUILDER_KEYS)}.")
    values = {}
    for key, value in args.items():
        try:
            values[key] = BUILDER_KEYS[key](value)
        except ValueError:
            raise ValueError(f"{key}={value!r} is not a valid value for {key}.") from None
    engine = EngineConfig(**{k: values.pop(k) for k in ENGINE_KEYS if k in values})
    deployment_args = {k: values.pop(k) for k in DEPLOYMENT_KEYS if k in values}
    settings = ServerSettings(**values, engine=engine)
    return deployment(settings, **deployment_args)
