from __future__ import annotations

import http.client
import json
import logging
import queue
import threading
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

__version__ = "0.1.0"

log = logging.getLogger("ratewarden")


class RatewardenError(Exception):
    """The gateway cannot be used as configured (a refused admin token, a
    URL that is not a gateway). Raised by `ping()` and by calls that have no
    `on_error` to fall back on (`report`, `explain`)."""


@dataclass
class Decision:
    """The gateway's answer to a check, or `on_error`'s when it gave none."""

    allowed: bool
    retry_after: Optional[float] = None
    remaining: Optional[int] = None
    limit: Optional[int] = None
    reset_after: Optional[float] = None
    rule: Optional[str] = None
    reason: Optional[str] = None
    lease: Optional[int] = None
    #: The rate-limit headers the proxy would send with this decision.
    headers: Dict[str, str] = field(default_factory=dict)
    #: Every matched rule's part: `rule`, `key`, `allowed`, `count`,
    #: `failure_status`, `lease`...
    rules: List[Dict[str, Any]] = field(default_factory=list)
    #: A refusal that is not a limit (403, 400, 401): its status and problem.
    status: Optional[int] = None
    problem: Optional[Dict[str, Any]] = None
    #: True when the gateway gave no answer and `on_error` decided.
    unanswered: bool = False

    @classmethod
    def from_json(cls, v: Mapping[str, Any]) -> "Decision":
        return cls(
            allowed=bool(v.get("allowed")),
            retry_after=v.get("retry_after"),
            remaining=v.get("remaining"),
            limit=v.get("limit"),
            reset_after=v.get("reset_after"),
            rule=v.get("rule"),
            reason=v.get("reason"),
            lease=v.get("lease"),
            headers=dict(v.get("headers") or {}),
            rules=list(v.get("rules") or []),
            status=v.get("status"),
            problem=v.get("problem"),
        )

    def problem_json(self) -> Dict[str, Any]:
        """The body of a 429 (RFC 9457), as the gateway writes one."""
        if self.problem:
            return dict(self.problem)
        by = next((r for r in self.rules if not r.get("allowed", True)), None)
        body: Dict[str, Any] = {"type": "about:blank", "title": "Too Many Requests", "status": 429}
        if by:
            body["detail"] = f"rate limit '{by.get('rule')}' exceeded"
        if self.retry_after is not None:
            body["retry_after"] = self.retry_after
        return body


def settle_outcome(part: Mapping[str, Any], status: int) -> Optional[str]:
    """What an answer's `status` settles for a `count: failures` rule's
    part of a decision: "failure", "success", or None (a 429 and statuses
    outside both settle nothing)."""
    if part.get("count") != "failures":
        return None
    if status == 429:
        return None
    ranges: Sequence[Sequence[int]] = part.get("failure_status") or [[400, 428], [430, 499]]
    if any(lo <= status <= hi for lo, hi in ranges):
        return "failure"
    if 200 <= status < 300:
        return "success"
    return None


def _on_error(on_error: str, why: str) -> Decision:
    log.warning("ratewarden: the gateway gave no decision (%s); on_error=%s", why, on_error)
    return Decision(allowed=on_error != "deny", unanswered=True, status=None if on_error != "deny" else 503)


