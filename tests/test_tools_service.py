"""ToolService assembly (seed order, models without tools), settings, web search over a
loopback HTTP server, skills, conversation search, and the ApprovalService on its own
(policies, remember, audit, in-process ``ask`` for ACP-style callers)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import anyio
import pytest

from protocol.events import ToolApprovalOption
from protocol.sessions import CreateSessionOptions
from protocol.tools import (
    ToolApproveParams,
    ToolAuditListParams,
    ToolListParams,
    ToolPendingListParams,
    ToolPolicySetParams,
    ToolSettingsUpdate,
    WebSearchConfig,
)
from protocol.types import SessionV2
from sidecar.engine.approvals import ApprovalRequest, ApprovalService
from sidecar.errors import InvalidParams, NotFound, SidecarError
from sidecar.providers.types import ModelInfo
from sidecar.store import AsyncStore
from sidecar.tools.base import ToolContext, ToolError
from sidecar.tools.service import NO_TOOLS_NOTE, ToolService

pytestmark = pytest.mark.anyio


class _Search(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        q = parse_qs(urlparse(self.path).query)
        if q.get("q") == ["broken"]:
            body = b"<html>not json</html>"
        else:
            body = json.dumps({"results": [
                {"title": f"About {q['q'][0]}", "url": "https://example.org/1", "content": "first"},
                {"title": "Second", "url": "https://example.org/2", "content": "second", "extra": 1},
            ], "format": q.get("format")}).encode()
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def search_url() -> Any:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Search)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/search"
    server.shutdown()
    server.server_close()


async def test_an_endless_search_answer_is_cut_off_at_the_byte_budget() -> None:
    import httpx2

    from sidecar.tools.web import MAX_RESPONSE_BYTES, SearxngBackend

    sent = 0

    async def endless() -> Any:
        nonlocal sent
        while True:
            sent += 65536
            yield b" " * 65536

    def answer(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, content=endless())

    backend = SearxngBackend(WebSearchConfig(url="http://search.test/search"), transport=httpx2.MockTransport(answer))
    try:
        with anyio.fail_after(10), pytest.raises(ToolError, match="oversized"):
            await backend.search("cats", 5)
    finally:
        await backend.aclose()
    assert MAX_RESPONSE_BYTES < sent <= MAX_RESPONSE_BYTES + 2 * 65536


async def make(tmp_path: Path) -> tuple[AsyncStore, ApprovalService, ToolService]:
    store = await AsyncStore.open(tmp_path / "data")
    approvals = ApprovalService(store)
    service = ToolService(
        data_dir=tmp_path / "data",
        get_setting=lambda key: store.run(lambda db: db.settings.get(key)),
        set_setting=lambda key, value: store.run(lambda db: db.settings.set(key, value)),
        search=lambda query, options: store.run(lambda db: db.search.messages(query, options)),
        policies=approvals.policies_for,
    )
    await service.load()
    service.set_session_lookup(lambda session_id: store.run(lambda db: db.sessions.get(session_id)))
    return store, approvals, service


def ctx(session: SessionV2, tmp_path: Path) -> ToolContext:
    return ToolContext(session=session, message_id="m", tool_call_id="c", data_dir=tmp_path)


async def test_assembly_order_and_models_without_tools(tmp_path: Path, search_url: str) -> None:
    store, approvals, service = await make(tmp_path)
    try:
        skills = tmp_path / "skills"
        (skills / "pdf").mkdir(parents=True)
        (skills / "pdf" / "SKILL.md").write_text("---\nname: pdf-tools\ndescription: Work with PDFs\n---\n# PDF\nUse qpdf.")
        (skills / "pdf" / "ref.md").write_text("x")
        (skills / "plain").mkdir()
        (skills / "plain" / "SKILL.md").write_text("# Plain\n\nSummarise things briefly.")
        (skills / "not-a-skill").mkdir()
        await service.update_settings(ToolSettingsUpdate(
            web_search=WebSearchConfig(url=search_url), skills_dirs=[str(skills)],
        ))
        ws = tmp_path / "ws"
        ws.mkdir()
        session = await store.run(lambda db: db.sessions.create(CreateSessionOptions(provider_id="p", model_id="m", workspace_dir=str(ws))))
        registry = await service.assemble(session, ModelInfo(id="m", supports_tools=True))
        assert [t.name for t in registry.tools] == [
            "web_search", "get_current_time", "search_conversations",
            "workspace_read_file", "workspace_write_file", "workspace_list", "workspace_run_command",
            "skill_list", "skill_load", "read_tool_output", "get_session_capabilities",
        ]
        assert registry.capability_note is None
        assert registry.prompts() == ["Skills you can load with skill_load: pdf-tools, plain."]
        caps = json.loads((await registry.get("get_session_capabilities").run({}, ctx(session, tmp_path))).text)
        assert caps["workspace"] == str(ws) and caps["web_search"] is True and caps["max_steps"] == 256
        assert len(caps["tools"]) == len(registry)

        skill_list = (await registry.get("skill_list").run({}, ctx(session, tmp_path))).text
        assert skill_list == "- pdf-tools: Work with PDFs\n- plain: Summarise things briefly."
        loaded = (await registry.get("skill_load").run({"name": "pdf-tools"}, ctx(session, tmp_path))).text
        assert "Use qpdf." in loaded and "- ref.md" in loaded
        with pytest.raises(ToolError, match="available: pdf-tools, plain"):
            await registry.get("skill_load").run({"name": "nope"}, ctx(session, tmp_path))

        web = (await registry.get("web_search").run({"query": "cats"}, ctx(session, tmp_path))).text
        assert web.startswith("1. About cats\nhttps://example.org/1\nfirst")
        with pytest.raises(ToolError, match="not search results"):
            await registry.get("web_search").run({"query": "broken"}, ctx(session, tmp_path))

        no_tools = await service.assemble(session, ModelInfo(id="m", supports_tools=False))
        assert len(no_tools) == 0 and no_tools.specs() == [] and no_tools.capability_note == NO_TOOLS_NOTE
        plain = await store.run(lambda db: db.sessions.create(CreateSessionOptions(provider_id="p", model_id="m")))
        names = [t.name for t in (await service.assemble(plain, ModelInfo(id="m"))).tools]
        assert not any(n.startswith("workspace_") for n in names)

        await service.update_settings(ToolSettingsUpdate(enabled=False))
        off = await service.assemble(session, ModelInfo(id="m"))
        assert len(off) == 0 and off.capability_note == NO_TOOLS_NOTE
        with pytest.raises(InvalidParams, match="unknown local tools"):
            await service.update_settings(ToolSettingsUpdate(local_tools=["rm_rf"]))
        with pytest.raises(InvalidParams):
            await service.update_settings(ToolSettingsUpdate(skills_dirs=["relative/dir"]))
        await service.aclose()
    finally:
        await store.close()


async def test_settings_persist_and_tool_list_shows_policies(tmp_path: Path) -> None:
    store, approvals, service = await make(tmp_path)
    try:
        await service.update_settings(ToolSettingsUpdate(conversation_search=False, tool_timeout_s=5))
        ws = tmp_path / "ws"
        ws.mkdir()
        session = await store.run(lambda db: db.sessions.create(CreateSessionOptions(provider_id="p", model_id="m", workspace_dir=str(ws))))
        await approvals.set_policy(ToolPolicySetParams(key="workspace_write_file", policy="auto"))
        listed = {t.name: t for t in await service.list_tools(ToolListParams(session_id=session.id))}
        assert "search_conversations" not in listed
        assert (listed["workspace_write_file"].policy, listed["workspace_write_file"].default_policy) == ("auto", "ask")
        assert listed["workspace_run_command"].policy == "ask" and listed["workspace_list"].policy == "auto"
    finally:
        await store.close()
    store, approvals, service = await make(tmp_path)
    try:
        assert service.settings.conversation_search is False and service.settings.tool_timeout_s == 5
    finally:
        await store.close()


async def test_conversation_search_finds_chinese_and_english(tmp_path: Path) -> None:
    store, approvals, service = await make(tmp_path)
    try:
        session = await store.run(lambda db: db.sessions.create(CreateSessionOptions(provider_id="p", model_id="m", title="旅行")))
        await store.run(lambda db: db.messages.append(session.id, role="user", text_content="我们今天讨论全文搜索功能 and Kubernetes"))
        registry = await service.assemble(session, ModelInfo(id="m"))
        tool = registry.get("search_conversations")
        assert "全文搜索" in (await tool.run({"query": "搜索"}, ctx(session, tmp_path))).text
        assert "Kubernetes" in (await tool.run({"query": "kubernetes"}, ctx(session, tmp_path))).text
        assert "no messages match" in (await tool.run({"query": "zebra"}, ctx(session, tmp_path))).text
    finally:
        await store.close()


async def test_approvals_policies_remember_and_audit(tmp_path: Path) -> None:
    store, approvals, service = await make(tmp_path)
    try:
        session = await store.run(lambda db: db.sessions.create(CreateSessionOptions(provider_id="p", model_id="m")))
        msg = await store.run(lambda db: db.messages.append(session.id, role="assistant", status="streaming"))
        assert await approvals.policy("t", "ask") == "ask"
        assert await approvals.policy("mcp__s__x", "ask", "mcp:s") == "ask"
        await approvals.set_policy(ToolPolicySetParams(key="mcp:s", policy="auto"))
        assert await approvals.policy("mcp__s__x", "ask", "mcp:s") == "auto"
        await approvals.set_policy(ToolPolicySetParams(key="mcp__s__x", policy="deny"))
        assert await approvals.policy("mcp__s__x", "ask", "mcp:s") == "deny"  # the tool's own wins
        with pytest.raises(InvalidParams):
            await approvals.set_policy(ToolPolicySetParams(key="  ", policy="auto"))

        request = ApprovalRequest(session_id=session.id, message_id=msg.id, tool_call_id="k1",
                                  tool_name="write", arguments='{"p": 1}')
        await approvals.open([request])
        with pytest.raises(NotFound):
            await approvals.approve(ToolApproveParams(session_id=session.id, tool_call_id="zz", decision="approved"))
        result = await approvals.approve(ToolApproveParams(
            session_id=session.id, tool_call_id="k1", decision="approved", remember=True))
        assert result.success and not result.resumed
        assert await approvals.policy("write", "ask") == "auto"
        with pytest.raises(SidecarError) as err:
            await approvals.approve(ToolApproveParams(session_id=session.id, tool_call_id="k1", decision="denied"))
        assert err.value.code == -32003
        audit = await approvals.list_audit(ToolAuditListParams(session_id=session.id))
        assert [(a.decision, a.actor, a.arguments) for a in reversed(audit)] == [
            ("requested", "system", '{"p": 1}'), ("approved", "user", '{"p": 1}'), ("remember:auto", "user", '{"p": 1}'),
        ]
        with pytest.raises(InvalidParams):
            await approvals.list_audit(ToolAuditListParams(limit=0))
    finally:
        await store.close()


async def test_ask_for_an_in_process_caller_acp_style(tmp_path: Path) -> None:
    store, approvals, service = await make(tmp_path)
    try:
        session = await store.run(lambda db: db.sessions.create(CreateSessionOptions(provider_id="p", model_id="m")))
        msg = await store.run(lambda db: db.messages.append(session.id, role="assistant", status="streaming"))
        options = [
            ToolApprovalOption(option_id="a1", name="Allow", kind="allow_once"),
            ToolApprovalOption(option_id="a2", name="Always", kind="allow_always"),
            ToolApprovalOption(option_id="r1", name="Reject", kind="reject_once"),
        ]
        announced: list[str] = []

        async def announce(req: ApprovalRequest) -> None:
            announced.append(req.tool_call_id)

        def request(call_id: str) -> ApprovalRequest:
            return ApprovalRequest(session_id=session.id, message_id=msg.id, tool_call_id=call_id, tool_name="edit",
                                   arguments="{}", source="acp", policy_key="acp:eng:edit", options=options)

        decisions: list[Any] = []

        async def asker(call_id: str) -> None:
            decisions.append(await approvals.ask(request(call_id), announce))

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(asker, "p1")
                while not announced:
                    await anyio.sleep(0.005)
                pending = await approvals.list_pending(ToolPendingListParams(session_id=session.id))
                assert [(p.tool_call_id, p.source, len(p.options or [])) for p in pending] == [("p1", "acp", 3)]
                with pytest.raises(InvalidParams):  # ACP calls take approved or denied only
                    await approvals.approve(ToolApproveParams(session_id=session.id, tool_call_id="p1",
                                                              decision="answered", answer="x"))
                await approvals.approve(ToolApproveParams(session_id=session.id, tool_call_id="p1",
                                                          decision="approved", remember=True))
        assert decisions[0].decision == "approved" and decisions[0].option_id == "a2"
        # remembered: the next request of that kind is decided by policy, without asking
        with anyio.fail_after(5):
            again = await approvals.ask(request("p2"), announce)
        assert again.actor == "policy" and again.option_id == "a1" and announced == ["p1"]

        # a cancelled caller leaves the call cancelled (audited), never pending
        await approvals.set_policy(ToolPolicySetParams(key="acp:eng:edit", policy=None))
        with anyio.fail_after(5):
            with anyio.move_on_after(0.2):
                await approvals.ask(request("p3"), announce)
        assert await approvals.list_pending(ToolPendingListParams()) == []
        trail = [(a.tool_call_id, a.decision) for a in reversed(await approvals.list_audit(ToolAuditListParams()))]
        assert ("p3", "cancelled") in trail and ("p2", "policy:auto") in trail
        # cancel() wakes a waiter with "cancelled"
        async with anyio.create_task_group() as tg:
            tg.start_soon(asker, "p4")
            with anyio.fail_after(5):
                while len(announced) < 3:
                    await anyio.sleep(0.005)
                assert [c.tool_call_id for c in await approvals.cancel(session.id, note="turn ended")] == ["p4"]
        assert decisions[-1].decision == "cancelled"
    finally:
        await store.close()

