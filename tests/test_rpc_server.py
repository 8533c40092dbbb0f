"""The server in-process: the binding table covers the contract, lifecycle methods, serve()."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import anyio
import pytest

import sidecar
from protocol import METHODS, PROTOCOL_VERSION, ErrorCode, IdParams, InitializeParams, SessionV2
from sidecar.app import App
from sidecar.config import Config, build_config
from sidecar.errors import InvalidParams, RemoteError
from sidecar.rpc import JsonRpcPeer, connected_pair
from sidecar.server import BENCH_NOTIFY, BENCH_PING, BINDINGS, LIFECYCLE_METHODS, Server, resolve_binding, serve

pytestmark = pytest.mark.anyio


def test_every_method_of_the_contract_is_bound_or_handled() -> None:
    handled = set(BINDINGS) | set(LIFECYCLE_METHODS)
    assert handled == set(METHODS), (
        f"unbound methods: {sorted(set(METHODS) - handled)}; bindings for unknown methods: {sorted(handled - set(METHODS))}"
    )
    assert not set(BINDINGS) & set(LIFECYCLE_METHODS)
    for path in BINDINGS.values():
        service, _, func = path.partition(".")
        assert service.isidentifier() and func.isidentifier(), path


def test_the_handshake_names_the_notifications_of_the_contract() -> None:
    from protocol import NOTIFICATIONS
    from sidecar.handshake import SERVER_NOTIFICATIONS

    sent = sorted(n for n, spec in NOTIFICATIONS.items() if spec.direction == "server->client")
    assert list(SERVER_NOTIFICATIONS) == sent


def test_bench_methods_are_not_part_of_the_contract() -> None:
    assert BENCH_NOTIFY not in METHODS and BENCH_PING not in METHODS


class FakeSessions:
    """Stands in for the session service to prove a resolved binding is what gets called."""

    def __init__(self) -> None:
        self.calls: list[IdParams] = []

    async def get_session(self, params: IdParams) -> SessionV2:
        self.calls.append(params)
        return SessionV2(id=params.id, provider_id="p", model_id="m", created_at=1, updated_at=2)


async def test_resolved_bindings_are_called_and_missing_ones_answer_not_implemented(tmp_path: Path) -> None:
    config = Config(data_dir=str(tmp_path))
    app = App(config, tmp_path, _no_notify)  # a bare App: no services attached
    assert resolve_binding(app, "sessions.get_session") is None
    app.sessions = FakeSessions()  # type: ignore[assignment]
    assert resolve_binding(app, "sessions.get_session") is not None
    server = Server(config, app, anyio.Event())
    handlers = server.handlers()
    assert set(handlers) == set(METHODS)

    async def call(method: str, params: bytes) -> Any:
        handler = handlers[method]
        return await handler.func(handler.decode_params(_raw(params)))

    session = await call("chat:session:get", b'{"id": "s1"}')
    assert session.id == "s1" and app.sessions.calls == [IdParams(id="s1")]  # type: ignore[attr-defined]
    with pytest.raises(sidecar.errors.SidecarError) as err:
        await call("chat:send", b'{"whatever": 1}')
    assert err.value.code == ErrorCode.NOT_IMPLEMENTED
    assert err.value.message == "chat:send is not implemented yet"
    # A bound method decodes the contract's params type, so bad params never reach the service.
    with pytest.raises(InvalidParams):
        await call("chat:session:get", b'{"id": 5}')
    assert app.sessions.calls == [IdParams(id="s1")]  # type: ignore[attr-defined]


async def test_the_handshake_waits_for_the_store_and_bound_methods_for_the_app(tmp_path: Path) -> None:
    from sidecar.engine.secrets import SecretsService
    from sidecar.store import AsyncStore
    from sidecar.store_open import open_store

    config = Config(data_dir=str(tmp_path))
    server = Server(config, None, anyio.Event())
    handlers = server.handlers()
    answers: dict[str, Any] = {}
    store_answers = anyio.Event()

    async def call(method: str, params: bytes) -> None:
        handler = handlers[method]
        answers[method] = await handler.func(handler.decode_params(_raw(params)))
        if {"sidecar:initialize", "chat:session:get"} <= set(answers):
            store_answers.set()

    store = AsyncStore(open_store(config, migrate=True))
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(call, "sidecar:initialize", b"{}")
            tg.start_soon(call, "chat:session:get", b'{"id": "s2"}')
            tg.start_soon(call, "provider:list", b"{}")
            await anyio.wait_all_tasks_blocked()
            assert answers == {}  # waiting for the store
            app = App(config, tmp_path, _no_notify)
            app.store = store
            app.secrets = SecretsService(store)
            app.sessions = FakeSessions()  # type: ignore[assignment]
            await server.attach_store(app)
            with anyio.fail_after(5):
                await store_answers.wait()
            info = answers["sidecar:initialize"]
            assert info.data_dir == str(tmp_path) and info.secrets.state == "ready"
            assert "chat:session:get" in info.capabilities.implemented
            assert answers["chat:session:get"].id == "s2"  # an early method: the store is enough
            assert "provider:list" not in answers  # waiting for the whole App
            providers = FakeProviders()
            app.providers = providers  # type: ignore[assignment]
            server.attach(app)
        assert answers["provider:list"] == [] and providers.listed == 1
    finally:
        await store.close()


class FakeProviders:
    def __init__(self) -> None:
        self.listed = 0

    async def list_providers(self, params: Any) -> list[Any]:
        self.listed += 1
        return []


def test_open_app_attaches_a_service_for_every_binding(tmp_path: Path) -> None:
    """Server.implemented lists every binding before the App is open: keep that true."""
    from sidecar.app import open_app

    async def main() -> None:
        async with open_app(Config(data_dir=str(tmp_path)), _quiet) as app:
            unresolved = [m for m, path in BINDINGS.items() if resolve_binding(app, path) is None]
            assert not unresolved

    anyio.run(main)


async def _quiet(method: str, params: Any) -> None:
    pass


def _raw(data: bytes) -> Any:
    import msgspec

    return msgspec.json.decode(b"[" + data + b"]", type=list[msgspec.Raw])[0]


async def _no_notify(method: str, params: Any) -> None:
    raise AssertionError("no notification expected")


async def test_serve_initialize_not_implemented_and_shutdown(tmp_path: Path) -> None:
    config = Config(data_dir=str(tmp_path / "data"), max_line_bytes=65536)
    (server_receive, server_send), (client_receive, client_send) = connected_pair(max_buffer=math.inf)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(serve, config, server_receive, server_send)
            async with JsonRpcPeer(client_receive, client_send, name="client") as client:
                result = await client.request(
                    "sidecar:initialize", {"protocolVersion": 1, "clientInfo": {"name": "test", "version": "1"}}
                )
                assert result["protocolVersion"] == PROTOCOL_VERSION
                assert result["serverInfo"] == {"name": sidecar.SERVER_NAME, "version": sidecar.__version__}
                assert result["capabilities"]["methods"] == sorted(METHODS)
                assert set(result["capabilities"]["implemented"]) >= set(LIFECYCLE_METHODS)
                assert result["capabilities"]["notifications"] == [
                    "channel:reply", "chat:session:updated", "chat:stream", "chat:suggestions", "memory_consolidation_proposed",
                    "memory_proposed", "server:status:updated",
                    "sidecar:progress", "skill_proposed", "task_finished", "task_fired",
                ]
                assert result["capabilities"]["maxLineBytes"] == 65536
                assert result["dataDir"] == str(tmp_path / "data") and (tmp_path / "data").is_dir()

                # Whatever is not implemented yet answers NOT_IMPLEMENTED (the set shrinks as
                # services are attached; the bare-App test above covers the mechanism).
                for method in sorted(set(METHODS) - set(result["capabilities"]["implemented"])):
                    with pytest.raises(RemoteError) as err:
                        await client.request(method, {})
                    assert err.value.code == ErrorCode.NOT_IMPLEMENTED, method
                with pytest.raises(RemoteError) as err:
                    await client.request(BENCH_NOTIFY, {"count": 1})
                assert err.value.code == ErrorCode.METHOD_NOT_FOUND  # only with --bench

                assert await client.request("sidecar:shutdown") == {"success": True}
                await client.closed.wait()  # the server closed its output after answering


async def test_serve_with_bench_emits_sized_notifications(tmp_path: Path) -> None:
    config = Config(data_dir=str(tmp_path), bench=True)
    (server_receive, server_send), (client_receive, client_send) = connected_pair(max_buffer=math.inf)
    lines: list[bytes] = []
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(serve, config, server_receive, server_send)
            await client_send.send(b'{"jsonrpc":"2.0","id":0,"method":"sidecar:bench:ping"}\n')
            await client_send.send(b'{"jsonrpc":"2.0","id":1,"method":"sidecar:bench:notify","params":{"count":50,"size":120}}\n')
            await client_send.aclose()
            with client_receive:
                async for chunk in client_receive:
                    lines.extend(chunk.splitlines())
    messages = [json.loads(line) for line in lines]
    assert {"jsonrpc": "2.0", "id": 0, "result": "pong"} in messages
    messages.remove({"jsonrpc": "2.0", "id": 0, "result": "pong"})
    events = [m["params"] for m in messages if m.get("method") == "chat:stream"]
    assert [e["seq"] for e in events] == list(range(1, 51))
    assert all(e["type"] == "text_delta" for e in events)
    assert len(json.dumps(events[-1], separators=(",", ":"))) == 120
    assert messages[-1]["id"] == 1 and messages[-1]["result"]["count"] == 50  # the reply comes after all events


def test_config_precedence_and_validation(tmp_path: Path) -> None:
    env = {"CHAT_SIDECAR_DATA_DIR": str(tmp_path / "env"), "CHAT_SIDECAR_LOG_LEVEL": "debug"}
    config = build_config({"data_dir": None, "log_level": None}, env)
    assert config.data_dir == str(tmp_path / "env") and config.log_level == "DEBUG"
    config = build_config({"data_dir": str(tmp_path / "cli"), "max_line_bytes": 4096}, env)
    assert config.data_dir == str(tmp_path / "cli") and config.max_line_bytes == 4096
    default = build_config({}, {})
    assert Path(default.data_dir).is_absolute() and "chat-sidecar" in default.data_dir
    for overrides, env_bad in (
        ({"log_level": "loud"}, {}),
        ({"max_line_bytes": 10}, {}),
        ({}, {"CHAT_SIDECAR_MAX_LINE_BYTES": "lots"}),
    ):
        with pytest.raises(InvalidParams):
            build_config({"data_dir": str(tmp_path), **overrides}, env_bad)


def test_empty_cli_values_count_as_not_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # an empty --data-dir must not become the current directory
    env = {"CHAT_SIDECAR_DATA_DIR": str(tmp_path / "env")}
    assert build_config({"data_dir": "", "log_level": ""}, env).data_dir == str(tmp_path / "env")
    default = build_config({"data_dir": ""}, {})
    assert default.data_dir == build_config({}, {}).data_dir != str(tmp_path)
    assert default.log_level == "WARNING"
