"""How much of the Qiming server's data one pull holds at once, and the bounds on it.

Owns: the memory a decoded value holds (``held_bytes``), fetching one conversation's
messages within its budget (``fetch_messages``), one pull's listing (``Listing``: the
newest row of each listed conversation, within the listing's budget), and the gate on what
waits for the importer (``ByteGate``). The wire's own bounds on single values (a message's
text, a topic, a summary) are sidecar.sync.wire's; these bound the sums.

Must stay true:
- a conversation is fetched whole or refused whole: past MAX_CONVERSATION_BYTES (or
  MAX_CONVERSATION_MESSAGES) of kept messages it is the server's fault, BadServerData
  (skipped and reported; nothing of it is stored, a later pull tries again), never a part
  of it imported; the page that passes the bound is not kept;
- a listing keeps one ConversationRow per conversation (never a ``messageList``) and says
  ``stopped`` once it holds more than MAX_LISTED_BYTES, or refused more than
  MAX_REFUSED_ROWS rows: the walk then ends as incomplete (no deletion is inferred from it);
- ByteGate lets a conversation through whenever nothing else waits (one larger than its
  limit still goes, alone), so the pipeline never waits on itself.
Sizes are what Python holds (``sys.getsizeof`` of each value), not the bytes on the wire:
a message of CJK text holds about 2 bytes a character, ASCII 1, emoji 4.
"""

from __future__ import annotations

import sys

import anyio
import msgspec

from sidecar.store.transfer import MAX_IMPORT_MESSAGES
from sidecar.sync.errors import BadServerData, QimingError, ServerMalformed
from sidecar.sync.run import RunContext
from sidecar.sync.wire import ChatMessageDto, ConversationPage, ConversationRow, to_int, to_ms

__all__ = [
    "held_bytes",
    "fetch_messages",
    "Listing",
    "ByteGate",
    "MAX_CONVERSATION_BYTES",
    "MAX_CONVERSATION_MESSAGES",
    "MAX_MESSAGE_PAGES",
    "MAX_LISTED_BYTES",
    "MAX_REFUSED_ROWS",
]

MiB = 1024 * 1024
MAX_CONVERSATION_BYTES = 64 * MiB
"""The messages of one conversation, as held: a long real conversation (thousands of
messages, some of them pasted files) is some megabytes."""
MAX_CONVERSATION_MESSAGES = MAX_IMPORT_MESSAGES
"""The store imports at most this many messages at once (sidecar/store/transfer.py)."""
MAX_MESSAGE_PAGES = 100_000
MAX_LISTED_BYTES = 128 * MiB
"""The rows of one pull's listing, as held: about half a kilobyte a conversation without a
summary, so some hundred thousand conversations."""
MAX_REFUSED_ROWS = 1000
"""``/list`` rows out of bounds (or without a usable id) one pull reports before it stops listing."""
_ENTRY_BYTES = 100
"""What a listing's dict entry (key and slot) holds besides the row."""


def held_bytes(value: object) -> int:
    """About what ``value`` holds in memory: itself, and what its Struct fields, list or
    tuple items, and dict keys and values hold (shared small values counted each time)."""
    size = sys.getsizeof(value)
    if isinstance(value, (str, int, float, bool)) or value is None:
        return size
    if isinstance(value, msgspec.Struct):
        return size + sum(held_bytes(v) for v in msgspec.structs.astuple(value))
    if isinstance(value, (list, tuple)):
        return size + sum(held_bytes(v) for v in value)
    if isinstance(value, dict):
        return size + sum(held_bytes(k) + held_bytes(v) for k, v in value.items())
    return size


async def fetch_messages(ctx: RunContext, cid: int, stop_at: int | None) -> list[ChatMessageDto]:
    """Messages newest first by ``index`` pages until an empty page, or a page that
    reaches ``stop_at`` (an index already held); BadServerData past the budget."""
    size = ctx.settings.message_page_size
    out: list[ChatMessageDto] = []
    held = 0
    index: int | None = None
    for _ in range(MAX_MESSAGE_PAGES):
        page = await ctx.client.list_messages(cid, index=index, size=size)
        indexes: list[int] = []
        for position, message in enumerate(page):
            number = to_int(message.index)
            if number is None:  # the server's primary key: without it a message can be neither placed nor found again
                raise BadServerData(
                    f"conversation {cid}: a message without a usable index ({message.index!r:.40})",
                    field=f"$[{position}].index",
                )
            indexes.append(number)
            held += held_bytes(message)
        if held > MAX_CONVERSATION_BYTES:
            raise BadServerData(
                f"conversation {cid}: its messages come to more than {MAX_CONVERSATION_BYTES // MiB} MiB,"
                " more than one conversation may hold here",
                field="$[*]",
            )
        out.extend(page)
        if len(out) > MAX_CONVERSATION_MESSAGES:
            raise ServerMalformed(f"conversation {cid}: more than {MAX_CONVERSATION_MESSAGES} messages")
        if not indexes:
            return out
        first = min(indexes)
        if stop_at is not None and first <= stop_at:
            return out
        if index is not None and first >= index:
            raise ServerMalformed(f"conversation {cid}: /message/list does not move past index {index}")
        index = first
    raise ServerMalformed(f"conversation {cid}: more than {MAX_MESSAGE_PAGES} pages of messages")


class Listing:
    """One pull's listed conversations: the newest row of each (pages overlap), within budget."""

    def __init__(self) -> None:
        self.rows: dict[int, ConversationRow] = {}
        self.bytes = 0
        self.refused = 0
        self.stopped: str | None = None
        """Why the listing must stop (a note for the report), once it is over a bound."""

    def take(self, ctx: RunContext, page: ConversationPage) -> list[int]:
        """The page's rows in (its ids returned); rows out of bounds, or without a usable
        id, are skipped and reported."""
        ids: list[int] = []
        for row in page.rows:
            cid = to_int(row.id)
            if cid is None or cid <= 0:
                self._refuse(ctx, None, BadServerData(
                    f"/list: a conversation without a usable id ({row.id!r:.40})", field="$.id"))
                continue
            ids.append(cid)
            seen = self.rows.get(cid)
            if seen is None or (to_ms(row.modified) or 0) > (to_ms(seen.modified) or 0):
                self.bytes += held_bytes(row) - (held_bytes(seen) if seen is not None else -_ENTRY_BYTES)
                self.rows[cid] = row
        for bad in page.bad:
            self._refuse(ctx, bad.conversation_id, bad.error)
        if self.bytes > MAX_LISTED_BYTES:
            self.stopped = (f"the server listed more than {MAX_LISTED_BYTES // MiB} MiB of conversations"
                            f" ({len(self.rows)}); stopped listing")
        elif self.refused > MAX_REFUSED_ROWS:
            self.stopped = f"more than {MAX_REFUSED_ROWS} conversations listed out of bounds; stopped listing"
        return ids

    def _refuse(self, ctx: RunContext, cid: int | None, error: QimingError) -> None:
        self.refused += 1
        if self.refused <= MAX_REFUSED_ROWS:
            ctx.skip(cid, error)


class ByteGate:
    """Bytes waiting for the importer: ``enter(n)`` waits while others wait and ``n`` more
    would pass the limit; ``leave(n)`` once they are stored."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self._changed = anyio.Event()

    async def enter(self, n: int) -> None:
        while self.held and self.held + n > self.limit:
            await self._changed.wait()
        self.held += n

    def leave(self, n: int) -> None:
        self.held -= n
        self._changed.set()
        self._changed = anyio.Event()
