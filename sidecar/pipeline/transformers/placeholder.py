"""3. PlaceholderTransformer: prompt placeholders resolved (seed 000 §4).

In the text parts of system and user messages (assistant messages are left alone: they are
what the model wrote), these are replaced; anything else in braces is left as it is:

| placeholder | becomes |
| --- | --- |
| ``{cur_date}`` | local date, ``2026-03-09`` |
| ``{cur_time}`` | local time, ``14:05`` |
| ``{cur_datetime}`` | ``2026-03-09 14:05`` |
| ``{cur_weekday}`` | ``Monday`` |
| ``{timezone}`` | ``UTC+08:00`` |
| ``{model_id}`` / ``{model_name}`` | the model's id |
| ``{user}`` / ``{nickname}`` / ``{{user}}`` | ``transformers.userName`` (``User`` when empty) |
| ``{char}`` / ``{assistant}`` / ``{{char}}`` | the assistant profile's name |
| ``{session_title}`` | the session's title, written as untrusted text (sidecar/untrusted.py) |
| ``{system_version}`` | the operating system, e.g. ``Linux 6.1`` |

The title is the one value not set by the user's own settings: a Qiming server's
conversation topic, an IM chat's or sender's name, or what a model proposed. It is escaped
so a system prompt that names it cannot be given a line or an element by it.
"""

from __future__ import annotations

import platform
import re

from protocol.types import ContentPart, TextPart
from sidecar.pipeline.transformers.base import Draft, TransformContext
from sidecar.untrusted import escape

__all__ = ["PlaceholderTransformer", "placeholder_values"]

_PATTERN = re.compile(r"\{\{(user|char)\}\}|\{([a-z_]+)\}")


def placeholder_values(ctx: TransformContext) -> dict[str, str]:
    now = ctx.now
    offset = now.strftime("%z") or "+0000"
    user = ctx.assistant.transformers.user_name.strip() or "User"
    return {
        "cur_date": f"{now:%Y-%m-%d}",
        "cur_time": f"{now:%H:%M}",
        "cur_datetime": f"{now:%Y-%m-%d %H:%M}",
        "cur_weekday": f"{now:%A}",
        "timezone": f"UTC{offset[:3]}:{offset[3:]}",
        "model_id": ctx.model.id,
        "model_name": ctx.model.id,
        "user": user,
        "nickname": user,
        "char": ctx.assistant.name,
        "assistant": ctx.assistant.name,
        "session_title": escape(ctx.session.title),
        "system_version": f"{platform.system()} {platform.release()}".strip(),
    }


class PlaceholderTransformer:
    name = "Placeholder"

    def enabled(self, ctx: TransformContext) -> bool:
        return ctx.assistant.transformers.placeholders

    async def transform(self, drafts: list[Draft], ctx: TransformContext) -> list[Draft]:
        values = placeholder_values(ctx)

        def replace(match: re.Match[str]) -> str:
            key = match.group(1) or match.group(2)
            return values.get(key, match.group(0))

        out: list[Draft] = []
        for draft in drafts:
            if draft.role == "assistant":
                out.append(draft)
                continue
            parts: list[ContentPart] = [
                TextPart(text=_PATTERN.sub(replace, p.text)) if isinstance(p, TextPart) and "{" in p.text else p
                for p in draft.parts
            ]
            out.append(Draft(role=draft.role, parts=parts, source_id=draft.source_id, created_at=draft.created_at))
        return out
