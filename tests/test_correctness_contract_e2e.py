"""What the sidecar sends stays inside the committed contract, over a real sidecar
subprocess: the ``notice`` of an ACP regenerate that continues a fork of an agent session
(``code: "acp_history_kept"``) and every other ``chat:stream`` event of the turns around it
validate against ``protocol/generated/schema.json``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from acp_helpers import acp_session, add_engine, send_and_wait
from chat_helpers import wait_final
from sidecar_proc import ROOT, spawn_sidecar

pytestmark = pytest.mark.anyio


def stream_validator() -> jsonschema.Draft202012Validator:
    schema = json.loads((ROOT / "protocol" / "generated" / "schema.json").read_text())
    params = schema["notifications"]["chat:stream"]["params"]
    return jsonschema.Draft202012Validator({"$defs": schema["$defs"], **params})


async def test_an_acp_regenerate_sends_only_events_the_schema_allows(tmp_path: Path) -> None:
    validator = stream_validator()
    async with spawn_sidecar(tmp_path / "data") as proc:
        await proc.call("sidecar:initialize", {})
        engine = await add_engine(proc, "--fork", name="Forking")
        session = await acp_session(proc, engine["id"])
        await send_and_wait(proc, session["id"], "a")
        second, _ = await send_and_wait(proc, session["id"], "b")
        regen = await proc.call("chat:regenerate", {"sessionId": session["id"], "messageId": second["messageId"]})
        assert (await wait_final(proc, regen["messageId"]))["type"] == "stream_end"
        events: list[dict[str, Any]] = proc.notifications("chat:stream")
        notices = [e for e in events if e["type"] == "notice" and e["messageId"] == regen["messageId"]]
        assert [n["code"] for n in notices] == ["acp_history_kept"]
        invalid = [(e["type"], error.message) for e in events for error in validator.iter_errors(e)]
        assert invalid == []
        await proc.close()
