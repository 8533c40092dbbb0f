"""WorkProgress: one piece of long work reported as progress (protocol/common.py).

The convention: the caller names the work with ``progressToken``; the sidecar then sends
one ``begin`` (when the work really starts, with its ``total`` once known), ``report``s at
most every REPORT_INTERVAL_S, and exactly one ``end`` when the work is over, whatever the
outcome (its ``message`` says ``failed: ...`` for a failure), before the request's answer.
Work refused before it starts (a session that does not exist) sends nothing.

The work itself usually runs in a store worker thread: ``from_thread(done, total)`` is the
callback it calls there (it hands the notification to the event loop and waits for it to
be queued, so the order of ``begin``/``report``/``end`` is the order of the calls).

A leaf module: the engine, knowledge bases, storage and sync all report through it.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio.from_thread

from protocol.common import ProgressKind, ProgressParams, ProgressToken
from protocol.notifications import PROGRESS
from sidecar.notify import Notifier

__all__ = ["WorkProgress", "work_progress", "REPORT_INTERVAL_S"]

REPORT_INTERVAL_S = 0.2


class WorkProgress:
    def __init__(self, notify: Notifier, token: ProgressToken, what: str) -> None:
        self._notify = notify
        self._token = token
        self._what = what
        self.begun = False
        self.done = 0
        self.total: int | None = None
        self.summary: str | None = None
        """What the ``end`` of a successful piece of work says (default ``done``)."""
        self._last = 0.0

    def from_thread(self, done: int, total: int | None) -> None:
        """Progress of the work, called from the worker thread doing it."""
        self.done, self.total = done, total
        now = time.monotonic()
        if not self.begun:
            self.begun = True
            self._last = now
            anyio.from_thread.run(self._send, "begin", done, total, self._what)
        elif now - self._last >= REPORT_INTERVAL_S:
            self._last = now
            anyio.from_thread.run(self._send, "report", done, total, None)

    async def report(self, done: int, total: int | None, message: str | None = None, *, force: bool = False) -> None:
        """Progress of the work from the event loop (at most every REPORT_INTERVAL_S, unless
        ``force``: a step worth showing at once)."""
        self.done, self.total = done, total
        now = time.monotonic()
        if self.begun and (force or now - self._last >= REPORT_INTERVAL_S):
            self._last = now
            await self._send("report", done, total, message)

    async def begin(self, total: int | None, message: str | None = None) -> None:
        """The work starts (its ``message``, default the name it was given)."""
        if not self.begun:
            self.begun = True
            self.total = total
            self._last = time.monotonic()
            await self._send("begin", 0, total, message or self._what)

    async def end(self, message: str) -> None:
        if self.begun:
            self.begun = False
            await self._send("end", self.done, self.total, message)

    async def _send(self, kind: ProgressKind, done: int, total: int | None, message: str | None) -> None:
        await self._notify(
            PROGRESS, ProgressParams(token=self._token, kind=kind, done=done, total=total, message=message)
        )


@asynccontextmanager
async def work_progress(notify: Notifier, token: ProgressToken | None, what: str) -> AsyncIterator[WorkProgress | None]:
    """A WorkProgress for ``token`` (None without one); its ``end`` is sent on leaving,
    shielded, with ``done`` or ``failed: <why>``."""
    if token is None:
        yield None
        return
    progress = WorkProgress(notify, token, what)
    try:
        yield progress
    except BaseException as exc:
        reason = getattr(exc, "message", None) or type(exc).__name__
        with anyio.CancelScope(shield=True), anyio.move_on_after(1):
            await progress.end(f"failed: {reason}")
        raise
    else:
        if progress.total is not None:
            progress.done = progress.total
        with anyio.CancelScope(shield=True), anyio.move_on_after(1):
            await progress.end(progress.summary or "done")
