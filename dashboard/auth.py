"""Who may do what: the dashboard's token rules.

- Bound to a loopback address (``public=False``): reading needs no token (only this machine can connect).
- Bound to any other address (``public=True``): every request needs the token, reads included.
- Write actions (cancel, rerun) always need the token; with no token configured they are refused (403)
  and the page says how to start ``serve`` with one.

The token is accepted as ``Authorization: Bearer T``, as the ``nexus_eval_token`` cookie, or as ``?token=T``
on a GET, which is answered with a redirect to the same address without it (so it leaves the address bar and
the history) that sets that cookie (HttpOnly, SameSite=Strict); the browser's later requests, the POST forms
included, carry it; SameSite=Strict keeps other sites' pages from posting with it. Tokens are compared with
``hmac.compare_digest`` and must be at least ``MIN_TOKEN_LENGTH`` characters. A write whose ``Origin`` header
names another site is refused as well.

Before any of that, the ``Host`` header must name this server: a loopback name or address (any port), the
address ``serve`` listens on, or a name the operator allowed (``serve --allowed-host``); anything else is a
400. A DNS-rebinding page (``attacker.example`` resolved to 127.0.0.1) sends its own name, so it reads nothing.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.requests import Request

COOKIE = "nexus_eval_token"
MIN_TOKEN_LENGTH = 16
LOOPBACK_NAMES = {"localhost", "localhost.localdomain"}
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})  # always allowed in Host (so is any loopback address)
WILDCARD_ADDRESSES = {"0.0.0.0", "::"}  # listening on every address: no name of its own to allow
READ_METHODS = {"GET", "HEAD"}
HOW_TO_SIGN_IN = "open any page once with ?token=T (it sets a cookie) or send `Authorization: Bearer T`"
HOW_TO_START = (
    "start the dashboard with a token: set NEXUS_EVAL_TOKEN or give `nexus-eval serve --token-file PATH` "
    "(16 characters or more), then " + HOW_TO_SIGN_IN
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


def is_wildcard(host: str) -> bool:
    """Whether listening on ``host`` means every address of this machine (``0.0.0.0``, ``::``)."""
    return host.strip("[]") in WILDCARD_ADDRESSES


def host_name(value: str) -> str:
    """The host of a ``Host`` header (or an allowed-host setting) as compared: lower case, no port, no brackets
    around an IPv6 address, no trailing dot: ``"[::1]:8800"`` -> ``"::1"``, ``"Example.ORG:80"`` ->
    ``"example.org"``. ``""`` for a malformed one (``"[::1"``)."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        rest = value[end + 1 :] if end > 0 else "?"
        return value[1:end] if rest == "" or rest.startswith(":") else ""
    if value.count(":") == 1:  # name:port (a bare IPv6 address has two or more)
        value = value.split(":", 1)[0]
    return value.rstrip(".")


def checked_host(value: str) -> str:
    """An allowed-host setting as ``host_name`` compares it; ValueError for an empty one, a pattern or a URL."""
    name = host_name(value)
    if not name or any(c in name for c in "*/?#@\\") or any(c.isspace() for c in name):
        raise ValueError(f"not an allowed host name: {value!r} (give a host name or an address, e.g. dash.example)")
    return name


def allowed_hosts_for(listen: str, extra: Iterable[str] = ()) -> set[str]:
    """The ``Host`` names a server listening on ``listen`` answers to: the loopback names, ``listen`` itself
    (unless it is a wildcard address) and ``extra`` (the operator's ``--allowed-host``)."""
    names = set(LOOPBACK_HOSTS) | {checked_host(h) for h in extra}
    if not is_wildcard(listen):
        names.add(checked_host(listen))
    return names


@dataclass(frozen=True)
class HostCheck:
    """Which ``Host`` headers are answered: a name in ``allowed`` or any loopback name or address."""

    allowed: frozenset[str]

    @classmethod
    def of(cls, hosts: Iterable[str]) -> HostCheck:
        return cls(frozenset({*LOOPBACK_HOSTS, *(checked_host(h) for h in hosts)}))

    def refuses(self, request: Request) -> str | None:
        """Why the request's ``Host`` is refused, or None."""
        header = request.headers.get("host", "")
        name = host_name(header)
        if name and (name in self.allowed or is_loopback(name)):
            return None
        shown = header[:100] if header.isprintable() else "(unprintable)"
        return (
            f"this dashboard does not answer to the host name {shown!r}: open it by the address it listens on "
            "(or start `nexus-eval serve` with --allowed-host NAME for a name that reaches it)\n"
        )


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
