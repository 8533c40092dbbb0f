"""In-process transport: two connected peers' streams without pipes (tests, benchmarks).

``memory_pipe()`` returns a (receive, send) pair of memory object streams carrying
bytes; ``connected_pair()`` returns the streams for both ends of a duplex connection:
what side A sends, side B receives, and the other way round. Closing a send stream is
end of input for the other side, exactly like closing a pipe.
"""

from __future__ import annotations

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

Pipe = tuple[MemoryObjectReceiveStream[bytes], MemoryObjectSendStream[bytes]]


def memory_pipe(max_buffer: float = 64) -> Pipe:
    send, receive = anyio.create_memory_object_stream[bytes](max_buffer)
    return receive, send


def connected_pair(max_buffer: float = 64) -> tuple[Pipe, Pipe]:
    """``((a_receive, a_send), (b_receive, b_send))``: a_send feeds b_receive and b_send feeds a_receive."""
    a_to_b_receive, a_to_b_send = memory_pipe(max_buffer)
    b_to_a_receive, b_to_a_send = memory_pipe(max_buffer)
    return (b_to_a_receive, a_to_b_send), (a_to_b_receive, b_to_a_send)
