"""The client Django's settings name, made once per process."""

from __future__ import annotations

import threading
from typing import Any, List, Optional

from ._client import Client, Decision

_client: Optional[Client] = None
_lock = threading.Lock()

#: Where the decisions a request's checks made wait for its answer (on the
#: Django request, whichever layer checked).
ATTR = "_ratewarden_decisions"


def client() -> Client:
    """The `Client` of `settings.RATEWARDEN` (`url`, `token`, `timeout`,
    `on_error`)."""
    global _client
    if _client is None:
        with _lock:
            if _client is None:
                from django.conf import settings
                from django.core.exceptions import ImproperlyConfigured

                conf = getattr(settings, "RATEWARDEN", None)
                if not conf or "url" not in conf:
                    raise ImproperlyConfigured(
                        'settings.RATEWARDEN needs at least {"url": "http://127.0.0.1:9090"} '
                        "(the gateway's admin listener)"
                    )
                _client = Client(
                    conf["url"],
                    token=conf.get("token"),
                    timeout=conf.get("timeout", 0.25),
                    on_error=conf.get("on_error", "allow"),
                )
    return _client


def remember(request: Any, decision: Decision) -> None:
    """Keeps `decision` on the Django request (DRF's wraps it), for
    `SettleMiddleware` to settle when the answer is known."""
    target = getattr(request, "_request", request)
    found: List[Decision] = getattr(target, ATTR, None) or []
    found.append(decision)
    setattr(target, ATTR, found)