class Client:
    """A client of one gateway: keep-alive connections, at most
    `pool_size` at once, each call bounded by `timeout` seconds."""

    def __init__(
        self,
        url: str,
        token: Optional[str] = None,
        timeout: float = 0.25,
        on_error: str = "allow",
        pool_size: int = 8,
    ) -> None:
        if on_error not in ("allow", "deny"):
            raise ValueError("on_error is 'allow' or 'deny'")
        u = urllib.parse.urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"{url!r}: the admin listener's http:// or https:// URL")
        self._https = u.scheme == "https"
        self._host = u.hostname
        self._port = u.port or (443 if self._https else 80)
        self._base = u.path.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.on_error = on_error
        self._pool: "queue.LifoQueue[http.client.HTTPConnection]" = queue.LifoQueue()
        self._slots = threading.BoundedSemaphore(pool_size)

    # The transport: one request on a pooled connection, retried once on a
    # fresh one when a kept connection turns out closed.
    def _connection(self) -> http.client.HTTPConnection:
        try:
            return self._pool.get_nowait()
        except queue.Empty:
            cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            return cls(self._host, self._port, timeout=self.timeout)

    def _request(self, method: str, path: str, body: Optional[Dict[str, Any]] = None) -> Tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        if not self._slots.acquire(timeout=self.timeout):
            raise TimeoutError(f"no connection free within {self.timeout}s")
        try:
            for attempt in (0, 1):
                conn = self._connection()
                try:
                    conn.request(method, self._base + path, body=data, headers=headers)
                    r = conn.getresponse()
                    raw = r.read()
                except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                    conn.close()
                    if attempt == 0:
                        continue
                    raise
                except Exception:
                    conn.close()
                    raise
                if r.will_close:
                    conn.close()
                else:
                    self._pool.put(conn)
                if r.status == 401:
                    raise RatewardenError(
                        "the gateway refused the admin token (401): set `token` to its admin.token"
                    )
                try:
                    return r.status, json.loads(raw) if raw else None
                except ValueError:
                    raise RatewardenError(f"{self._host}:{self._port} answered {r.status} without JSON: is it ratewarden's admin listener?")
            raise AssertionError("unreachable")
        finally:
            self._slots.release()

    def _decide(self, body: Dict[str, Any]) -> Decision:
        try:
            status, v = self._request("POST", "/v1/check", body)
        except RatewardenError as e:
            log.error("ratewarden: %s", e)
            return _on_error(self.on_error, str(e))
        except Exception as e:  # down, slow, unreachable
            return _on_error(self.on_error, f"{type(e).__name__}: {e}")
        if status >= 500 or not isinstance(v, dict):
            return _on_error(self.on_error, f"the gateway answered {status}")
        if status != 200:
            return Decision(allowed=False, status=status, problem=v)
        return Decision.from_json(v)

    def ping(self) -> None:
        """Raises RatewardenError when the gateway is unreachable or refuses
        the token: call it at startup."""
        try:
            status, _ = self._request("GET", "/v1/rules")
        except RatewardenError:
            raise
        except Exception as e:
            raise RatewardenError(f"the gateway at {self._host}:{self._port} does not answer: {e}") from e
        if status != 200:
            raise RatewardenError(f"the gateway answered {status} to GET /v1/rules")

    def check(self, rule: str, key: str, cost: int = 1, identity: Optional[str] = None) -> Decision:
        """Charges `cost` to `rule`'s `key`."""
        body: Dict[str, Any] = {"rule": rule, "key": str(key), "cost": cost}
        if identity is not None:
            body["identity"] = identity
        return self._decide(body)

    def check_request(
        self,
        method: str = "GET",
        path: str = "/",
        headers: Optional[Mapping[str, str]] = None,
        peer: Optional[str] = None,
        identity: Optional[str] = None,
        host: Optional[str] = None,
        query: Optional[str] = None,
        body: Any = None,
        cost: Optional[int] = None,
    ) -> Decision:
        """Decides a request as the gateway's proxy would: every rule it
        matches, all or nothing."""
        request: Dict[str, Any] = {"method": method, "path": path}
        for k, v in (("headers", dict(headers) if headers else None), ("peer", peer),
                     ("identity", identity), ("host", host), ("query", query), ("body", body)):
            if v is not None:
                request[k] = v
        b: Dict[str, Any] = {"request": request}
        if cost is not None:
            b["cost"] = cost
        return self._decide(b)

    def report(
        self,
        rule: str,
        key: str,
        outcome: Optional[str] = None,
        lease: Optional[int] = None,
        cost: Optional[int] = None,
        reserved: Optional[int] = None,
        used: Optional[int] = None,
        identity: Optional[str] = None,
    ) -> Optional[Dict[str, Any]]:
        """Settles a rule: a `count: failures` outcome, a `concurrency`
        lease given back, or a cost known after the answer. A gateway that
        does not answer is logged, and None returned."""
        body: Dict[str, Any] = {"rule": rule, "key": str(key)}
        for k, v in (("outcome", outcome), ("lease", lease), ("cost", cost),
                     ("reserved", reserved), ("used", used), ("identity", identity)):
            if v is not None:
                body[k] = v
        try:
            status, v = self._request("POST", "/v1/report", body)
        except Exception as e:
            log.warning("ratewarden: a report to %s was not delivered: %s", rule, e)
            return None
        if status != 200:
            log.warning("ratewarden: a report to %s was refused (%s): %s", rule, status, v)
            return None
        return v

    def settle(self, decision: Decision, status: int) -> None:
        """Settles every `count: failures` rule of `decision` on the answer's
        `status`, and gives back its `concurrency` leases."""
        for part in decision.rules:
            outcome = settle_outcome(part, status)
            if outcome:
                self.report(part["rule"], part["key"], outcome=outcome)
        self.release(decision)

    def release(self, decision: Decision) -> None:
        """Gives back the `concurrency` leases `decision` holds."""
        for part in decision.rules:
            if part.get("lease") is not None:
                self.report(part["rule"], part["key"], lease=part["lease"])

    def explain(self, **params: str) -> Dict[str, Any]:
        """What the gateway would decide for a described request, charging
        nothing (`GET /v1/explain`)."""
        status, v = self._request("GET", "/v1/explain?" + urllib.parse.urlencode(params))
        if status != 200:
            raise RatewardenError(f"explain answered {status}: {v}")
        return v

    def close(self) -> None:
        while True:
            try:
                self._pool.get_nowait().close()
            except queue.Empty:
                return


