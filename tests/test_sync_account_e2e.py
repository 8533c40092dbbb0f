"""server:configure / status / logout, the server conversation calls and sync settings, over a subprocess."""

from __future__ import annotations

import base64
import time

import apsw
import pytest

from qiming_helpers import PASSWORD, all_sessions, configure, qiming_server, sync
from sidecar_proc import CallError, spawn_sidecar

pytestmark = pytest.mark.anyio


async def test_configure_with_a_login_or_a_token_which_is_never_shown(tmp_path):
    async with qiming_server() as server, spawn_sidecar(tmp_path) as proc:
        await proc.call("sidecar:initialize", {})
        assert await proc.call("server:status", {}) == {
            "configured": False, "serviceUrl": None, "state": "unconfigured", "reachable": None, "message": None,
            "user": None, "tokenExpiresAt": None, "agentId": None, "messagesOnCreate": False, "syncing": False,
            "lastSyncAt": None, "lastResult": None, "chatApi": "conversation", "chatIdleTimeoutMs": 60000,
            "agentMode": None,
        }
        for bad, field in (
            ({"serviceUrl": "ftp://x", "token": "t" * 40}, "http(s)"),
            ({"serviceUrl": server.url, "token": "t" * 40, "username": "a", "password": "b"}, "either"),
            ({"serviceUrl": server.url}, "either"),
            ({"serviceUrl": server.url, "username": "a"}, "both"),
            ({"serviceUrl": server.url, "token": "has space"}, "token"),
            ({"serviceUrl": server.url, "token": "tök-" + "t" * 40}, "printable ASCII"),  # a header carries it
            ({"serviceUrl": server.url, "token": "t" * 40, "requestTimeoutMs": 5}, "requestTimeoutMs"),
        ):
            with pytest.raises(CallError) as err:
                await proc.call("server:configure", bad)
            assert err.value.code == -32602 and field in err.value.message, (bad, err.value.message)
        with pytest.raises(CallError) as err:
            await configure(proc, server, password="wrong")
        assert err.value.code == -32004 and err.value.data["kind"] == "envelope" and err.value.data["code"] == "0001"
        assert (await proc.call("server:status", {}))["configured"] is False

        status = await configure(proc, server, agentId=1128)
        assert status["state"] == "ok" and status["reachable"] is True and status["agentId"] == 1128
        assert status["user"]["id"] == 5 and status["user"]["email"] == "demo@example.com"
        assert status["tokenExpiresAt"] > 0
        login = next(r for r in await server.requests() if r["path"] == "/api/user/passwordLogin")
        assert login["clientType"] == "desktop" and login["body"]["phoneOrEmail"] == "demo@example.com"

        token = await server.token(expiresInS=3600)
        status = await proc.call("server:configure", {"serviceUrl": server.url + "/", "token": token})
        assert status["serviceUrl"] == server.url and status["user"]["id"] == 5
        # read from the JWT's exp claim (whole seconds)
        assert status["tokenExpiresAt"] % 1000 == 0
        assert abs(status["tokenExpiresAt"] - (time.time() + 3600) * 1000) < 120_000
        checked = await proc.call("server:status", {})
        assert checked["reachable"] is True and checked["state"] == "ok"
        await proc.close()
    stdout = b"\n".join(proc.lines)
    assert token.encode() not in stdout and token not in proc.stderr_text()
    assert PASSWORD.encode() not in stdout and f'"{PASSWORD}"' not in proc.stderr_text()
    raw = b"".join(p.read_bytes() for p in tmp_path.glob("chat.db*"))
    assert token.encode() not in raw, "the token is sealed at rest (no plaintext in the database files)"
    db = apsw.Connection(str(tmp_path / "chat.db"))
    (stored,) = db.execute("SELECT token FROM sync_account").fetchone()
    db.close()
    assert stored.startswith("enc1:"), "sealed by the store's Sealer"


async def test_a_token_sealed_with_another_key_is_locked_not_lost(tmp_path):
    key_a = base64.b64encode(b"A" * 32).decode()
    key_b = base64.b64encode(b"B" * 32).decode()
    async with qiming_server() as server:
        await server.control("seed", {"count": 2, "messages": 2})
        async with spawn_sidecar(tmp_path) as proc:
            info = await proc.call("sidecar:initialize", {"secretKey": key_a})
            assert info["secrets"]["locked"] == 0
            await configure(proc, server)
            await proc.close()
        async with spawn_sidecar(tmp_path) as proc:
            info = await proc.call("sidecar:initialize", {"secretKey": key_b})
            assert info["secrets"]["state"] == "locked" and info["secrets"]["locked"] == 1
            status = await proc.call("server:status", {})
            assert status["state"] == "secrets_locked" and status["configured"] is True
            assert "sealed with another key" in status["message"]
            with pytest.raises(CallError) as err:
                await sync(proc, "sync:pull")
            assert err.value.code == -32008
            assert await proc.call("chat:session:list", {})  # everything else works
            await proc.close()
        seen = len(await server.requests())
        async with spawn_sidecar(tmp_path) as proc:  # the right key opens it again
            await proc.call("sidecar:initialize", {"secretKey": key_a})
            assert (await proc.call("server:status", {}))["state"] == "ok"
            assert (await sync(proc, "sync:pull"))["pulled"] == 2
            await proc.close()
        assert len(await server.requests()) > seen


