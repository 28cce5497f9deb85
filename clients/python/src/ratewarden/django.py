"""`SettleMiddleware`: settles the `count: failures` rules a request was
checked against (by `ratewarden.drf.RatewardenThrottle`, or by a view
through `remember`) from its answer's status, and gives back their
`concurrency` leases. A 4xx other than 429 is a failure and a 2xx a
success, or as each rule's `failure_status` says (the gateway's answer
names it).

    MIDDLEWARE = [..., "ratewarden.django.SettleMiddleware"]
"""

from __future__ import annotations

from typing import Any, Callable

from ._django import ATTR, client, remember

__all__ = ["SettleMiddleware", "client", "remember"]


class SettleMiddleware:
    def __init__(self, get_response: Callable[[Any], Any]) -> None:
        self.get_response = get_response

    def __call__(self, request: Any) -> Any:
        response = self.get_response(request)
        for decision in getattr(request, ATTR, None) or []:
            if decision.allowed and not decision.unanswered:
                client().settle(decision, response.status_code)
        return response
