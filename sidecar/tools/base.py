"""The Tool interface every tool implements, and what a tool call gets and gives back.

A Tool has a name the model calls, a description and a JSON Schema of its arguments
(sent to the provider as a ToolSpec), the source it comes from (for ``tool:list``), a
default approval policy (``ask`` for anything that writes or executes) and an async
``run(args, ctx)``. Must stay true:
- ``run`` gets arguments already validated against ``parameters``;
- a tool reports a failure the model should see by raising ToolError (its message becomes
  an error result); any other exception is a bug, logged, and also becomes an error result;
- cancellation is never swallowed: a cancelled ``run`` stops its work (kills its process)
  and re-raises.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from protocol.tools import ToolSource
from protocol.types import Citation, SessionV2
from sidecar.providers.types import ToolSpec

if TYPE_CHECKING:
    from sidecar.retrieval.citations import CitationLedger

__all__ = ["Tool", "ToolContext", "ToolOutput", "ToolError", "Policy", "Feature"]

Policy = Literal["auto", "ask", "deny"]
Feature = Literal["memory", "soul", "knowledge"]


class ToolError(Exception):
    """A failure the model should see as the tool's (error) result."""


class ToolOutput(msgspec.Struct, kw_only=True):
    text: str
    is_error: bool = False
    citations: list[Citation] = []
    """The Citation records of the knowledge chunks this result showed the model (numbered
    in the reply's ledger, ``ToolContext.citations``); the reply may cite their markers."""
    spilled: Path | None = None
    """The file the whole output was saved to (set by ToolRegistry.execute; the reply owns it)."""


class ToolContext(msgspec.Struct, kw_only=True):
    session: SessionV2
    message_id: str
    tool_call_id: str
    data_dir: Path
    workspace: Path | None = None
    """The session's workspace directory when it has one."""
    citations: CitationLedger | None = None
    """The reply's citation ledger: a knowledge tool numbers what it shows in it."""


class Tool:
    name: str = ""
    description: str = ""
    parameters: dict[str, Any] = {"type": "object", "properties": {}}
    source: ToolSource = "local"
    default_policy: Policy = "auto"
    server_key: str | None = None
    """A second policy key (``mcp:<server>``) consulted when the tool has no policy of its own."""
    feature: Feature | None = None
    """The assistant feature that brings this tool (its memory, its Soul.md, its knowledge
    bases): such a tool follows that feature's switch, not ``enabledTools``."""
    timeout_s: float | None = None
    """None: the configured default (ToolSettings.toolTimeoutS)."""
    prompt: str | None = None
    """Text this tool adds to the system prompt (seed 000 section 4, item 5)."""

    def preview(self, args: dict[str, Any]) -> str | None:
        """What a call with ``args`` would change, shown with its approval (None: nothing)."""
        return None

    def spec(self) -> ToolSpec:
        return ToolSpec(name=self.name, description=self.description, parameters=self.parameters)

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        raise NotImplementedError


def obj(properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    """A JSON Schema object with these properties and no others."""
    schema: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        schema["required"] = required
    return schema
