"""Clients for the ratewarden gateway's decision API (`/v1/check`,
`/v1/report`, `/v1/explain` on its admin listener).

The gateway decides, so limits are exact across every process and machine
that asks it. A gateway that does not answer within `timeout` is never an
exception in the view: the decision follows `on_error` ("allow" or "deny")
and the failure is logged (logger "ratewarden").
"""

from ._client import AsyncClient, Client, Decision, RatewardenError, __version__

__all__ = ["AsyncClient", "Client", "Decision", "RatewardenError", "__version__"]
