"""Who may do what: the dashboard's token rules.

- Bound to a loopback address (``public=False``): reading needs no token (only this machine can connect).
- Bound to any other address (``public=True``): every request needs the token, reads included.
- Write actions (cancel, rerun) always need the token; with no token configured they are refused (403)
  and the page says how to start ``serve`` with one.

The token is accepted as ``Authorization: Bearer T``, as the ``nexus_eval_token`` cookie, or as ``?token=T``
on a GET, which also sets that cookie (HttpOnly, SameSite=Strict) so the browser's later requests, the POST
forms included, carry it; SameSite=Strict keeps other sites' pages from posting with it. Tokens are compared
with ``hmac.compare_digest``. A write whose ``Origin`` header names another site is refused as well.
"""

from __future__ import annotations

import hmac
import ipaddress
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.requests import Request

COOKIE = "nexus_eval_token"
LOOPBACK_NAMES = {"localhost", "localhost.localdomain"}
READ_METHODS = {"GET", "HEAD"}
HOW_TO_SIGN_IN = "open any page once with ?token=T (it sets a cookie) or send `Authorization: Bearer T`"
HOW_TO_START = (
    "start the dashboard with a token: `nexus-eval serve --token T` (or set NEXUS_EVAL_TOKEN), then " + HOW_TO_SIGN_IN
)


def is_loopback(host: str) -> bool:
    """Whether binding to ``host`` keeps the server reachable from this machine only."""
    host = host.strip("[]")
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class Decision:
    """What to do with one request: let it through (``status`` None), or answer ``status`` with ``reason``;
    ``set_cookie``: the request brought a valid ``?token=``, remember it in the browser."""

    status: int | None = None
    reason: str = ""
    set_cookie: bool = False


@dataclass(frozen=True)
class Access:
    token: str | None
    public: bool

    def _presented(self, request: Request) -> tuple[str | None, bool]:
        """(token the request carries, whether it came as ?token=)."""
        header = request.headers.get("authorization", "")
        if header[:7].lower() == "bearer ":
            return header[7:].strip(), False
        if request.method in READ_METHODS and "token" in request.query_params:
            return request.query_params["token"], True
        return request.cookies.get(COOKIE), False

    def _valid(self, presented: str | None) -> bool:
        if not self.token or presented is None:
            return False
        return hmac.compare_digest(presented.encode("utf-8"), self.token.encode("utf-8"))

    def decide(self, request: Request) -> Decision:
        presented, from_query = self._presented(request)
        valid = self._valid(presented)
        if request.method not in READ_METHODS:
            if not self.token:
                return Decision(403, "write actions are off because this dashboard has no token: " + HOW_TO_START)
            if not valid:
                return Decision(401, "this action needs the dashboard's token: " + HOW_TO_SIGN_IN)
            if not _same_origin(request):
                return Decision(403, "a write action from another site's page is refused")
            return Decision()
        if self.public and not valid:
            reason = "this dashboard is reachable from the network, so every page needs its token: "
            return Decision(401, reason + HOW_TO_SIGN_IN)
        return Decision(set_cookie=valid and from_query)


def _same_origin(request: Request) -> bool:
    """No ``Origin`` header (curl, scripts), or one naming this server's own host:port."""
    origin = request.headers.get("origin")
    if not origin or origin == "null":
        return origin is None
    return urlsplit(origin).netloc.lower() == request.headers.get("host", "").lower()