async def test_expiry_status_and_logout(tmp_path):
    async with qiming_server() as server, spawn_sidecar(tmp_path) as proc:
        await proc.call("sidecar:initialize", {})
        await configure(proc, server)
        await server.control("expire_tokens")
        status = await proc.call("server:status", {})
        assert status["state"] == "auth_required" and status["reachable"] is True and "4010" in status["message"]
        assert proc.notifications("server:status:updated")[-1]["state"] == "auth_required"
        with pytest.raises(CallError) as err:
            await sync(proc, "sync:pull")
        assert err.value.data["kind"] == "auth_required"

        await configure(proc, server)
        assert (await proc.call("server:status", {}))["state"] == "ok"
        assert await proc.call("server:logout", {}) == {"success": True}
        assert any(r["path"] == "/api/user/logout" for r in await server.requests())
        status = await proc.call("server:status", {})
        assert status["state"] == "logged_out" and status["configured"] is True and status["reachable"] is None
        with pytest.raises(CallError) as err:
            await sync(proc, "sync:pull")
        assert err.value.code == -32003 and err.value.data["kind"] == "not_configured"

        # unreachable server: status says so, nothing breaks
        await configure(proc, server)
        await server.fault({"path": "/api/user/getLoginInfo", "fault": "disconnect", "times": 1})
        down = await proc.call("server:status", {})
        assert down["reachable"] is False and down["state"] == "ok" and down["message"]
        await proc.close()


async def test_conversation_update_share_delete(tmp_path):
    async with qiming_server() as server, spawn_sidecar(tmp_path) as proc:
        await proc.call("sidecar:initialize", {})
        ids = (await server.control("seed", {"count": 3, "messages": 2}))["ids"]
        await configure(proc, server)
        await sync(proc, "sync:pull")
        sessions = {s["title"]: s for s in await all_sessions(proc)}
        s0 = sessions["Topic 0"]

        for bad in ({}, {"sessionId": s0["id"], "conversationId": ids[0], "topic": "x"},
                    {"sessionId": s0["id"]}, {"sessionId": s0["id"], "topic": "  "}):
            with pytest.raises(CallError) as err:
                await proc.call("server:conversation:update", bad)
            assert err.value.code == -32602
        with pytest.raises(CallError) as err:
            await proc.call("server:conversation:update", {"sessionId": "nope", "topic": "x"})
        assert err.value.code == -32001

        conv = await proc.call("server:conversation:update", {"sessionId": s0["id"], "topic": "Renamed"})
        assert conv["id"] == ids[0] and conv["topic"] == "Renamed" and conv["sessionId"] == s0["id"]
        assert (await proc.call("chat:session:get", {"id": s0["id"]}))["title"] == "Renamed"
        made = await proc.call("server:conversation:update",
                               {"conversationId": ids[1], "firstMessage": "a very long first message here"})
        assert made["topic"] == "a very long first me"  # the server's fallback: the first 20 characters
        quiet = await sync(proc, "sync:run")
        assert quiet["conflicts"] == [] and quiet["errors"] == []
        assert (await proc.call("chat:session:get", {"id": sessions["Topic 1"]["id"]}))["title"] == "a very long first me"

        share = await proc.call("server:conversation:share", {"sessionId": s0["id"], "expireSeconds": 600})
        assert len(share["shareKey"]) == 32 and share["targetId"] == str(ids[0]) and share["expire"] > 0
        with pytest.raises(CallError) as err:
            await proc.call("server:conversation:share", {"conversationId": 999})
        assert err.value.code == -32004 and err.value.data["kind"] == "not_found"

        assert await proc.call("server:conversation:delete", {"sessionId": s0["id"]}) == {"success": True}
        assert ids[0] not in {c["id"] for c in await server.conversations()}
        kept = await proc.call("chat:session:get", {"id": s0["id"]})
        assert kept["title"] == "Renamed"
        await proc.call("server:conversation:delete", {"sessionId": sessions["Topic 2"]["id"], "deleteLocal": True})
        assert {s["title"] for s in await all_sessions(proc)} == {"Renamed", "a very long first me"}
        after = await sync(proc, "sync:run")
        assert after["errors"] == [] and after["pushed"] == 0 and after["conflicts"] == [] and after["deleted"] == 0
        assert not any(r["path"].endswith("/create") for r in await server.requests())
        await proc.close()


async def test_sync_settings(tmp_path):
    async with spawn_sidecar(tmp_path) as proc:
        await proc.call("sidecar:initialize", {})
        assert await proc.call("sync:settings:get", {}) == {
            "autoSync": False, "intervalMinutes": 15, "listPageSize": 100, "messagePageSize": 100,
        }
        for bad in ({"intervalMinutes": 0}, {"listPageSize": 5000}, {"messagePageSize": -1}, {"nope": 1}):
            with pytest.raises(CallError) as err:
                await proc.call("sync:settings:update", bad)
            assert err.value.code == -32602
        updated = await proc.call("sync:settings:update", {"autoSync": True, "intervalMinutes": 30})
        assert updated["autoSync"] is True and updated["intervalMinutes"] == 30
        with pytest.raises(CallError) as err:
            await sync(proc, "sync:run")
        assert err.value.code == -32003
        await proc.close()
    async with spawn_sidecar(tmp_path) as proc:
        await proc.call("sidecar:initialize", {})
        assert (await proc.call("sync:settings:get", {}))["intervalMinutes"] == 30
        await proc.close()
