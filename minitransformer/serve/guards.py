"""What stands in front of every route: the body-size limit, the API key, the page's headers.

- ``BodyLimit``: a request body over ``max_bytes`` is refused with 413 before any route reads
  it (counted as it arrives, so a chunked body cannot slip past a missing Content-Length).
- ``check_key``: with an API key set, /v1 and /api need ``Authorization: Bearer KEY`` (401).
- ``SecurityHeaders``: a Content-Security-Policy that allows scripts, styles and requests
  from this server only (no inline script, no remote script), and no sniffing or framing.
"""

from __future__ import annotations

import hmac
import json

from .errors import APIError, error_body

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
       "connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'none'; "
       "frame-ancestors 'none'")
HEADERS = [(b"content-security-policy", CSP.encode()), (b"x-content-type-options", b"nosniff"),
           (b"referrer-policy", b"no-referrer"), (b"x-frame-options", b"DENY")]


async def _send_error(send, status: int, message: str, code: str) -> None:
    body = json.dumps(error_body(status, message, None, code)).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class BodyLimit:
    """ASGI middleware: read the whole body (up to the limit) before the app sees it."""

    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        too_big = f"the request body is over this server's limit of {self.max_bytes} bytes"
        length = dict(scope.get("headers", ())).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            return await _send_error(send, 413, too_big, "request_too_large")
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                return await _send_error(send, 413, too_big, "request_too_large")
            if not message.get("more_body", False):
                break
        body, replayed = b"".join(chunks), False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # then the disconnect, when it comes

        return await self.app(scope, replay, send)


class SecurityHeaders:
    """ASGI middleware: the CSP and friends on every response."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def with_headers(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *HEADERS]}
            await send(message)

        return await self.app(scope, receive, with_headers)


def check_key(api_key: str | None, authorization: str | None) -> None:
    """401 unless the Bearer token equals the key (constant-time); nothing when no key is set."""
    if api_key is None:
        return
    if not authorization:
        raise APIError(401, "missing API key: send 'Authorization: Bearer KEY'", None,
                       "invalid_api_key")
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(),
                                                               api_key.encode()):
        raise APIError(401, "incorrect API key", None, "invalid_api_key")
