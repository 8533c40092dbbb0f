"""EventHub: notifications reach the client first, then bounded in-process subscribers."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from protocol.events import TextDeltaEvent
from sidecar.engine.events import EventHub

pytestmark = pytest.mark.anyio


def delta(session_id: str, seq: int) -> TextDeltaEvent:
    return TextDeltaEvent(session_id=session_id, message_id="m", timestamp=0, seq=seq, text=str(seq))


class Client:
    def __init__(self) -> None:
        self.sent: list[tuple[str, Any]] = []

    async def __call__(self, method: str, params: Any = None) -> None:
        self.sent.append((method, params))


async def test_events_reach_the_client_and_the_session_subscribers() -> None:
    client = Client()
    hub = EventHub(client)
    with hub.subscribe("s1") as mine, hub.subscribe("s2") as other, hub.subscribe() as every:
        await hub.publish("chat:stream", delta("s1", 1))
        await hub.publish("chat:session:updated", {"id": "s1"})
        await hub.publish("chat:stream", delta("s2", 1))
        with anyio.fail_after(5):
            assert (await mine.receive()).seq == 1
            assert (await other.receive()).session_id == "s2"
            assert [(await every.receive()).session_id for _ in range(2)] == ["s1", "s2"]
    assert [m for m, _ in client.sent] == ["chat:stream", "chat:session:updated", "chat:stream"]
    # the subscriptions are gone: publishing needs no listener
    await hub.publish("chat:stream", delta("s1", 2))
    assert hub._by_session == {} and hub._all == set()


async def test_a_subscriber_that_falls_behind_is_cut_off_and_never_blocks() -> None:
    client = Client()
    hub = EventHub(client)
    with hub.subscribe("s1", buffer=3) as slow:
        with anyio.fail_after(5):  # never waits on the subscriber
            for seq in range(1, 11):
                await hub.publish("chat:stream", delta("s1", seq))
        assert slow.overflowed
        got = [event.seq async for event in slow]
        assert got == [1, 2, 3]  # what fit, then the end of the stream
    assert len(client.sent) == 10


async def test_iteration_ends_when_the_subscription_closes() -> None:
    hub = EventHub(Client())
    with hub.subscribe("s1") as sub:
        await hub.publish("chat:stream", delta("s1", 1))
        sub._send.close()
        assert [event.seq async for event in sub] == [1]
