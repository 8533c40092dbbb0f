"""2. PromptInjectionTransformer: modes and lorebook entries at their positions (seed 000 §4).

A mode (``modes``) is injected whenever it is enabled. A lorebook entry is injected when one
of its keywords occurs in the text of the last ``scanDepth`` messages of the request
(case-insensitive unless ``caseSensitive``), or always when ``constant``.

Positions: ``before_system`` / ``after_system`` put the text before/after the system prompt
text (a system message is created if there is none); ``top_of_chat`` inserts a message of
the entry's role before the first chat message; ``bottom_of_chat`` appends one after the
last; ``at_depth`` inserts one ``depth`` messages above the end (0 = the end). Several
injections at one position keep their order in the profile (modes first, then lorebook).
"""

from __future__ import annotations

from protocol.context import LorebookEntry, PromptInjection
from protocol.types import TextPart
from sidecar.pipeline.transformers.base import (
    Draft,
    TransformContext,
    text_of,
    with_system_text,
)

__all__ = ["PromptInjectionTransformer", "triggered"]


def triggered(entry: LorebookEntry, drafts: list[Draft]) -> bool:
    if not entry.enabled:
        return False
    if entry.constant:
        return True
    chat = [d for d in drafts if d.role != "system"]
    depth = max(1, min(entry.scan_depth, 1000))
    haystack = "\n".join(text_of(d) for d in chat[-depth:])
    if not entry.case_sensitive:
        haystack = haystack.lower()
    for keyword in entry.keywords:
        key = keyword if entry.case_sensitive else keyword.lower()
        if key.strip() and key in haystack:
            return True
    return False


class PromptInjectionTransformer:
    name = "PromptInjection"

    def enabled(self, ctx: TransformContext) -> bool:
        return any(m.enabled for m in ctx.assistant.modes) or any(e.enabled for e in ctx.assistant.lorebook)

    async def transform(self, drafts: list[Draft], ctx: TransformContext) -> list[Draft]:
        chosen: list[PromptInjection | LorebookEntry] = [m for m in ctx.assistant.modes if m.enabled]
        chosen += [e for e in ctx.assistant.lorebook if triggered(e, drafts)]
        if not chosen:
            return drafts
        out = list(drafts)
        before = [c.content for c in chosen if c.position == "before_system" and c.content.strip()]
        after = [c.content for c in chosen if c.position == "after_system" and c.content.strip()]
        if before:
            out = with_system_text(out, "\n\n".join(before), prepend=True)
        if after:
            out = with_system_text(out, "\n\n".join(after))
        system = 1 if out and out[0].role == "system" else 0
        top = [_message(c) for c in chosen if c.position == "top_of_chat"]
        out[system:system] = top
        end = len(out)  # depth counts chat messages, not the bottom injections
        for item in (c for c in chosen if c.position == "at_depth"):
            at = max(system, end - max(0, item.depth))
            out.insert(at, _message(item))
            end += 1
        out.extend(_message(c) for c in chosen if c.position == "bottom_of_chat")
        return out


def _message(item: PromptInjection | LorebookEntry) -> Draft:
    return Draft(role=item.role, parts=[TextPart(text=item.content)])
