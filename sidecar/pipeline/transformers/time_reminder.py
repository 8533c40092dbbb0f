"""1. TimeReminderTransformer: the current time as context for the model (seed 000 §4).

When ``transformers.timeReminder`` is on, the last user message of the request gets one more
text part: ``<time_reminder>Current time: 2026-03-09 14:05 (Monday), UTC+08:00</time_reminder>``
(local time of the machine, with its UTC offset).
"""

from __future__ import annotations

from protocol.types import TextPart
from sidecar.pipeline.transformers.base import Draft, TransformContext, last_index

__all__ = ["TimeReminderTransformer", "time_reminder_text"]


def time_reminder_text(ctx: TransformContext) -> str:
    now = ctx.now
    offset = now.strftime("%z") or "+0000"
    return (
        f"<time_reminder>Current time: {now:%Y-%m-%d %H:%M} ({now:%A}), "
        f"UTC{offset[:3]}:{offset[3:]}</time_reminder>"
    )


class TimeReminderTransformer:
    name = "TimeReminder"

    def enabled(self, ctx: TransformContext) -> bool:
        return ctx.assistant.transformers.time_reminder

    async def transform(self, drafts: list[Draft], ctx: TransformContext) -> list[Draft]:
        index = last_index(drafts, "user")
        if index is None:
            return drafts
        out = list(drafts)
        old = out[index]
        out[index] = Draft(
            role="user", parts=[*old.parts, TextPart(text=time_reminder_text(ctx))],
            source_id=old.source_id, created_at=old.created_at,
        )
        return out
