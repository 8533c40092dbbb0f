"""ToolService: tool settings and the per-request assembly of the ToolRegistry.

``assemble(session, model, assistant=, enabled=)`` builds the registry of one request in
seed 000's order (section 3): the memory tools first when the session's assistant has
memory on (and ``soul_update`` when it may evolve its Soul.md; sidecar/memory/tools.py),
then ``knowledge_search`` when it has knowledge bases (the knowledge tools come before
the others), web search (when configured), the enabled local tools,
conversation search, workspace tools (when the session has a workspace dir), skill tools
(when skills exist), MCP tools, then ``read_tool_output`` and ``get_session_capabilities``
(which serve the others, so they come when at least one other tool is offered). Then:
- the assistant's ``enabledTools`` (names, or ``mcp:<server>`` for a whole server) keep only
  what they name; ``[]`` offers none of them; None leaves the list as the settings make it.
  The feature tools are not governed by it: the memory tools come with the assistant's
  ``memory.enabled``, ``soul_update`` with ``context.evolveSoul``, ``knowledge_search``
  with its knowledge bases (a Tool's ``feature``); naming one in ``enabledTools`` is
  refused (``check_enabled_tools``), as is any name that is not a tool here;
- a tool whose policy is ``deny`` (its own stored policy, else its MCP server's) is not
  offered at all: the model never sees it.
A model without tool support (ModelInfo.supports_tools false), tools switched off in the
settings or for the reply (``enabled`` false: a per-send option), or nothing left to
offer, gives an empty registry and a short ``capability_note`` for the system prompt
instead, so the model does not claim to run tools it cannot. MCP tools are those of the
servers that are ready at that moment (assembly never waits for a server to connect); the
enabled servers that are not, and that the assistant would be offered, get named in a
capability note (``mcp_unavailable_note``).

``tool:list {sessionId}`` is the same assembly for the session's assistant and model: it
shows exactly what the model gets, and why each tool is there (``offeredBy``: the tool
settings, the assistant's ``enabledTools``, its memory / Soul.md / knowledge, or a helper
of the others). Stored policies are cached and read again only when the
store's policy counter moved (``policy_version``), so assembling costs no database read on
the way to a reply's first delta.

Settings live in the settings table under ``tools`` (JSON of protocol ToolSettings).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, cast

import anyio
import msgspec

from protocol.common import EmptyParams
from protocol.context import AssistantProfile
from protocol.messages import SearchOptions
from protocol.tools import (
    ToolInfo,
    ToolListParams,
    ToolOfferedBy,
    ToolPolicy,
    ToolPolicyValue,
    ToolSettings,
    ToolSettingsUpdate,
    WebSearchConfig,
)
from protocol.types import SearchResult, SessionV2
from sidecar.errors import InvalidParams
from sidecar.providers.types import ModelInfo
from sidecar.tools.base import Tool
from sidecar.tools.conversation import ConversationSearch
from sidecar.tools.knowledge import NO_KNOWLEDGE, KnowledgeOffer, KnowledgeSearch, KnowledgeSource, knowledge_offer
from sidecar.tools.local import LOCAL_TOOLS, ReadToolOutput, SessionCapabilities, SpillOwners
from sidecar.tools.mcp_config import tool_name_prefix
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


FEATURE_SWITCHES: dict[str, str] = {
    "memory": "memory.enabled",
    "soul": "context.evolveSoul (with context.useSoul)",
    "knowledge": "knowledgeBaseIds",
}
"""The assistant setting that brings each feature's tools."""
MAX_LISTED_NAMES = 60
"""How many valid names an unknown-tool error lists."""


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
    def servers(self) -> dict[str, list[str] | None]: ...


