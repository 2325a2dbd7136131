"""Cross-site protection: what a request must look like before the server reads its body.

A server on 127.0.0.1 is still reachable from every web page the user opens: a page may POST to
it (a cross-origin "simple request" with a text/plain body needs no CORS preflight), and a page
on a domain that re-resolves to 127.0.0.1 (DNS rebinding) may also read the answers. So, as
ollama does after the same reports, before anything else:

- `Host` must name this server: the address it listens on, localhost / 127.0.0.1 / [::1], or a
  name given with --allowed-hosts, with the server's port if a port is given; any IP address
  when it listens on all addresses (a rebinding page always sends a domain name). Else 403.
- A request that carries `Origin` (browsers send it on cross-origin requests and on every POST)
  must come from an origin given with --cors or from the server's own origin. Else 403.
- A body must be `application/json` (415 otherwise): a browser cannot send that cross-origin
  without a CORS preflight, which a foreign origin fails.
- A body may not exceed the size limit (413), counted as it arrives (a chunked one too).

Each refusal is OpenAI's error shape (Ollama's on Ollama's routes). `*` in --cors or --allowed-hosts lifts that check.
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from urllib.parse import urlsplit


LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
WILDCARD_ADDRESSES = ("0.0.0.0", "::", "")
BODY_METHODS = ("POST", "PUT", "PATCH")


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def split_host(value: str) -> tuple[str, int | None] | None:
    """A Host header (or an origin's netloc) as (lower-case name, port or None); None if malformed.
    IPv6 literals come without their brackets."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return None
        name, rest = value[1:end], value[end + 1 :]
        if rest and not rest.startswith(":"):
            return None
        port_text = rest[1:] if rest else None
    else:
        name, _, port_text = value.partition(":")
        if not _ and port_text == "":
            port_text = None
    name = name.rstrip(".")
    if not name:
        return None
    if port_text is None:
        return name, None
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        return None
    return name, int(port_text)


@dataclass(frozen=True)
class GuardPolicy:
    """Which hosts and origins the server answers.

    `listen` is the address the server listens on and `port` its port; `allowed_hosts` adds host
    names (`*`: any Host); `cors` adds origins a browser page may call from (`*`: any origin).
    """

    listen: str
    port: int
    allowed_hosts: tuple[str, ...] = ()
    cors: tuple[str, ...] = ()

    @property
    def any_host(self) -> bool:
        return "*" in self.allowed_hosts

    @property
    def any_origin(self) -> bool:
        return "*" in self.cors

    def host_names(self) -> set[str]:
        """Names (and IP literals) this server answers to, in lower case."""
        names = set(LOOPBACK_NAMES) | {h.strip().lower().rstrip(".") for h in self.allowed_hosts}
        listen = self.listen.strip().lower().strip("[]")
        if listen not in WILDCARD_ADDRESSES:
            names.add(listen)
        return names

    def _ours(self, name: str, port: int | None) -> bool:
        if port is not None and port != self.port:
            return False
        if name in self.host_names():
            return True
        # listening on every address: any IP literal is ours (DNS rebinding needs a name)
        return self.listen.strip().strip("[]") in WILDCARD_ADDRESSES and _ip(name) is not None

    def host_allowed(self, header: str | None) -> bool:
        if self.any_host:
            return True
        parsed = split_host(header) if header else None  # HTTP/1.1 requires Host
        return parsed is not None and self._ours(*parsed)

    def origin_allowed(self, origin: str) -> bool:
        """An origin given with --cors, or the server's own (a page it serves itself)."""
        if self.any_origin:
            return True
        origin = origin.strip().lower().rstrip("/")
        if origin in {o.strip().lower().rstrip("/") for o in self.cors}:
            return True
        parts = urlsplit(origin)
        if parts.scheme not in ("http", "https"):
            return False  # "null" (sandboxed frames, files), extensions' schemes
        parsed = split_host(parts.netloc)
        if parsed is None:
            return False
        name, port = parsed
        port = port if port is not None else (80 if parts.scheme == "http" else 443)
        return port == self.port and self._ours(name, port)


def ollama_route(path: str) -> bool:
    """Whether `path` is one of Ollama's routes, whose errors are Ollama's shape ({"error": "..."})."""
    return path.startswith("/api/")


def error_body(message: str, code: str, path: str = "", type: str = "invalid_request_error") -> bytes:
    """A refusal in the shape of the API asked: Ollama's on its routes, OpenAI's elsewhere."""
    if ollama_route(path):
        return json.dumps({"error": message}).encode()
    return json.dumps({"error": {"message": message, "type": type, "param": None, "code": code}}).encode()


class Guard:
    """ASGI middleware enforcing a `GuardPolicy` and a body size limit before the app runs."""

    def __init__(self, app: ASGIApp, policy: GuardPolicy, max_body_bytes: int) -> None:
        self.app = app
        self.policy = policy
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = _headers(scope)
        refusal = self.refusal(scope["method"], headers)
        if refusal is not None:
            status, message, code = refusal
            await _respond(send, status, message, code, scope.get("path", ""))
            return
        if scope["method"] not in BODY_METHODS:
            await self.app(scope, receive, send)
            return
        # the body, read here up to the limit, is handed to the app whole: an oversized one is a
        # 413 whatever the app would make of a failed read (FastAPI answers 400)
        body = bytearray()
        more = True
        while more:
            event = await receive()
            if event["type"] == "http.disconnect":
                return
            body += event.get("body", b"")
            more = event.get("more_body", False)
            if len(body) > self.max_body_bytes:
                await _respond(send, 413, self._too_large(), "request_too_large", scope.get("path", ""))
                return
        handed = False

        async def replay() -> Message:
            nonlocal handed
            if handed:
                return await receive()  # the disconnect, when the client goes
            handed = True
            return {"type": "http.request", "body": bytes(body), "more_body": False}

        await self.app(scope, replay, send)

    def _too_large(self) -> str:
        return f"the request body is over {self.max_body_bytes >> 20} MiB"

    def refusal(self, method: str, headers: dict[str, str]) -> tuple[int, str, str] | None:
        """(status, message, code) when the request is refused before its body is read."""
        host = headers.get("host")
        if not self.policy.host_allowed(host):
            return (
                403,
                f"Host {host!r} is not this server; it answers to {', '.join(sorted(self.policy.host_names()))} "
                f"on port {self.policy.port} (allow a name with --allowed-hosts)",
                "host_not_allowed",
            )
        origin = headers.get("origin")
        if origin is not None and not self.policy.origin_allowed(origin):
            return (
                403,
                f"requests from the web page at {origin} are not allowed (allow an origin with --cors ORIGIN)",
                "origin_not_allowed",
            )
        if method in BODY_METHODS:
            media_type = headers.get("content-type", "").split(";", 1)[0].strip().lower()
            if media_type != "application/json":
                return 415, f"the body must be application/json, got {media_type or 'no Content-Type'}", "unsupported_media_type"
            length = headers.get("content-length", "")
            if length.isdigit() and int(length) > self.max_body_bytes:
                return 413, self._too_large(), "request_too_large"
        return None


def _headers(scope: Scope) -> dict[str, str]:
    """The request's headers (the first of repeated ones), names in lower case."""
    out: dict[str, str] = {}
    for name, value in scope.get("headers", ()):
        out.setdefault(name.decode("latin-1").lower(), value.decode("latin-1"))
    return out


async def _respond(send: Send, status: int, message: str, code: str, path: str) -> None:
    body = error_body(message, code, path)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
