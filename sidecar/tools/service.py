"""ToolService: tool settings and the per-request assembly of the ToolRegistry.

``assemble(session, model)`` builds the registry of one request in seed 000's order
(section 3): the memory tools first when the session's assistant has memory on (and
``soul_update`` when it may evolve its Soul.md; sidecar/memory/tools.py), then ``knowledge_search`` when the session's assistant has knowledge bases
(the knowledge tools come before the others), web search (when configured), the enabled local tools, conversation search,
workspace tools (when the session has a workspace dir), skill tools (when skills exist),
MCP tools, then ``read_tool_output`` and ``get_session_capabilities``. A model without
tool support (ModelInfo.supports_tools false), or tools switched off in the settings,
gets an empty registry and a short ``capability_note`` for the system prompt instead, so
the model does not claim to run tools it cannot. MCP tools are those of the servers that
are ready at that moment (assembly never waits for a server to connect); the enabled
servers that are not get named in a capability note (``mcp_unavailable_note``).

Settings live in the settings table under ``tools`` (JSON of protocol ToolSettings).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import anyio
import msgspec

from protocol.common import EmptyParams
from protocol.messages import SearchOptions
from protocol.tools import ToolInfo, ToolListParams, ToolSettings, ToolSettingsUpdate
from protocol.types import SearchResult, SessionV2
from sidecar.errors import InvalidParams
from sidecar.providers.types import ModelInfo
from sidecar.tools.base import Tool
from sidecar.tools.conversation import ConversationSearch
from sidecar.tools.knowledge import NO_KNOWLEDGE, KnowledgeOffer, KnowledgeSource
from sidecar.tools.local import LOCAL_TOOLS, ReadToolOutput, SessionCapabilities
from sidecar.tools.registry import ToolRegistry
from sidecar.tools.skills import find_skills, skill_roots, skill_tools
from sidecar.tools.web import SearxngBackend, WebSearch
from sidecar.tools.workspace import workspace_tools

__all__ = ["ToolService", "SETTINGS_KEY", "NO_TOOLS_NOTE", "mcp_unavailable_note"]

log = logging.getLogger(__name__)

SETTINGS_KEY = "tools"
NO_TOOLS_NOTE = (
    "Capabilities: in this conversation you cannot call tools. You cannot search the web, read "
    "or write files, run commands or look up other conversations; do not claim or pretend to. "
    "Answer from the conversation and your own knowledge."
)


def mcp_unavailable_note(servers: list[tuple[str, str]]) -> str:
    """What the model is told about enabled MCP servers that are not ready: (name, state)."""
    named = ", ".join(f"{name} ({'still connecting' if state == 'connecting' else 'failed'})" for name, state in servers)
    return (
        f"Capabilities: the tools of these MCP servers are not available right now: {named}. "
        "Do not claim to use them; if the user asks for them, say they are unavailable at the moment."
    )


class McpSource(Protocol):
    """The MCP tools of a request (sidecar/tools/mcp.py McpManager)."""

    @property
    def configured(self) -> bool: ...
    def tools(self) -> Sequence[Tool]: ...
    def unavailable(self) -> list[tuple[str, str]]: ...


class MemorySource(Protocol):
    """The memory side (sidecar/memory MemoryService.offer): ``.tools`` and ``.retrieval``."""

    async def offer(self, session: SessionV2 | None) -> Any: ...


class ToolService:
    def __init__(
        self,
        *,
        data_dir: Path,
        get_setting: Callable[[str], Awaitable[str | None]],
        set_setting: Callable[[str, str | None], Awaitable[None]],
        search: Callable[[str, SearchOptions], Awaitable[list[SearchResult]]],
        policies: Callable[[list[str]], Awaitable[dict[str, Any]]],
        mcp: McpSource | None = None,
        extra_tools: Callable[[], list[Tool]] | None = None,
        web_transport: Any = None,
        knowledge: KnowledgeSource | None = None,
        memory: MemorySource | None = None,
    ) -> None:
        self._data_dir = data_dir
        self._get_setting = get_setting
        self._set_setting = set_setting
        self._search = search
        self._policies = policies
        self.mcp = mcp
        self._extra = extra_tools
        """Tests add tools here (after MCP tools, before the system tools)."""
        self._web_transport = web_transport
        self.knowledge = knowledge
        """The knowledge bases' tools and retrieval capabilities (sidecar/retrieval)."""
        self.memory = memory
        """The memory tools and memory capabilities (sidecar/memory)."""
        self._settings = ToolSettings()
        self._web: SearxngBackend | None = None

    async def load(self) -> None:
        raw = await self._get_setting(SETTINGS_KEY)
        if raw:
            try:
                self._settings = msgspec.json.decode(raw, type=ToolSettings)
            except msgspec.DecodeError:
                log.error("stored tool settings are unreadable; using the defaults")

    @property
    def settings(self) -> ToolSettings:
        return self._settings

    # ---- methods --------------------------------------------------------------------

    async def get_settings(self, params: EmptyParams | None = None) -> ToolSettings:
        return self._settings

    async def update_settings(self, params: ToolSettingsUpdate) -> ToolSettings:
        s = self._settings
        changes: dict[str, Any] = {}
        for field in ("enabled", "conversation_search", "tool_timeout_s", "command_timeout_s"):
            value = getattr(params, field)
            if value is not None:
                changes[field] = value
        for field in ("tool_timeout_s", "command_timeout_s"):
            if field in changes and not 0 < changes[field] <= 3600:
                raise InvalidParams(f"invalid params: {field} must be in (0, 3600]")
        if params.local_tools is not None:
            unknown = [n for n in params.local_tools if n not in LOCAL_TOOLS]
            if unknown:
                raise InvalidParams(
                    f"invalid params: unknown local tools {unknown}; known: {sorted(LOCAL_TOOLS)} - at `$.localTools`"
                )
            changes["local_tools"] = list(dict.fromkeys(params.local_tools))
        if params.skills_dirs is not None:
            if any(not isinstance(d, str) or not Path(d).is_absolute() for d in params.skills_dirs):
                raise InvalidParams("invalid params: skillsDirs must be absolute paths - at `$.skillsDirs`")
            changes["skills_dirs"] = list(params.skills_dirs)
        if params.clear_web_search:
            changes["web_search"] = None
        elif params.web_search is not None:
            if not params.web_search.url.startswith(("http://", "https://")):
                raise InvalidParams("invalid params: webSearch.url must be an http(s) URL")
            changes["web_search"] = params.web_search
        updated = msgspec.structs.replace(s, **changes)
        await self._set_setting(SETTINGS_KEY, msgspec.json.encode(updated).decode())
        if "web_search" in changes and self._web is not None:
            await self._web.aclose()
            self._web = None
        self._settings = updated
        return updated

    async def list_tools(self, params: ToolListParams) -> list[ToolInfo]:
        session = None
        if params.session_id is not None and self._session_lookup is not None:
            session = await self._session_lookup(params.session_id)
        registry = await self.assemble(session, ModelInfo(id="", supports_tools=True))
        names = [t.name for t in registry.tools]
        keys = names + [t.server_key for t in registry.tools if t.server_key]
        stored = await self._policies(keys)
        out = []
        for t in registry.tools:
            policy = stored.get(t.name) or (stored.get(t.server_key) if t.server_key else None)
            out.append(
                ToolInfo(
                    name=t.name, description=t.description, source=t.source,
                    policy=policy.policy if policy is not None else t.default_policy,
                    default_policy=t.default_policy, parameters=t.parameters,
                )
            )
        return out

    _session_lookup: Callable[[str], Awaitable[SessionV2]] | None = None

    def set_session_lookup(self, lookup: Callable[[str], Awaitable[SessionV2]]) -> None:
        self._session_lookup = lookup

    # ---- assembly -------------------------------------------------------------------

    async def assemble(self, session: SessionV2 | None, model: ModelInfo) -> ToolRegistry:
        s = self._settings
        registry = ToolRegistry(default_timeout_s=s.tool_timeout_s)
        if not s.enabled or not model.supports_tools:
            registry.capability_note = NO_TOOLS_NOTE
            return registry
        memory_retrieval: dict[str, Any] = {"enabled": False}
        if self.memory is not None:
            try:
                memory = await self.memory.offer(session)
            except anyio.get_cancelled_exc_class():
                raise
            except Exception:  # memory is an addition: the other tools still come
                log.exception("the memory tools could not be assembled")
            else:
                memory_retrieval = memory.retrieval
                for tool in memory.tools:
                    registry.add(tool)
        knowledge = NO_KNOWLEDGE
        if self.knowledge is not None:
            try:
                knowledge = await self.knowledge.offer(session)
            except anyio.get_cancelled_exc_class():
                raise
            except Exception:  # knowledge is an addition: the other tools still come
                log.exception("the knowledge tools could not be assembled")
        for tool in knowledge.tools:
            registry.add(tool)
        if s.web_search is not None:
            if self._web is None:
                self._web = SearxngBackend(s.web_search, transport=self._web_transport)
            registry.add(WebSearch(self._web, s.web_search.max_results))
        for name in s.local_tools:
            factory = LOCAL_TOOLS.get(name)
            if factory is not None:
                registry.add(factory())
        if s.conversation_search:
            registry.add(ConversationSearch(self._search))
        if session is not None and session.workspace_dir:
            for tool in workspace_tools(s.command_timeout_s):
                registry.add(tool)
        roots = [r for r in skill_roots(s.skills_dirs, self._data_dir) if r.is_dir()]
        # one stat per root on the loop is short; the scan itself runs in a worker thread
        skills = await anyio.to_thread.run_sync(find_skills, roots) if roots else []
        if skills:
            for tool in skill_tools(skills):
                registry.add(tool)
        if self.mcp is not None and self.mcp.configured:
            for tool in self.mcp.tools():
                registry.add(tool)
            unavailable = self.mcp.unavailable()
            if unavailable:
                registry.add_note(mcp_unavailable_note(unavailable))
        if self._extra is not None:
            for tool in self._extra():
                registry.add(tool)
        registry.add(ReadToolOutput())
        registry.add(SessionCapabilities(lambda: _capabilities(registry, session, knowledge, memory_retrieval)))
        return registry

    async def aclose(self) -> None:
        if self._web is not None:
            await self._web.aclose()


def _capabilities(
    registry: ToolRegistry, session: SessionV2 | None, knowledge: KnowledgeOffer, memory: dict[str, Any]
) -> dict[str, Any]:
    return {
        "tools": [{"name": t.name, "source": t.source, "description": t.description} for t in registry.tools],
        "workspace": session.workspace_dir if session is not None else None,
        "retrieval": {"knowledge_base": knowledge.retrieval, "memory": memory},
        "web_search": registry.get("web_search") is not None,
        "conversation_search": registry.get("search_conversations") is not None,
        "max_steps": 256,
    }
