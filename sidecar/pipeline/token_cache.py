"""TokenLedger: per-message token counts, cached so a long branch is tokenized once.

Owns: the two cache levels of message token counts: a bounded in-memory map
``(message id, encoding) -> (content hash, tokens)`` and the ``message_tokens`` table (so a
restart does not re-tokenize either). A cached count is used only while the message's
content hash is unchanged (a streaming reply's count is recomputed once it is final).

Blocking (tokenizes, reads and writes the database): call from a worker thread. Thread-safe.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence

from protocol.types import FINAL_MESSAGE_STATUSES, MessageV2
from sidecar import tokens as tk
from sidecar.store.context import ContextRepo

__all__ = ["TokenLedger"]


class TokenLedger:
    def __init__(
        self,
        repo: ContextRepo | None = None,
        *,
        file_size: Callable[[str], int | None] = lambda uri: None,
        max_entries: int = 200_000,
    ) -> None:
        self._repo = repo  # None: memory only
        self._file_size = file_size
        self._max = max_entries
        self._memory: OrderedDict[tuple[str, str], tuple[str, int]] = OrderedDict()
        self._lock = threading.Lock()
        self.counted = 0
        """Messages tokenized so far (not served from a cache): for tests and benchmarks."""

    def counts(self, messages: Sequence[MessageV2], encoding: str) -> list[int]:
        hashes = [tk.content_hash(m) for m in messages]
        out: list[int | None] = [None] * len(messages)
        missing: list[int] = []
        with self._lock:
            for i, m in enumerate(messages):
                hit = self._memory.get((m.id, encoding))
                if hit is not None and hit[0] == hashes[i]:
                    out[i] = hit[1]
                    self._memory.move_to_end((m.id, encoding))
                else:
                    missing.append(i)
        if missing and self._repo is not None:
            stored = self._repo.get_token_counts(encoding, (messages[i].id for i in missing))
            still: list[int] = []
            for i in missing:
                hit = stored.get(messages[i].id)
                if hit is not None and hit[0] == hashes[i]:
                    out[i] = hit[1]
                    self._remember(messages[i].id, encoding, hit)
                else:
                    still.append(i)
            missing = still
        fresh: list[tuple[str, str, int]] = []
        for i in missing:
            m = messages[i]
            n = tk.message_tokens(m, encoding, file_size=self._file_size)
            out[i] = n
            self.counted += 1
            self._remember(m.id, encoding, (hashes[i], n))
            if m.status in FINAL_MESSAGE_STATUSES:
                fresh.append((m.id, hashes[i], n))
        if fresh and self._repo is not None:
            self._repo.put_token_counts(encoding, fresh)
        return [n if n is not None else 0 for n in out]

    def _remember(self, message_id: str, encoding: str, entry: tuple[str, int]) -> None:
        with self._lock:
            self._memory[(message_id, encoding)] = entry
            self._memory.move_to_end((message_id, encoding))
            while len(self._memory) > self._max:
                self._memory.popitem(last=False)
