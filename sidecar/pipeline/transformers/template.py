"""6. TemplateTransformer: user messages rendered with a sandboxed Jinja template (seed 000 §4).

When ``transformers.template.enabled``, the text parts of each user message are joined
(blank line between) into ``message`` and rendered with the template; the result replaces
them as one text part where the first one was (images and other parts keep their place).
Variables: ``message``, ``role``, ``date``/``time``/``datetime``/``weekday`` (when the message
was written, local time; now for text the pipeline added), ``model_id``, ``user``,
``assistant``, ``index`` (position among the user messages, from 0).

The engine is jinja2's ``SandboxedEnvironment`` (no attribute access to internals, no
imports, no file system), imported only when a template is used. A template that does not
compile is refused when the profile is saved (``check_template``); a render error leaves
that message unchanged (logged).
"""

from __future__ import annotations

import datetime as dt
import logging
from functools import lru_cache
from typing import Any

import anyio

from protocol.types import ContentPart, TextPart
from sidecar.errors import InvalidParams
from sidecar.pipeline.transformers.base import Draft, TransformContext

__all__ = ["TemplateTransformer", "check_template"]

log = logging.getLogger(__name__)
MAX_TEMPLATE_CHARS = 20_000


@lru_cache(maxsize=32)
def _template(source: str) -> Any:
    from jinja2.sandbox import SandboxedEnvironment

    env = SandboxedEnvironment(autoescape=False, keep_trailing_newline=True)
    return env.from_string(source)


def check_template(source: str) -> None:
    if len(source) > MAX_TEMPLATE_CHARS:
        raise InvalidParams(
            f"invalid params: the template is longer than {MAX_TEMPLATE_CHARS} characters"
            " - at `$.transformers.template.template`"
        )
    from jinja2 import TemplateSyntaxError

    try:
        _template(source)
    except TemplateSyntaxError as exc:
        raise InvalidParams(
            f"invalid params: the template does not compile ({exc.message}, line {exc.lineno})"
            " - at `$.transformers.template.template`"
        ) from exc


class TemplateTransformer:
    name = "Template"

    def enabled(self, ctx: TransformContext) -> bool:
        return ctx.assistant.transformers.template.enabled and bool(ctx.assistant.transformers.template.template)

    async def transform(self, drafts: list[Draft], ctx: TransformContext) -> list[Draft]:
        from jinja2 import TemplateError

        try:
            template = _template(ctx.assistant.transformers.template.template)
        except TemplateError as exc:
            log.warning("the assistant's template does not compile: %s", exc)
            return drafts
        # rendering runs user-controlled template code: a worker thread, off the event loop
        return await anyio.to_thread.run_sync(_render_all, template, drafts, ctx)


def _render_all(template: Any, drafts: list[Draft], ctx: TransformContext) -> list[Draft]:
    tz = ctx.now.tzinfo
    out: list[Draft] = []
    index = 0
    for draft in drafts:
        texts = [p.text for p in draft.parts if isinstance(p, TextPart)]
        if draft.role != "user" or not texts:
            out.append(draft)
            continue
        when = dt.datetime.fromtimestamp(draft.created_at / 1000, tz) if draft.created_at else ctx.now
        try:
            rendered = template.render(
                message="\n\n".join(texts), role=draft.role,
                date=f"{when:%Y-%m-%d}", time=f"{when:%H:%M}", datetime=f"{when:%Y-%m-%d %H:%M}",
                weekday=f"{when:%A}", model_id=ctx.model.id,
                user=ctx.assistant.transformers.user_name or "User", assistant=ctx.assistant.name,
                index=index,
            )
        except Exception as exc:  # the sandbox raises SecurityError, templates any error
            log.warning("template rendering failed: %s", exc)
            out.append(draft)
            index += 1
            continue
        index += 1
        parts: list[ContentPart] = []
        placed = False
        for part in draft.parts:
            if isinstance(part, TextPart):
                if not placed:
                    parts.append(TextPart(text=rendered))
                    placed = True
            else:
                parts.append(part)
        out.append(Draft(role="user", parts=parts, source_id=draft.source_id, created_at=draft.created_at))
    return out
