"""Names a package exports without importing their modules until first use (a PEP 562 module ``__getattr__``).

``import nexus`` must not load torch: the vocabulary and the settings are plain Python, and the parts that need
torch are imported the first time one of their names is read. Any package with the same need can use it.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any


def lazy_attribute(package: str, where: Mapping[str, str], name: str, namespace: dict[str, Any]) -> Any:
    """``name`` from the module ``where`` maps it to, imported now and kept in ``namespace`` (the package's
    globals) so that later reads find it there; AttributeError, as for any missing attribute, for other names."""
    if name not in where:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(where[name]), name)
    namespace[name] = value
    return value