class MemorySource(Protocol):
    """The memory side (sidecar/memory MemoryService.offer): ``.tools`` and ``.retrieval``;
    ``feature_tools``: the names of the tools it can bring -> their feature."""

    async def offer(self, session: SessionV2 | None) -> Any: ...
    @property
    def feature_tools(self) -> Mapping[str, str]: ...


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
        all_policies: Callable[[], Awaitable[dict[str, ToolPolicy]]] | None = None,
        policy_version: Callable[[], int] | None = None,
        memory: MemorySource | None = None,
        spill_owners: SpillOwners | None = None,
    ) -> None:
        """``all_policies`` (every stored policy) with ``policy_version`` (the store's counter
        of policy writes) let assembly cache the policies; without them each assembly reads
        the policies of its tools. ``spill_owners`` (the store's file ownership) lets
        ``read_tool_output`` read a spill an older version wrote, when the session owns it."""
        self._data_dir = data_dir
        self._spill_owners = spill_owners
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
        self._all_policies = all_policies
        self._policy_version = policy_version
        self._cached: dict[str, ToolPolicy] | None = None
        self._cached_version = -1

    async def load(self) -> None:
        raw = await self._get_setting(SETTINGS_KEY)
        if raw:
            try:
                self._settings = msgspec.json.decode(raw, type=ToolSettings)
            except msgspec.DecodeError:
                log.error("stored tool settings are unreadable; using the defaults")
        await self._stored_policies([])  # the cache, before the first reply needs it

    @property
    def settings(self) -> ToolSettings:
        return self._settings

    # ---- methods --------------------------------------------------------------------

    async def get_settings(self, params: EmptyParams | None = None) -> ToolSettings:
        return self._settings

    async def update_settings(self, params: ToolSettingsUpdate) -> ToolSettings:
        """A field left out keeps its value; null resets it to its default (``webSearch``:
        none; ``clearWebSearch`` is the older form of ``webSearch: null``)."""
        s = self._settings
        defaults = ToolSettings()
        changes: dict[str, Any] = {}

        def given(field: str) -> bool:
            return getattr(params, field) is not msgspec.UNSET

        def value(field: str) -> Any:
            got = getattr(params, field)
            return getattr(defaults, field) if got is None else got

        for field in ("enabled", "conversation_search", "tool_timeout_s", "command_timeout_s"):
            if given(field):
                changes[field] = value(field)
        for field in ("tool_timeout_s", "command_timeout_s"):
            if field in changes and not 0 < changes[field] <= 3600:
                raise InvalidParams(f"invalid params: {field} must be in (0, 3600]")
        if given("local_tools"):
            local_tools = value("local_tools")
            unknown = [n for n in local_tools if n not in LOCAL_TOOLS]
            if unknown:
                raise InvalidParams(
                    f"invalid params: unknown local tools {unknown}; known: {sorted(LOCAL_TOOLS)} - at `$.localTools`"
                )
            changes["local_tools"] = list(dict.fromkeys(local_tools))
        if given("skills_dirs"):
            skills_dirs = value("skills_dirs")
            if any(not isinstance(d, str) or not Path(d).is_absolute() for d in skills_dirs):
                raise InvalidParams("invalid params: skillsDirs must be absolute paths - at `$.skillsDirs`")
            changes["skills_dirs"] = list(skills_dirs)
        if params.clear_web_search or params.web_search is None:
            changes["web_search"] = None
        elif isinstance(params.web_search, WebSearchConfig):
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
        """The tools a session's model is offered (its assistant's, its model's), with their
        effective policy; without a session, what the default assistant's model would get."""
        session = None
        assistant = None
        model = ModelInfo(id="", supports_tools=True)
        if params.session_id is not None and self._session_lookup is not None:
            session = await self._session_lookup(params.session_id)
        if self._context_lookup is not None:
            assistant, found = await self._context_lookup(session)
            model = found or model
        registry = await self.assemble(session, model, assistant=assistant)
        stored = await self._stored_policies(_policy_keys(registry.tools))
        out = []
        for t in registry.tools:
            policy = _effective(t, stored)
            out.append(
                ToolInfo(
                    name=t.name, description=t.description, source=t.source, policy=policy,
                    default_policy=t.default_policy, parameters=t.parameters,
                    offered_by=registry.offered_by.get(t.name, "settings"),
                )
            )
        return out

    _context_lookup: Callable[[SessionV2 | None], Awaitable[tuple[AssistantProfile | None, ModelInfo | None]]] | None = None

    def set_context_lookup(
        self, lookup: Callable[[SessionV2 | None], Awaitable[tuple[AssistantProfile | None, ModelInfo | None]]]
    ) -> None:
        """``await lookup(session)`` -> (its assistant profile, its model's facts or None when
        it cannot be resolved): what ``tool:list`` assembles for."""
        self._context_lookup = lookup

    _session_lookup: Callable[[str], Awaitable[SessionV2]] | None = None

    def set_session_lookup(self, lookup: Callable[[str], Awaitable[SessionV2]]) -> None:
        self._session_lookup = lookup

    # ---- assembly -------------------------------------------------------------------

    async def assemble(
        self,
        session: SessionV2 | None,
        model: ModelInfo,
        *,
        assistant: AssistantProfile | None = None,
        enabled: bool = True,
    ) -> ToolRegistry:
        s = self._settings
        registry = ToolRegistry(default_timeout_s=s.tool_timeout_s)
        if not s.enabled or not model.supports_tools or not enabled:
            registry.capability_note = NO_TOOLS_NOTE
            return registry
        named = assistant.enabled_tools if assistant is not None else None
        wanted = set(named) if named is not None else None

        def offered(tool: Tool) -> bool:
            return wanted is None or tool.name in wanted or (tool.server_key is not None and tool.server_key in wanted)

        memory_retrieval: dict[str, Any] = {"enabled": False}
        memory_tools: list[Tool] = []
        if self.memory is not None:
            try:
                memory = await self.memory.offer(session)
            except anyio.get_cancelled_exc_class():
                raise
            except Exception:  # memory is an addition: the other tools still come
                log.exception("the memory tools could not be assembled")
            else:
                memory_retrieval = memory.retrieval
                memory_tools = list(memory.tools)
        knowledge = NO_KNOWLEDGE
        if self.knowledge is not None:
            try:
                knowledge = await knowledge_offer(self.knowledge, session)
            except anyio.get_cancelled_exc_class():
                raise
            except Exception:  # knowledge is an addition: the other tools still come
                log.exception("the knowledge tools could not be assembled")
        # these come first, in this order; they follow their feature's switch, not enabledTools
        candidates: list[Tool] = [*memory_tools, *knowledge.tools]
        unavailable: list[tuple[str, str]] = []
        if wanted != set():  # []: none of the others
            candidates.extend(await self._general_tools(session))
            if self.mcp is not None and self.mcp.configured:
                unavailable = [
                    (name, state) for name, state in self.mcp.unavailable()
                    if wanted is None or f"mcp:{name}" in wanted or any(w.startswith(tool_name_prefix(name)) for w in wanted)
                ]
        candidates = [t for t in candidates if t.feature is not None or offered(t)]
        system: list[Tool] = [
            ReadToolOutput(self._spill_owners),
            SessionCapabilities(lambda: _capabilities(registry, session, knowledge, memory_retrieval)),
        ]
        stored = await self._stored_policies(_policy_keys(candidates + system))
        because: ToolOfferedBy = "settings" if wanted is None else "enabledTools"
        for tool in candidates:
            if _effective(tool, stored) != "deny":
                registry.add(tool, tool.feature or because)
        if len(registry):
            for tool in system:
                if _effective(tool, stored) != "deny":
                    registry.add(tool, "helper")
        else:
            registry.capability_note = NO_TOOLS_NOTE
        if unavailable:
            registry.add_note(mcp_unavailable_note(unavailable))
        return registry

    async def _general_tools(self, session: SessionV2 | None) -> list[Tool]:
        """Every tool the settings enable for the session, before ``enabledTools`` and the
        policies: web search (when configured), the local tools, conversation search, the
        workspace tools, skill tools, MCP tools (of the servers ready now), test tools."""
        s = self._settings
        tools: list[Tool] = []
        if s.web_search is not None:
            if self._web is None:
                self._web = SearxngBackend(s.web_search, transport=self._web_transport)
            tools.append(WebSearch(self._web, s.web_search.max_results))
        for name in s.local_tools:
            factory = LOCAL_TOOLS.get(name)
            if factory is not None:
                tools.append(factory())
        if s.conversation_search:
            tools.append(ConversationSearch(self._search))
        if session is not None and session.workspace_dir:
            tools.extend(workspace_tools(s.command_timeout_s))
        roots = [r for r in skill_roots(s.skills_dirs, self._data_dir) if r.is_dir()]
        # one stat per root on the loop is short; the scan itself runs in a worker thread
        skills = await anyio.to_thread.run_sync(find_skills, roots) if roots else []
        if skills:
            tools.extend(skill_tools(skills))
        if self.mcp is not None and self.mcp.configured:
            tools.extend(self.mcp.tools())
        if self._extra is not None:
            tools.extend(self._extra())
        return tools

    # ---- enabledTools -----------------------------------------------------------------

    def check_enabled_tools(self, names: Sequence[str]) -> None:
        """An assistant's ``enabledTools``: each must name a tool this sidecar can offer (a
        built-in tool whatever the settings enable now, ``mcp:<server>`` or
        ``mcp__<server>__<tool>`` of a configured MCP server, the tool checked when the
        server is ready). InvalidParams naming the entry otherwise, listing the valid names;
        a feature tool (memory, Soul.md, knowledge) is refused with the switch that brings it."""
        general = self._known_general()
        features: dict[str, str] = {KnowledgeSearch.name: "knowledge"}
        if self.memory is not None:
            features.update(self.memory.feature_tools)
        servers = self.mcp.servers() if self.mcp is not None else {}
        for i, name in enumerate(names):
            field = f"enabledTools[{i}]"
            if name in general:
                continue
            feature = features.get(name)
            if feature is not None:
                raise InvalidParams(
                    f"invalid params: {field} {name!r} comes with the assistant's {FEATURE_SWITCHES[feature]},"
                    f" not with enabledTools (tool:list shows it as offeredBy {feature!r}) - at `$.{field}`"
                )
            if name.startswith("mcp:") and name[4:] in servers:
                continue
            if name.startswith("mcp__"):
                # a tool a ready server lists, or a name a server not ready yet could give
                if any(name in (tools or ()) if tools is not None else name.startswith(tool_name_prefix(n))
                       for n, tools in servers.items()):
                    continue
            valid = sorted(general) + [f"mcp:{n}" for n in servers]
            valid += sorted(t for tools in servers.values() for t in tools or ())
            shown = ", ".join(valid[:MAX_LISTED_NAMES]) + (f" and {len(valid) - MAX_LISTED_NAMES} more" if len(valid) > MAX_LISTED_NAMES else "")
            raise InvalidParams(f"invalid params: {field} {name!r} is not a tool here; valid: {shown} - at `$.{field}`")

    def _known_general(self) -> set[str]:
        """The names of the tools ``enabledTools`` may name besides MCP ones."""
        names = {*LOCAL_TOOLS, WebSearch.name, ConversationSearch.name, ReadToolOutput.name, SessionCapabilities.name}
        names.update(t.name for t in workspace_tools(1.0))
        names.update(t.name for t in skill_tools([]))
        if self._extra is not None:
            names.update(t.name for t in self._extra())
        return names

    async def _stored_policies(self, keys: list[str]) -> dict[str, ToolPolicy]:
        """The stored policies of ``keys`` (maybe more): from the cache while the store's
        policy counter has not moved since it was filled."""
        if self._all_policies is None or self._policy_version is None:
            return dict(await self._policies(keys)) if keys else {}
        version = self._policy_version()  # before the read: a write meanwhile moves it again
        if self._cached is None or version != self._cached_version:
            self._cached = await self._all_policies()
            self._cached_version = version
        return self._cached

    async def aclose(self) -> None:
        if self._web is not None:
            await self._web.aclose()


def _policy_keys(tools: Sequence[Tool]) -> list[str]:
    return [t.name for t in tools] + [t.server_key for t in tools if t.server_key]


def _effective(tool: Tool, stored: dict[str, Any]) -> ToolPolicyValue:
    """The policy in effect: the tool's stored one, else its MCP server's, else its default."""
    policy = stored.get(tool.name) or (stored.get(tool.server_key) if tool.server_key else None)
    return cast(ToolPolicyValue, policy.policy) if policy is not None else tool.default_policy


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
