"""`RateLimitMiddleware`: ASGI middleware (Starlette, FastAPI) that decides
each request through the gateway as its proxy would (`check_request`:
method, path, headers, peer), answers a refusal with the gateway's status,
rate-limit headers and problem body, and when the answer ends settles the
`count: failures` rules on its status and gives back `concurrency` leases,
also when the client leaves mid-answer.

    app.add_middleware(RateLimitMiddleware, url="http://127.0.0.1:9090")
"""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any, Awaitable, Callable, Dict, List, Optional, Tuple

from ._client import AsyncClient, Decision

__all__ = ["RateLimitMiddleware"]

Scope = Dict[str, Any]
Message = Dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


def _headers(d: Decision) -> List[Tuple[bytes, bytes]]:
    out = [(k.encode("latin-1"), str(v).encode("latin-1")) for k, v in d.headers.items()]
    if not d.allowed and d.retry_after is not None:
        out.append((b"retry-after", str(max(1, math.ceil(d.retry_after))).encode()))
    return out


class RateLimitMiddleware:
    def __init__(
        self,
        app: Callable[[Scope, Receive, Send], Awaitable[None]],
        url: str,
        token: Optional[str] = None,
        timeout: float = 0.25,
        on_error: str = "allow",
        client: Optional[AsyncClient] = None,
        peer: Optional[Callable[[Scope], Optional[str]]] = None,
    ) -> None:
        self.app = app
        self.client = client or AsyncClient(url, token=token, timeout=timeout, on_error=on_error)
        self.peer = peer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", [])}
        peer = self.peer(scope) if self.peer else (scope.get("client") or [None])[0]
        query = scope.get("query_string", b"").decode("latin-1") or None
        d = await self.client.check_request(
            method=scope["method"], path=scope["path"], headers=headers, peer=peer, query=query
        )
        if not d.allowed:
            status = d.status or (429 if not d.unanswered else 503)
            body = json.dumps(d.problem_json()).encode()
            await send({
                "type": "http.response.start",
                "status": status,
                "headers": _headers(d) + [(b"content-type", b"application/problem+json"),
                                          (b"content-length", str(len(body)).encode())],
            })
            await send({"type": "http.response.body", "body": body})
            return
        status: Optional[int] = None
        ended = False

        async def relay(message: Message) -> None:
            nonlocal status, ended
            if message["type"] == "http.response.start":
                status = message["status"]
                message = dict(message)
                message["headers"] = list(message.get("headers", [])) + _headers(d)
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                ended = True
            await send(message)

        try:
            await self.app(scope, receive, relay)
        finally:
            # Settled only on an answer that ended; a client that left
            # settles nothing. The leases go back either way, even when
            # the app's task is being cancelled.
            if d.unanswered:
                pass
            elif ended and status is not None:
                await asyncio.shield(self.client.settle(d, status))
            else:
                await asyncio.shield(self.client.release(d))
