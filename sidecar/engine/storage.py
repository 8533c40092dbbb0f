"""StorageService: removing the files of what was deleted, and orphans (``storage:gc``).

The database decides what is released (sidecar/store/files.py: a trigger journals every
file whose last owner goes, in the transaction of the delete); this service removes the
journaled files from disk:

- ``release()``: the one function for "sessions or messages are gone, remove their files".
  Call it after anything that deleted sessions or messages (``chat:session:delete``, an
  import that replaces a session, deleted messages: ``chat:messages:delete``), once
  the delete is committed::

      await store.run(lambda s: s.messages.delete_branch(message_id))
      freed = await app.storage.release()       # files, bytes

  It also runs the ``on_release`` hooks (the ACP handler closes the agent sessions no reply
  uses any more). A removal a crash cut short stays journaled and is finished by the next
  ``release`` (the start-up pass runs one);
- ``gc(params)`` (``storage:gc``): ``release``, then the orphan sweep: entries of the data
  dir's managed folders that nothing owns (files written just before a crash, before their
  row was stored), older than the grace period; progress with ``sidecar:progress`` under
  the caller's token;
- ``start(task_group)``: the same pass once at start-up, in the background (its result is
  logged), so it never delays the first answers.

Must stay true: a file is removed only while the write lock is held and no row owns it
(files.py ``release``/``sweep``); directories are renamed into a trash folder under that
lock and emptied after it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

from protocol.storage import StorageGcParams, StorageGcResult
from sidecar.engine.progress import WorkProgress, work_progress
from sidecar.errors import InvalidParams, SidecarError
from sidecar.store.async_store import AsyncStore
from sidecar.store.files import Deletion
from sidecar.store.janitor import GC_GRACE_S, Detached, Freed, detach, detach_orphan, orphans, purge
from sidecar.store.store import Store

__all__ = ["StorageService"]

log = logging.getLogger(__name__)

Notify = Callable[[str, Any], Awaitable[None]]
BATCH = 200
STARTUP_DELAY_S = 0.5
"""The start-up pass waits this long: the first requests come first."""
MAX_GRACE_MS = 30 * 24 * 3600 * 1000


class StorageService:
    """The methods the server binds as ``storage.<name>``, and ``release`` for the engine."""

    def __init__(self, store: AsyncStore, notify: Notify) -> None:
        self._store = store
        self._notify = notify
        self._data_dir: Path = store.blocking.data_dir
        self._lock = anyio.Lock()
        self.on_release: list[Callable[[], Awaitable[None]]] = []
        """Run after every ``release`` (the ACP handler closes released agent sessions)."""

    # ---- release ------------------------------------------------------------------------

    async def release(self) -> Freed:
        """Remove the files that deletes released; what that freed (see the module docstring)."""
        async with self._lock:
            freed = await self._release()
        for hook in list(self.on_release):
            try:
                await hook()
            except anyio.get_cancelled_exc_class():
                raise
            except Exception:
                log.exception("a release hook failed")
        return freed

    async def _release(self) -> Freed:
        freed = Freed()
        trash: list[Path] = []
        data_dir = self._data_dir
        workspaces = await self._store.run(lambda s: s.files.workspace_dirs() if s.files.has_deletions() else None)
        if workspaces is None:
            return freed  # nothing journaled: the common case costs one read

        def remove(deletion: Deletion) -> bool:
            result: Detached = detach(data_dir, deletion, workspaces)
            freed.add(result.freed)
            if result.trash is not None:
                trash.append(result.trash)
            return result.done

        while True:
            seen, done = await self._store.run(lambda s: s.files.release(remove, limit=BATCH))
            if seen < BATCH or done < seen:  # the journal is empty, or what is left must wait
                break
        for folder in trash:
            freed.add(await anyio.to_thread.run_sync(purge, folder))
        if freed.files:
            log.info("removed %d files (%d bytes) of deleted sessions and messages", freed.files, freed.bytes)
        return freed

    # ---- storage:gc ---------------------------------------------------------------------

    async def gc(self, params: StorageGcParams) -> StorageGcResult:
        grace_ms = GC_GRACE_S * 1000 if params.grace_ms is None else params.grace_ms
        if not 0 <= grace_ms <= MAX_GRACE_MS:
            raise InvalidParams(f"invalid params: graceMs must be between 0 and {MAX_GRACE_MS} - at `$.graceMs`")
        async with work_progress(self._notify, params.progress_token, "finishing pending removals") as progress:
            if progress is not None:
                await progress.begin(None)
            pending = await self.release()
            swept = await self._sweep(grace_ms / 1000, progress)
            total = Freed(files=pending.files + swept.files, bytes=pending.bytes + swept.bytes)
            if progress is not None:
                progress.summary = f"freed {total.files} files, {total.bytes} bytes"
        return StorageGcResult(files=total.files, bytes=total.bytes, pending=pending.files)

    async def _sweep(self, grace_s: float, progress: WorkProgress | None) -> Freed:
        data_dir = self._data_dir

        def read(s: Store) -> tuple[set[str], set[str], list[str]]:
            return s.files.owned() | s.files.queued_inbox_refs(), s.files.session_ids(), s.files.workspace_dirs()

        async with self._lock:
            owned, sessions, workspaces = await self._store.run(read)
            found = await anyio.to_thread.run_sync(
                lambda: list(orphans(data_dir, owned, sessions, workspaces, grace_s=grace_s))
            )
            leftovers = [rel for rel, is_trash in found if is_trash]
            candidates = [rel for rel, is_trash in found if not is_trash]
            freed = Freed()
            done = 0
            trash = [data_dir / rel for rel in leftovers]

            def remove(rel: str) -> None:
                result = detach_orphan(data_dir, rel)
                freed.add(result.freed)
                if result.trash is not None:
                    trash.append(result.trash)

            for start in range(0, len(candidates), BATCH):
                batch = candidates[start : start + BATCH]
                await self._store.run(lambda s: s.files.sweep(batch, remove))
                done += len(batch)
                if progress is not None:
                    await progress.report(done, len(found), f"{freed.files} files removed")
            for folder in trash:
                freed.add(await anyio.to_thread.run_sync(purge, folder))
            if progress is not None:
                progress.done, progress.total = len(found), len(found)
        if freed.files:
            log.info("removed %d orphaned files (%d bytes) from the data dir", freed.files, freed.bytes)
        return freed

    # ---- start-up -----------------------------------------------------------------------

    def start(self, task_group: anyio.abc.TaskGroup) -> None:
        """Finish interrupted removals and sweep orphans once, in the background."""
        task_group.start_soon(self._startup)

    async def _startup(self) -> None:
        await anyio.sleep(STARTUP_DELAY_S)
        try:
            result = await self.gc(StorageGcParams())
        except SidecarError as exc:
            log.warning("the start-up storage pass failed: %s", exc.message)
            return
        except Exception:
            log.exception("the start-up storage pass failed")
            return
        log.info(
            "start-up storage pass: freed %d files (%d bytes; %d of earlier deletes)",
            result.files, result.bytes, result.pending,
        )
