"""ACP building blocks in-process, what is configured and stored for an agent engine: the
engine's child spec keeps env values out of its reprs, the acp-engine provider config is
validated, stored and masked, and the store's ACP turns and raw update columns."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from protocol.providers import AcpEngineConfig, ProviderUpsertParams
from sidecar.errors import InvalidParams
from sidecar.store import Store


# ---- engine provider configuration -------------------------------------------------------


def test_engine_spec_reprs_keep_env_values_out() -> None:
    from sidecar.children.stdio import ChildSpec

    spec = ChildSpec(name="e", kind="agent engine", command="agent", env={"SECRET_TOKEN": "env-secret-1"})
    for text in (repr(spec), str(spec), repr(list(spec.__rich_repr__()))):
        assert "env-secret-1" not in text and "SECRET_TOKEN" in text


def test_engine_config_is_validated_stored_and_masked(tmp_path: Path) -> None:
    store = Store(tmp_path)
    try:
        repo = store.providers
        with pytest.raises(InvalidParams):
            repo.upsert(ProviderUpsertParams(name="E", type="acp-engine"))
        with pytest.raises(InvalidParams):
            repo.upsert(ProviderUpsertParams(name="E", type="acp-engine", engine=AcpEngineConfig(command="x", env={"A=B": "1"})))
        record = repo.upsert(ProviderUpsertParams(
            name="E", type="acp-engine",
            engine=AcpEngineConfig(command="agent", args=["--x"], env={"SECRET_TOKEN": "t-1", "MODE": "a"}, auto_allow=["read"]),
        ))
        assert record.engine is not None and record.engine.env["SECRET_TOKEN"] == "t-1"
        info = record.to_info(is_default=False)
        assert info.engine is not None and info.engine.env == {"SECRET_TOKEN": "***", "MODE": "***"}
        assert "t-1" not in repr(record)
        again = repo.upsert(ProviderUpsertParams(
            id=record.id, name="E", type="acp-engine",
            engine=AcpEngineConfig(command="agent", env={"SECRET_TOKEN": "***", "MODE": "b"}),
        ))
        assert again.engine is not None and again.engine.env == {"SECRET_TOKEN": "t-1", "MODE": "b"}
        assert repo.get(record.id).engine == again.engine
    finally:
        store.close()


def test_acp_turns_record_and_raw_columns(tmp_path: Path) -> None:
    from protocol.sessions import CreateSessionOptions

    store = Store(tmp_path)
    try:
        session = store.sessions.create(CreateSessionOptions(mode="acp", provider_id="e", model_id="m"))
        user = store.messages.append(session.id, role="user", text_content="hi")
        reply = store.messages.append(session.id, role="assistant", status="pending")
        store.acp.record_turn(reply.id, session.id, "e", "agent-1")
        assert store.sessions.get(session.id).acp_session_id == "agent-1"
        turn = store.acp.turn(reply.id)
        assert turn is not None and turn.agent_session_id == "agent-1" and store.acp.turn(user.id) is None
        store.acp.append_raw(reply.id, 0, [msgspec.Raw(b'{"sessionUpdate":"x","y":[1]}')], "m-1")
        store.acp.finish_raw(reply.id)
        got = store.messages.get(reply.id)
        assert got.acp_message_id == "m-1" and got.acp_parts == [{"sessionUpdate": "x", "y": [1]}]
        assert store.acp.head("e", "agent-1") == reply.id
        store.sessions.delete(session.id)
        assert store.acp.turn(reply.id) is None  # cascades with the message
        assert store.acp.released() == [("e", "agent-1")]  # no reply runs on it any more
    finally:
        store.close()