class AsyncClient:
    """`Client`'s twin for asyncio, on httpx (`pip install ratewarden[async]`)."""

    def __init__(
        self,
        url: str,
        token: Optional[str] = None,
        timeout: float = 0.25,
        on_error: str = "allow",
        pool_size: int = 8,
    ) -> None:
        import httpx

        if on_error not in ("allow", "deny"):
            raise ValueError("on_error is 'allow' or 'deny'")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.on_error = on_error
        self._http = httpx.AsyncClient(
            base_url=url.rstrip("/"),
            headers=headers,
            timeout=timeout,
            limits=httpx.Limits(max_connections=pool_size, max_keepalive_connections=pool_size),
        )

    async def _decide(self, body: Dict[str, Any]) -> Decision:
        try:
            r = await self._http.post("/v1/check", json=body)
        except Exception as e:
            return _on_error(self.on_error, f"{type(e).__name__}: {e}")
        if r.status_code == 401:
            log.error("ratewarden: the gateway refused the admin token (401)")
            return _on_error(self.on_error, "401")
        if r.status_code >= 500:
            return _on_error(self.on_error, f"the gateway answered {r.status_code}")
        try:
            v = r.json()
        except ValueError:
            return _on_error(self.on_error, "an answer without JSON")
        if r.status_code != 200:
            return Decision(allowed=False, status=r.status_code, problem=v)
        return Decision.from_json(v)

    async def ping(self) -> None:
        try:
            r = await self._http.get("/v1/rules")
        except Exception as e:
            raise RatewardenError(f"the gateway does not answer: {e}") from e
        if r.status_code == 401:
            raise RatewardenError("the gateway refused the admin token (401): set `token` to its admin.token")
        if r.status_code != 200:
            raise RatewardenError(f"the gateway answered {r.status_code} to GET /v1/rules")

    async def check(self, rule: str, key: str, cost: int = 1, identity: Optional[str] = None) -> Decision:
        body: Dict[str, Any] = {"rule": rule, "key": str(key), "cost": cost}
        if identity is not None:
            body["identity"] = identity
        return await self._decide(body)

    async def check_request(self, method: str = "GET", path: str = "/", headers: Optional[Mapping[str, str]] = None,
                            peer: Optional[str] = None, identity: Optional[str] = None, host: Optional[str] = None,
                            query: Optional[str] = None, body: Any = None, cost: Optional[int] = None) -> Decision:
        request: Dict[str, Any] = {"method": method, "path": path}
        for k, v in (("headers", dict(headers) if headers else None), ("peer", peer),
                     ("identity", identity), ("host", host), ("query", query), ("body", body)):
            if v is not None:
                request[k] = v
        b: Dict[str, Any] = {"request": request}
        if cost is not None:
            b["cost"] = cost
        return await self._decide(b)

    async def report(self, rule: str, key: str, **fields: Any) -> Optional[Dict[str, Any]]:
        body: Dict[str, Any] = {"rule": rule, "key": str(key)}
        body.update({k: v for k, v in fields.items() if v is not None})
        try:
            r = await self._http.post("/v1/report", json=body)
        except Exception as e:
            log.warning("ratewarden: a report to %s was not delivered: %s", rule, e)
            return None
        if r.status_code != 200:
            log.warning("ratewarden: a report to %s was refused (%s)", rule, r.status_code)
            return None
        return r.json()

    async def settle(self, decision: Decision, status: int) -> None:
        for part in decision.rules:
            outcome = settle_outcome(part, status)
            if outcome:
                await self.report(part["rule"], part["key"], outcome=outcome)
        await self.release(decision)

    async def release(self, decision: Decision) -> None:
        for part in decision.rules:
            if part.get("lease") is not None:
                await self.report(part["rule"], part["key"], lease=part["lease"])

    async def explain(self, **params: str) -> Dict[str, Any]:
        r = await self._http.get("/v1/explain", params=params)
        if r.status_code != 200:
            raise RatewardenError(f"explain answered {r.status_code}")
        return r.json()

    async def aclose(self) -> None:
        await self._http.aclose()
