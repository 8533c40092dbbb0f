"""A session's provider and model are checked where they are chosen, over a real sidecar
subprocess: ``chat:session:create`` and ``chat:session:update`` refuse (-32602, naming the
field, nothing stored) a ``providerId`` that is not configured, a provider that does not
fit the mode (an ACP engine for a direct session, an HTTP provider for an ACP one), and a
``modelId`` the provider does not list; empty/null still mean the default; a provider
deleted later still fails at the send, as before."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from acp_helpers import add_engine, send_and_wait
from generation_helpers import setup
from scripted_server import scripted_provider
from sidecar_proc import CallError, SidecarProcess, spawn_sidecar

pytestmark = pytest.mark.anyio


async def refused(proc: SidecarProcess, method: str, params: dict[str, Any], field: str) -> str:
    with pytest.raises(CallError) as err:
        await proc.call(method, params)
    assert err.value.code == -32602 and f"`$.{field}`" in err.value.message, err.value.message
    return str(err.value.message)


async def test_create_and_update_refuse_a_provider_or_model_that_cannot_run(tmp_path: Path) -> None:
    async with scripted_provider() as server, spawn_sidecar(tmp_path / "data") as proc:
        http = await setup(proc, server.base_url, models=[{"id": "scripted-1"}, {"id": "scripted-2"}])
        engine = await add_engine(proc)
        create = "chat:session:create"

        message = await refused(proc, create, {"providerId": "no-such-provider"}, "providerId")
        assert "'no-such-provider'" in message
        await refused(proc, create, {"providerId": engine["id"], "modelId": "m"}, "providerId")
        await refused(proc, create, {"mode": "acp", "providerId": http["id"], "modelId": "agent"}, "providerId")
        await refused(proc, create, {"providerId": http["id"], "modelId": "gpt-typo"}, "modelId")
        await refused(proc, create, {"modelId": "gpt-typo"}, "modelId")  # the default provider's models
        assert (await proc.call("chat:session:list", {}))["total"] == 0

        # what can run is taken; empty and null still mean the configured default
        direct = await proc.call(create, {"providerId": http["id"], "modelId": "scripted-2"})
        acp = await proc.call(create, {"mode": "acp", "providerId": engine["id"], "modelId": "agent"})
        default = await proc.call(create, {"modelId": None})
        at_send = await proc.call(create, {"providerId": ""})  # resolved at each send
        assert (direct["providerId"], acp["providerId"], default["providerId"]) == (http["id"], engine["id"], http["id"])
        assert at_send["providerId"] == ""

        update = "chat:session:update"
        sid = direct["id"]
        await refused(proc, update, {"id": sid, "updates": {"providerId": "gone"}}, "updates.providerId")
        await refused(proc, update, {"id": sid, "updates": {"providerId": engine["id"]}}, "updates.providerId")
        await refused(proc, update, {"id": sid, "updates": {"modelId": "gpt-typo"}}, "updates.modelId")
        await refused(proc, update, {"id": acp["id"], "updates": {"providerId": http["id"]}}, "updates.providerId")
        kept = await proc.call("chat:session:get", {"id": sid})
        assert (kept["providerId"], kept["modelId"]) == (http["id"], "scripted-2")
        moved = await proc.call(update, {"id": sid, "updates": {"modelId": "scripted-1"}})
        assert moved["modelId"] == "scripted-1"
        cleared = await proc.call(update, {"id": sid, "updates": {"providerId": None, "modelId": None}})
        assert (cleared["providerId"], cleared["modelId"]) == ("", "")

        # a provider deleted after the session was made: the send says so, as before
        other = await proc.call("provider:upsert", {"name": "Other", "type": "openai-compat", "baseUrl": server.base_url})
        orphan = await proc.call(create, {"providerId": other["id"], "modelId": "any-model"})
        await proc.call("provider:delete", {"id": other["id"]})
        _, final = await send_and_wait(proc, orphan["id"], "hi")
        assert final["type"] == "error" and "does not exist" in final["error"], final
        await proc.close()
