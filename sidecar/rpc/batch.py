"""BatchAnswer: the replies of one batch line, bounded, written together once the last is in.

JSON-RPC answers a batch with one array holding a reply per request (notifications get
none). Each reply is encoded when it arrives and the array stays within
``protocol.limits.MAX_BATCH_ANSWER_BYTES``: a reply that would push it past is replaced by
error RESPONSE_TOO_LARGE for the same id (the caller sends that request alone; these short
errors are all that may go beyond the bound), so the memory a batch holds and the line it
writes stay bounded whatever its requests return.
Which replies fit is decided in the order they are answered.

Must stay true: every request of the batch gets exactly one reply in the array, in the
order of the batch; the line is written once, when nothing is left to wait for.
"""

from __future__ import annotations

from collections.abc import Callable

from protocol.errors import ErrorCode
from protocol.limits import MAX_BATCH_ANSWER_BYTES
from sidecar.rpc.messages import Reply, encode, error_reply

__all__ = ["BatchAnswer"]

EncodeReply = Callable[[Reply], bytes]
"""A reply as one encoded line (newline included), never raising."""


class BatchAnswer:
    __slots__ = ("_parts", "_size", "_encode", "_limit", "waiting")

    def __init__(self, items: int, encode_reply: EncodeReply, limit: int = MAX_BATCH_ANSWER_BYTES) -> None:
        self._parts: list[bytes | None] = [None] * items
        self._size = 2  # the brackets
        self._encode = encode_reply
        self._limit = limit
        self.waiting = 0
        """Requests of the batch not answered yet."""

    def put(self, index: int, reply: Reply) -> None:
        encoded = self._encode(reply)[:-1]
        if self._size + len(encoded) + 1 > self._limit:
            encoded = encode(error_reply(
                reply.id, ErrorCode.RESPONSE_TOO_LARGE,
                f"the answer to this request would make the batch's answer larger than {self._limit} bytes:"
                " send it on its own",
            ))[:-1]
        self._parts[index] = encoded
        self._size += len(encoded) + 1

    def line(self) -> bytes | None:
        """The batch's answer (newline included), or None when no item gets a reply."""
        parts = [p for p in self._parts if p is not None]
        if not parts:
            return None
        return b"[" + b",".join(parts) + b"]\n"
