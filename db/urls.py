"""URLs as they may be shown: :func:`masked` hides the password of any URL the service prints, logs or stores.

One function for every kind of URL the service handles: SQLAlchemy database URLs
(``postgresql+psycopg://u:pw@h/db``), Celery broker and result URLs (``redis://:pw@h:6379/0``,
``amqp://u:pw@h//``, ``sqla+sqlite:///...``), HTTP endpoints with userinfo. Standard library only, so any
layer may use it (``db`` is importable by workers, the dashboard and the CLI). Connecting still needs the real
URL: keep it for that, and pass only ``masked(url)`` to anything a person or a log sees.
"""

from __future__ import annotations

import re

#: ``scheme://``: a URL in the sense of this module (a SQLite path or any other text is returned as given)
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://")
#: SQLAlchemy's own reading of the credentials: a password runs to the first '@', '/' and '?' included
_SQLALCHEMY_USERINFO = re.compile(r"[^:/@?#]*:[^@]*@")
#: query parameters that carry secrets (libpq's ``password`` / ``sslpassword``, tokens, keys)
_SECRET_PARAM = re.compile(
    r"(?P<key>[?&;][^=&;#]*?(?:password|passwd|pwd|secret|token|api_?key|access_?key)=)[^&;#]*", re.IGNORECASE
)
MASK = "***"


def masked(url: str) -> str:
    """``url`` with its password replaced by ``***`` (``redis://:***@h:6379/0``, ``postgresql://u:***@h/db``),
    and the values of secret-looking query parameters too (``?password=***``). A URL without a password, and
    text that is not a URL (no ``scheme://``), is returned unchanged; masking twice changes nothing more.

    The credentials are found as both readers of these URLs find them: ``urllib`` (redis-py, kombu: the part
    before the last '@' of the authority) and SQLAlchemy (a password that holds a '/' runs to its '@')."""
    if not isinstance(url, str):
        return url
    scheme = _SCHEME.match(url)
    if scheme is None:
        return url
    start = scheme.end()
    rest = url[start:]
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
    at = authority.rfind("@")
    if at < 0 and not url.lower().startswith(("http://", "https://")):
        found = _SQLALCHEMY_USERINFO.match(rest)  # a password with '/' in it, as SQLAlchemy reads it
        at = found.end() - 1 if found else -1
    if at < 0:
        return _masked_query(url)
    user, colon, _ = rest[:at].partition(":")
    if not colon:  # a user name only: nothing secret to hide
        return url[:start] + rest[:at] + _masked_query(rest[at:])
    return url[:start] + f"{user}:{MASK}" + _masked_query(rest[at:])


def _masked_query(text: str) -> str:
    if "=" not in text:
        return text
    return _SECRET_PARAM.sub(lambda m: m.group("key") + MASK, text)
