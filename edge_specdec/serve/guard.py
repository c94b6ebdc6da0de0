"""Who may talk to the server from a browser: the Host and Origin checks in front of every route.

A page on another site can make a browser send requests to a server on loopback. Without CORS it cannot read the
answers, but it can still make the server generate (a "simple" POST needs no preflight), and through DNS rebinding
(its own name re-pointed at 127.0.0.1) its requests become same-origin and it reads them too. Two checks close this,
as local LLM servers learned to do:

- Host: the name the client connected to must be one this server answers to: an IP address (a browser that
  connects to an IP literal looked no name up, so there is nothing to rebind), `localhost` or a name below it
  (reserved, RFC 6761), the --host the server is bound to, or a name given with --allowed-host. A rebinding page's
  requests carry its own domain and are refused, whatever their method or Origin.
- Origin: a request that says where it comes from must come from this server's own origin (its page), or from an
  origin given with --cors. Clients that are not browsers send no Origin and are not affected.

Both answer 403 with an OpenAI error object, before the request reaches a route or the CORS middleware.
"""
from __future__ import annotations

import ipaddress
import json
from typing import Iterable
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from .protocol import error_body


def host_name(host: str) -> str:
    """The name part of a Host header value ("[::1]:8000" -> "::1", "Example.com." -> "example.com")."""
    host = host.strip().lower()
    if host.startswith("["):  # an IPv6 literal, with or without a port
        return host[1:host.find("]")] if "]" in host else ""
    return host.rsplit(":", 1)[0].rstrip(".") if host.count(":") == 1 else host.rstrip(".")


def is_ip_literal(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class HostPolicy:
    """The names this server answers to (see the module's docstring) and the browser origins it serves."""

    def __init__(self, bound_host: str, allowed_hosts: Iterable[str] = (), cors: Iterable[str] = ()):
        self.names = {host_name(h) for h in (bound_host, *allowed_hosts) if h} - {""}
        self.cors = {origin.rstrip("/").lower() for origin in cors}

    def host_allowed(self, host: str) -> bool:
        name = host_name(host)
        if not name:  # no Host header, or an empty name (":8000")
            return False
        return (name == "localhost" or name.endswith(".localhost") or is_ip_literal(name) or name in self.names)

    def origin_allowed(self, origin: str, host: str) -> bool:
        """Same origin (the Origin's host and port are the Host the request was sent to), or one given with --cors.
        "null" (a sandboxed frame, a file) is no origin this server serves."""
        origin = origin.strip().rstrip("/").lower()
        if "*" in self.cors or origin in self.cors:
            return True
        parts = urlsplit(origin)
        return parts.scheme in ("http", "https") and bool(parts.netloc) and parts.netloc == host.strip().lower()


class RequestGuard:
    """ASGI middleware: HTTP requests whose Host or Origin the policy refuses get a 403 and reach nothing else."""

    def __init__(self, app: ASGIApp, policy: HostPolicy):
        self.app, self.policy = app, policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
            host = headers.get("host", "")
            if not self.policy.host_allowed(host):
                return await self.refuse(send, f"this server does not answer to the host name {host!r}: use "
                                               f"127.0.0.1, localhost or the address it was started on (--host), "
                                               f"or start it with --allowed-host NAME.", "host_not_allowed")
            origin = headers.get("origin")
            if origin is not None and not self.policy.origin_allowed(origin, host):
                return await self.refuse(send, f"requests from pages of the origin {origin!r} are refused: only this "
                                               f"server's own page may call it from a browser, and origins allowed "
                                               f"with --cors ORIGIN.", "origin_not_allowed")
        await self.app(scope, receive, send)

    @staticmethod
    async def refuse(send: Send, message: str, code: str) -> None:
        body = json.dumps(error_body(message, "invalid_request_error", None, code)).encode()
        await send({"type": "http.response.start", "status": 403,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
