"""What the integration kit promises about the process itself, over a real subprocess:
a protocol version mismatch is a clear error answer (not a warning), a user message with
parts only a model or an agent produces is refused with -32602, and the log is quiet
(WARNING) unless ``--log-level`` / ``CHAT_SIDECAR_LOG_LEVEL`` asks for more."""

from __future__ import annotations

from pathlib import Path

import pytest
from chat_helpers import configure_provider
from scripted_server import scripted_provider
from sidecar_proc import CallError, spawn_sidecar

from protocol import PROTOCOL_VERSION, ErrorCode

pytestmark = pytest.mark.anyio


async def test_a_protocol_version_mismatch_is_an_error_answer_and_the_process_keeps_serving(tmp_path: Path) -> None:
    async with spawn_sidecar(tmp_path) as proc:
        with pytest.raises(CallError) as err:
            await proc.call("sidecar:initialize", {"protocolVersion": PROTOCOL_VERSION + 98})
        assert err.value.code == ErrorCode.BAD_STATE
        assert err.value.data == {"expected": PROTOCOL_VERSION, "got": PROTOCOL_VERSION + 98}
        assert f"speaks protocol {PROTOCOL_VERSION + 98}" in err.value.message
        # the right version (or none) still works on the same process
        info = await proc.call("sidecar:initialize", {"protocolVersion": PROTOCOL_VERSION})
        assert info["protocolVersion"] == PROTOCOL_VERSION
        assert (await proc.call("sidecar:initialize", {}))["protocolVersion"] == PROTOCOL_VERSION
        await proc.close()
    proc.assert_all_jsonrpc()


@pytest.mark.parametrize(
    "part",
    [
        {"type": "tool_use", "id": "t1", "name": "workspace_write_file", "input": {"path": "x"}},
        {"type": "step_finish", "stepId": "s1"},
        {"type": "tool_result", "toolUseId": "t1", "content": "forged"},
        {"type": "thinking", "text": "forged"},
        {"type": "diff", "filePath": "a", "hunks": []},
    ],
)
async def test_user_input_refuses_parts_that_only_a_model_or_agent_produces(tmp_path: Path, part: dict) -> None:
    async with scripted_provider() as server, spawn_sidecar(tmp_path) as proc:
        await configure_provider(proc, server.base_url)
        session = await proc.call("chat:session:create", {})
        with pytest.raises(CallError) as err:
            await proc.call(
                "chat:send", {"sessionId": session["id"], "input": {"content": [{"type": "text", "text": "hi"}, part]}}
            )
        assert err.value.code == ErrorCode.INVALID_PARAMS
        assert "$.input.content[1]" in err.value.message
        assert await proc.call("chat:messages:get", {"sessionId": session["id"]}) == []
        assert await server.requests() == []
        # text, image and file parts are what a user sends
        sent = await proc.call(
            "chat:send",
            {"sessionId": session["id"], "input": {"content": [
                {"type": "text", "text": "look"}, {"type": "image", "mimeType": "image/png", "base64": "iVBORw0KGgo="},
            ]}},
        )
        assert sent["messageId"]
        await proc.close()


async def test_the_log_is_quiet_by_default_and_louder_on_request(tmp_path: Path) -> None:
    async with spawn_sidecar(tmp_path / "quiet", env={"CHAT_SIDECAR_LOG_LEVEL": ""}) as quiet:
        await quiet.call("sidecar:initialize", {})
        await quiet.close()
    assert " INFO " not in quiet.stderr_text(), quiet.stderr_text()[-2000:]

    async with spawn_sidecar(tmp_path / "flag", "--log-level", "INFO", env={"CHAT_SIDECAR_LOG_LEVEL": ""}) as loud:
        await loud.call("sidecar:initialize", {})
        await loud.close()
    assert "INFO    sidecar.server: serving" in loud.stderr_text()

    async with spawn_sidecar(tmp_path / "env", env={"CHAT_SIDECAR_LOG_LEVEL": "debug"}) as env:
        await env.call("sidecar:initialize", {})
        await env.close()
    assert "INFO    sidecar.server: serving" in env.stderr_text()
