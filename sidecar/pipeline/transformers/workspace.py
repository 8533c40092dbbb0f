"""7. WorkspaceReminderTransformer: the session's workspace as context (seed 000 §4).

When the session has a ``workspaceDir`` and ``transformers.workspaceReminder`` is on, the
last user message gets a text part naming the working directory and its top-level entries
(directories end in ``/``; at most ``MAX_ENTRIES``, hidden entries left out):
``<workspace>Working directory: /path\nTop-level entries: README.md, src/, ...</workspace>``.
A directory that does not exist (or cannot be read) is said so. File names are anyone's
(a cloned repository, a download): the path and each name are written by the rule for
untrusted text (sidecar/untrusted.py), so a name holding a line break cannot start a line.
"""

from __future__ import annotations

import os

import anyio

from protocol.types import TextPart
from sidecar.pipeline.transformers.base import Draft, TransformContext, last_index
from sidecar.untrusted import escape

__all__ = ["WorkspaceReminderTransformer", "workspace_text", "MAX_ENTRIES"]

MAX_ENTRIES = 50


def workspace_text(path: str) -> str:
    try:
        with os.scandir(path) as it:
            entries = sorted(
                (e.name + ("/" if e.is_dir(follow_symlinks=False) else "") for e in it if not e.name.startswith(".")),
                key=str.lower,
            )
    except OSError as exc:
        return f"<workspace>Working directory: {escape(path)}\n(it cannot be read: {escape(str(exc.strerror or exc))})</workspace>"
    shown = [escape(e) for e in entries[:MAX_ENTRIES]]
    more = f", ... ({len(entries) - MAX_ENTRIES} more)" if len(entries) > MAX_ENTRIES else ""
    listing = ", ".join(shown) + more if shown else "(empty)"
    return f"<workspace>Working directory: {escape(path)}\nTop-level entries: {listing}</workspace>"


class WorkspaceReminderTransformer:
    name = "WorkspaceReminder"

    def enabled(self, ctx: TransformContext) -> bool:
        return ctx.assistant.transformers.workspace_reminder and bool(ctx.session.workspace_dir)

    async def transform(self, drafts: list[Draft], ctx: TransformContext) -> list[Draft]:
        index = last_index(drafts, "user")
        if index is None or not ctx.session.workspace_dir:
            return drafts
        text = await anyio.to_thread.run_sync(workspace_text, ctx.session.workspace_dir)
        out = list(drafts)
        old = out[index]
        out[index] = Draft(role="user", parts=[*old.parts, TextPart(text=text)],
                           source_id=old.source_id, created_at=old.created_at)
        return out
