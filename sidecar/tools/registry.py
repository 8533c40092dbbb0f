"""ToolRegistry: the tools of one request, in the seed's order, and how a call is run.

Assembled per request by ToolService.assemble (seed 000 section 3): web search, the
enabled local tools, conversation search, workspace tools, skill tools, MCP tools
(``mcp__{server}__{tool}``), then ``read_tool_output`` and ``get_session_capabilities``.
A later tool with the name of an earlier one is dropped (first wins, logged).

A call from the model is untrusted. ``check`` turns it into (tool, arguments) or an error
text the model sees as the call's result: unknown tool name, arguments that are not JSON
or not an object, arguments that do not match the tool's JSON Schema. ``execute`` runs a
checked call with a time limit; a ToolError, a timeout or a bug in the tool becomes an
error result; cancellation propagates. Every result text goes through the large-output
spill (sidecar/tools/spill.py).
"""

from __future__ import annotations

import logging
from typing import Any

import anyio
import msgspec

from protocol.tools import ToolOfferedBy
from sidecar.providers.types import ToolSpec
from sidecar.tools.base import Tool, ToolContext, ToolError, ToolOutput
from sidecar.tools.spill import spill

__all__ = ["ToolRegistry", "CheckedCall"]

log = logging.getLogger(__name__)

MAX_ARGUMENT_CHARS = 1024 * 1024


class CheckedCall(msgspec.Struct, kw_only=True):
    tool: Any = None
    """The Tool, or None when the call is invalid (``error`` says why)."""
    args: dict[str, Any] = {}
    error: str | None = None


class ToolRegistry:
    def __init__(self, tools: list[Tool] | None = None, *, default_timeout_s: float = 60.0) -> None:
        self._tools: dict[str, Tool] = {}
        self.default_timeout_s = default_timeout_s
        self.capability_note: str | None = None
        """What the model is told about tools it does not have (set by the assembler)."""
        self.offered_by: dict[str, ToolOfferedBy] = {}
        for tool in tools or ():
            self.add(tool)

    def add_note(self, note: str) -> None:
        """Add a paragraph to ``capability_note``."""
        self.capability_note = f"{self.capability_note}\n\n{note}" if self.capability_note else note

    def add(self, tool: Tool, offered_by: ToolOfferedBy = "settings") -> None:
        """``offered_by``: why the request gets it (``tool:list`` shows it)."""
        if tool.name in self._tools:
            log.warning("tool %r is offered twice; keeping the first", tool.name)
            return
        self._tools[tool.name] = tool
        self.offered_by[tool.name] = offered_by

    @property
    def tools(self) -> list[Tool]:
        return list(self._tools.values())

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def specs(self) -> list[ToolSpec]:
        return [t.spec() for t in self._tools.values()]

    def prompts(self) -> list[str]:
        return [t.prompt for t in self._tools.values() if t.prompt]

    def __len__(self) -> int:
        return len(self._tools)

    # ---- one call -------------------------------------------------------------------

    def check(self, name: str, arguments: str) -> CheckedCall:
        tool = self._tools.get(name)
        if tool is None:
            known = ", ".join(sorted(self._tools)) or "none"
            return CheckedCall(error=f"unknown tool {name!r}; the tools available are: {known}")
        if len(arguments) > MAX_ARGUMENT_CHARS:
            return CheckedCall(tool=tool, error=f"the arguments of {name} are too long ({len(arguments)} characters)")
        try:
            args = msgspec.json.decode(arguments.strip() or "{}")
        except (msgspec.DecodeError, RecursionError) as exc:  # RecursionError: nested too deep
            return CheckedCall(tool=tool, error=f"the arguments of {name} are not valid JSON ({exc}); send a JSON object")
        if not isinstance(args, dict):
            return CheckedCall(tool=tool, error=f"the arguments of {name} must be a JSON object, got {type(args).__name__}")
        problem = schema_problem(tool.parameters, args)
        if problem is not None:
            return CheckedCall(tool=tool, error=f"the arguments of {name} do not match its schema: {problem}")
        return CheckedCall(tool=tool, args=args)

    async def execute(self, checked: CheckedCall, ctx: ToolContext) -> ToolOutput:
        """Run a checked call; never raises except cancellation."""
        tool: Tool = checked.tool
        timeout = tool.timeout_s if tool.timeout_s is not None else self.default_timeout_s
        try:
            with anyio.move_on_after(timeout) as scope:
                output = await tool.run(checked.args, ctx)
            if scope.cancelled_caught:
                output = ToolOutput(text=f"the tool {tool.name} timed out after {timeout:g} s", is_error=True)
        except ToolError as exc:
            output = ToolOutput(text=str(exc) or f"{tool.name} failed", is_error=True)
        except anyio.get_cancelled_exc_class():
            raise
        except Exception as exc:
            log.exception("tool %s failed", tool.name)
            output = ToolOutput(text=f"the tool {tool.name} failed: {type(exc).__name__}: {exc}", is_error=True)
        spilled = None
        try:
            text, spilled = await anyio.to_thread.run_sync(
                spill, output.text, ctx.tool_call_id, ctx.workspace, ctx.data_dir
            )
        except (OSError, ToolError) as exc:  # ToolError: the spill path would leave the workspace
            log.warning("could not save a large output of %s: %s", tool.name, exc)
            why = (exc.strerror if isinstance(exc, OSError) else None) or str(exc)
            text = output.text[: 32 * 1024] + f"\n[output truncated; saving it failed: {why}]"
        return ToolOutput(text=text, is_error=output.is_error, citations=output.citations, spilled=spilled)


def schema_problem(schema: dict[str, Any], args: dict[str, Any]) -> str | None:
    """The first way ``args`` breaks ``schema`` (JSON Schema, any draft), or None."""
    if not schema:
        return None
    import jsonschema  # imported on first tool call: not a start-up cost

    try:
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        validator = cls(schema)
        error = jsonschema.exceptions.best_match(validator.iter_errors(args))
    except Exception as exc:
        # a broken schema from an MCP server (bad $ref, unknown type, bad pattern, ...):
        # it validates nothing and the tool judges its arguments
        _log_broken_schema(schema, exc)
        return None
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path)
    return f"{error.message}" + (f" (at {where})" if where else "")


_broken_schemas: set[int] = set()
_MAX_BROKEN_REMEMBERED = 1000


def _log_broken_schema(schema: dict[str, Any], exc: Exception) -> None:
    """Log a broken schema once (not on every call of its tool)."""
    try:
        key = hash(msgspec.json.encode(schema))
    except (TypeError, ValueError, OverflowError):
        key = hash(repr(schema))
    if key in _broken_schemas:
        return
    if len(_broken_schemas) >= _MAX_BROKEN_REMEMBERED:
        _broken_schemas.clear()
    _broken_schemas.add(key)
    log.warning("a tool's JSON Schema is unusable, its arguments are not checked: %s: %s", type(exc).__name__, exc)
