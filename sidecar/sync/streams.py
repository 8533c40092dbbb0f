"""The server's event streams read as events: the chat SSE and the computer progress SSE.

Owns parsing a streamed response into the wire Structs (httpx2's SSE reader), one event at
a time, and the mapping of stream failures onto sidecar.sync.errors. How long a stream may
stay silent is the caller's (sidecar.sync.chatstream's idle timer, per event); how long
its response head may take is the client's (sidecar.sync.client).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from typing import TypeVar

import httpx2
import msgspec

from sidecar.sync.errors import ServerMalformed, ServerUnreachable
from sidecar.sync.wire import AgentOutputDto, SessionFrame

__all__ = ["agent_outputs", "session_frames"]

T = TypeVar("T")
Describe = Callable[[str], str]
"""The client's redaction of a message (the token never shows)."""

_outputs = msgspec.json.Decoder(AgentOutputDto)
_frames = msgspec.json.Decoder(SessionFrame)


async def agent_outputs(response: httpx2.Response, describe: Describe) -> AsyncGenerator[AgentOutputDto, None]:
    """The ``data:`` lines of the chat SSE as AgentOutputDto, up to the completed one.

    The server writes no ``event:`` name (Spring's default for a Flux of objects), so
    every event is read by its data. A line that is not an AgentOutputDto ends the stream
    with ServerMalformed; a stream that ends before ``completed: true`` simply stops (the
    caller decides whether to re-attach with ``/chat/sub``).
    """
    async with aclosing(_events(response, describe, _outputs, "chat stream", "an event that is not an AgentOutputDto")) as events:
        async for _, output in events:
            yield output
            if output.completed:
                return


async def session_frames(response: httpx2.Response, describe: Describe) -> AsyncGenerator[SessionFrame, None]:
    """The ``/computer/progress`` frames, up to the one that ends the prompt (a desktop keeps
    the stream open after it). A ``data:`` that is not a UnifiedSessionMessage ends the
    stream with ServerMalformed."""
    async with aclosing(_events(response, describe, _frames, "progress stream", "a frame that is not a session message")) as frames:
        async for name, frame in frames:
            frame.event = "" if name == "message" else name
            yield frame
            if frame.message_type == "sessionPromptEnd":
                return


async def _events(
    response: httpx2.Response, describe: Describe, decoder: msgspec.json.Decoder[T], what: str, not_one: str
) -> AsyncGenerator[tuple[str, T], None]:
    """Each event with data as (its ``event:`` name, its data decoded); failures mapped."""
    source = httpx2.EventSource(response).__aiter__()
    async with aclosing(source) as events:  # type: ignore[type-var]
        try:
            async for event in events:
                if not event.data.strip():
                    continue
                try:
                    decoded = decoder.decode(event.data)
                except (msgspec.DecodeError, RecursionError) as exc:  # ValidationError included
                    raise ServerMalformed(describe(f"{what}: {not_one} ({exc})")) from exc
                yield event.event, decoded
        except httpx2.SSEError as exc:
            raise ServerMalformed(describe(f"{what}: {exc}")) from exc
        except httpx2.TimeoutException as exc:
            raise ServerUnreachable(describe(f"{what}: no event in time"), timeout=True) from exc
        except httpx2.TransportError as exc:
            raise ServerUnreachable(describe(f"{what} dropped ({type(exc).__name__})")) from exc
