"""`RatewardenThrottle`: a Django REST framework throttle that asks the
gateway, so a limit holds exactly across every worker and machine.

    REST_FRAMEWORK = {"DEFAULT_THROTTLE_CLASSES": ["ratewarden.drf.RatewardenThrottle"]}
    RATEWARDEN = {"url": "http://127.0.0.1:9090", "token": "...", "on_error": "allow"}

    class CouponView(APIView):
        ratewarden_rule = "coupon"
        ratewarden_key = "user"          # or "ip", or a callable(request) -> str

A view without `ratewarden_rule` is not throttled. `wait()` is the
decision's `retry_after`, so DRF answers 429 with `Retry-After` itself.
The client's address is DRF's own `get_ident` (which honours
`NUM_PROXIES`).
"""

from __future__ import annotations

from typing import Any, Optional

from rest_framework.throttling import BaseThrottle

from ._django import client, remember

__all__ = ["RatewardenThrottle"]


class RatewardenThrottle(BaseThrottle):
    def __init__(self) -> None:
        self._wait: Optional[float] = None

    def key_of(self, request: Any, view: Any) -> str:
        how = getattr(view, "ratewarden_key", "user")
        if callable(how):
            return str(how(request))
        if how == "ip":
            return self.get_ident(request)
        if how == "user":
            user = getattr(request, "user", None)
            if user is not None and getattr(user, "is_authenticated", False):
                return str(user.pk)
            return self.get_ident(request)
        raise ValueError(f"ratewarden_key is 'user', 'ip' or a callable, not {how!r}")

    def allow_request(self, request: Any, view: Any) -> bool:
        rule = getattr(view, "ratewarden_rule", None)
        if rule is None:
            return True
        decision = client().check(rule, self.key_of(request, view))
        remember(request, decision)
        self._wait = decision.retry_after
        return decision.allowed

    def wait(self) -> Optional[float]:
        return self._wait
