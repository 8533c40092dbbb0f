"""Optional parts of the shipped bundle, and the typed error a missing one gives.

The bundle (tools/bundle.py) ships its core folder and, beside it, parts an app may add:
``vectors`` (numpy and its BLAS: the vector leg of knowledge bases and memory, embedding
models) and ``html`` (selectolax: the text of HTML documents). MCP servers are served by
the core (our own client, sidecar/tools/mcp_client.py). A folder without a part
still serves everything else; a request that needs the part fails with FEATURE_UNAVAILABLE
(``data: {part, module}``), never with an ImportError. A source install (pip) has every
part (they are dependencies).

What must stay true: ``require`` is called before the first import of a part's modules,
at the point a request needs them; it imports nothing itself.
"""

from __future__ import annotations

import importlib.util
from functools import cache

from protocol.errors import ErrorCode
from sidecar.errors import SidecarError

__all__ = ["PARTS", "FeatureUnavailable", "available", "require"]

PARTS: dict[str, tuple[str, str]] = {
    "vectors": ("numpy", "vector search and embedding models (knowledge bases, memory)"),
    "html": ("selectolax", "the text of HTML documents"),
}
"""Part -> (the module it brings, what needs it)."""


class FeatureUnavailable(SidecarError):
    code = ErrorCode.FEATURE_UNAVAILABLE


@cache
def available(part: str) -> bool:
    module, _ = PARTS[part]
    return importlib.util.find_spec(module) is not None


def require(part: str) -> None:
    """Raise FeatureUnavailable when ``part`` is not installed."""
    if not available(part):
        module, needs = PARTS[part]
        raise FeatureUnavailable(
            f"{needs} needs the bundle's optional part {part!r} (module {module}), which is not installed",
            data={"part": part, "module": module},
        )
