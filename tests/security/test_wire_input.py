"""The host's stdin, over the subprocess: lines crafted to cost the process far more than
they cost the sender, or to lose the id of the request they carry.

- a batch holds at most 1,000 items: one more is a single -32600 (``id: null``) found
  without reading the rest, so a 10 MB line of five million tiny items costs neither a
  560 MB answer nor gigabytes of memory; the answer to a batch is bounded too (16 MiB: the
  replies that do not fit become -32009 for their own ids);
- a lone UTF-16 surrogate escape (``"\\ud800"``) is well-formed JSON: the request is
  answered with its id (-32602 naming the field in params, -32600 in the method), never
  -32700 with ``id: null``; in the id itself there is nothing to echo (-32600, null).

Lines are written as text: the test's own JSON encoder would refuse what they hold.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sidecar_proc import SidecarProcess, spawn_sidecar

pytestmark = pytest.mark.anyio

LONE = "\\ud800"
"""A lone high surrogate, as the six characters of its JSON escape."""


def request_text(request_id: Any, method: str, params_text: str | None = None) -> str:
    line = f'{{"jsonrpc":"2.0","id":{json.dumps(request_id)},"method":"{method}"'
    if params_text is not None:
        line += f',"params":{params_text}'
    return line + "}"


def error_of(reply: dict[str, Any]) -> tuple[int, str]:
    assert "error" in reply, reply
    return reply["error"]["code"], reply["error"]["message"]


async def still_serving(proc: SidecarProcess) -> None:
    listed = await proc.call("chat:session:list", {"limit": 5})
    assert isinstance(listed["sessions"], list)


# ---- lone surrogates ---------------------------------------------------------------------


async def test_a_lone_surrogate_in_params_is_answered_with_the_id_naming_the_field(tmp_path: Path) -> None:
    async with spawn_sidecar(tmp_path) as proc:
        await proc.call("sidecar:initialize", {})
        for request_id, params in (
            (7, f'{{"title":"a{LONE}b"}}'),
            ("str-id", f'{{"title":"{LONE}"}}'),
            (8, '{"title":"x","channelMeta":{"k":["ok","\\udfff"]}}'),  # a lone low one, deep in free-form JSON
            (9, '{"title":"\\ude00\\ud83d"}'),  # low then high: two lone halves, not a pair
        ):
            await proc.send_line(request_text(request_id, "chat:session:create", params))
            code, message = error_of(await proc.response(request_id))
            assert code == -32602 and "surrogate" in message, message
        assert "`$.title`" in error_of(await proc.response(7))[1]
        assert "`$.channelMeta.k[1]`" in error_of(await proc.response(8))[1]
        # in a key, and in a method that does not exist: still the params (no handler needed)
        await proc.send_line(request_text(10, "chat:session:create", f'{{"ti{LONE}tle":"x"}}'))
        assert error_of(await proc.response(10))[0] == -32602
        assert (await proc.call("chat:session:list", {}))["total"] == 0  # nothing was created

        # a pair is a character; an escaped backslash followed by "ud800" is just text
        await proc.send_line(request_text(11, "chat:session:create", '{"title":"\\ud83d\\ude00 \\\\ud800"}'))
        created = (await proc.response(11))["result"]
        assert created["title"] == "\U0001F600 \\ud800"
        await still_serving(proc)
        proc.assert_all_jsonrpc()
        await proc.close()


async def test_a_lone_surrogate_in_the_envelope_is_an_invalid_request_with_the_id_when_it_can_be_echoed(
    tmp_path: Path,
) -> None:
    async with spawn_sidecar(tmp_path) as proc:
        await proc.call("sidecar:initialize", {})
        await proc.send_line(request_text(21, f"chat:{LONE}"))
        code, message = error_of(await proc.response(21))
        assert code == -32600 and "method" in message
        await proc.send_line(f'{{"jsonrpc":"2.{LONE}","id":22,"method":"chat:session:list"}}')
        assert error_of(await proc.response(22))[0] == -32600
        # the id itself: nothing to echo
        await proc.send_line(f'{{"jsonrpc":"2.0","id":"{LONE}","method":"chat:session:list"}}')
        reply = await proc.next_null_id_reply()
        code, message = error_of(reply)
        assert code == -32600 and "id" in message
        # a member JSON-RPC does not define is ignored, whatever it holds
        await proc.send_line(f'{{"jsonrpc":"2.0","id":23,"method":"chat:session:list","x-trace":"{LONE}"}}')
        assert "result" in await proc.response(23)
        # a notification is never answered: dropped, and the next request is served
        await proc.send_line(f'{{"jsonrpc":"2.0","method":"$/cancelRequest","params":{{"id":"{LONE}"}}}}')
        await still_serving(proc)
        proc.assert_all_jsonrpc()
        await proc.close()


async def test_a_lone_surrogate_in_a_batch_costs_only_its_own_item(tmp_path: Path) -> None:
    async with spawn_sidecar(tmp_path) as proc:
        await proc.call("sidecar:initialize", {})
        batch = "[" + ",".join([
            request_text(31, "chat:session:create", f'{{"title":"{LONE}"}}'),
            request_text(32, "chat:session:list", "{}"),
            request_text(33, f"x{LONE}"),
        ]) + "]"
        await proc.send_line(batch)
        replies = {r["id"]: r for r in await proc.next_batch_reply()}
        assert sorted(replies) == [31, 32, 33]
        assert error_of(replies[31])[0] == -32602
        assert replies[32]["result"]["total"] == 0
        assert error_of(replies[33])[0] == -32600
        proc.assert_all_jsonrpc()
        await proc.close()


# ---- batches -----------------------------------------------------------------------------


async def test_a_batch_past_the_item_limit_is_one_invalid_request(tmp_path: Path) -> None:
    async with spawn_sidecar(tmp_path) as proc:
        await proc.call("sidecar:initialize", {})
        items = [request_text(100 + n, "chat:session:list", '{"limit":1}') for n in range(1000)]
        await proc.send_line("[" + ",".join(items) + "]")
        replies = await proc.next_batch_reply(timeout=60)
        assert sorted(r["id"] for r in replies) == list(range(100, 1100))
        await proc.send_line("[" + ",".join([*items, request_text(2000, "chat:session:list", "{}")]) + "]")
        code, message = error_of(await proc.next_null_id_reply())
        assert code == -32600 and "1000" in message
        await still_serving(proc)
        assert not any(isinstance(m, dict) and m.get("id") == 2000 for m in proc.messages)
        await proc.close()


async def test_five_million_tiny_items_cost_one_short_answer(tmp_path: Path) -> None:
    async with spawn_sidecar(tmp_path) as proc:
        await proc.call("sidecar:initialize", {})
        await still_serving(proc)
        before = proc.vm_hwm_kib()
        line = b"[" + b",".join([b"1"] * 5_000_000) + b"]"  # 10 MB, under the 16 MiB line limit
        lines_before = len(proc.lines)
        await proc.send_line(line)
        code, _ = error_of(await proc.next_null_id_reply(timeout=60))
        assert code == -32600
        await still_serving(proc)
        assert max(len(raw) for raw in proc.lines[lines_before:]) < 1024
        after = proc.vm_hwm_kib()
        if before is not None and after is not None:
            # the line itself is 10 MB and is read whole; what it holds is never built
            assert after - before < 100 * 1024, (before, after)
        await proc.close()


async def test_a_batch_answer_is_bounded_and_every_id_is_answered(tmp_path: Path) -> None:
    async with spawn_sidecar(tmp_path) as proc:
        await proc.call("sidecar:initialize", {})
        big = "p" * (3 * 1024 * 1024)
        session = await proc.call("chat:session:create", {"systemPrompt": big}, timeout=30)
        ids = list(range(500, 510))
        items = [request_text(i, "chat:session:get", json.dumps({"id": session["id"]})) for i in ids]
        await proc.send_line("[" + ",".join(items) + "]")
        replies = await proc.next_batch_reply(timeout=60)
        assert [r["id"] for r in replies] == ids
        full = [r for r in replies if "result" in r]
        cut = [r for r in replies if "error" in r]
        assert full and cut, "10 x 3 MiB cannot fit in a 16 MiB answer, and some must"
        assert all(r["result"]["systemPrompt"] == big for r in full)
        assert {error_of(r)[0] for r in cut} == {-32009}
        answer = next(raw for raw in reversed(proc.lines) if raw.startswith(b"["))
        assert len(answer) <= 16 * 1024 * 1024 + 10 * 512
        # alone, each one is answered whole
        alone = await proc.call("chat:session:get", {"id": session["id"]}, timeout=30)
        assert alone["systemPrompt"] == big
        await proc.close()
