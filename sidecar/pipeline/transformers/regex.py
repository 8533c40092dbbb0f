"""Regex rules of an assistant profile (seed 000 sections 1 and 7).

``user`` rules rewrite the TEXT parts of user messages in the request copy (images, files and
every other part stay as they are); ``assistant`` rules rewrite the text parts of a finished
reply before it is stored (sidecar/pipeline/output.py). ``both`` is both.

Decision: user rules apply to the request copy on every request, not to the stored message,
so the user keeps seeing what they typed and changing a rule takes effect on the whole
history; the model sees exactly what it would had the rule rewritten the input at send time.

A rule whose pattern does not compile is refused when the profile is saved
(``compile_rules(..., strict=True)``); one that still fails at run time is skipped.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from functools import lru_cache

from protocol.context import RegexRule
from protocol.types import ContentPart, TextPart
from sidecar.errors import InvalidParams
from sidecar.pipeline.transformers.base import Draft, TransformContext

__all__ = ["compile_rules", "apply_rules", "UserRegexTransformer"]

log = logging.getLogger(__name__)


@lru_cache(maxsize=512)
def _compile(pattern: str, ignore_case: bool, multiline: bool) -> re.Pattern[str]:
    flags = (re.IGNORECASE if ignore_case else 0) | (re.MULTILINE if multiline else 0)
    return re.compile(pattern, flags)


def compile_rules(
    rules: Sequence[RegexRule], scope: str, *, strict: bool = False
) -> list[tuple[re.Pattern[str], str]]:
    """The enabled rules for ``scope`` ("user" or "assistant"), compiled."""
    out: list[tuple[re.Pattern[str], str]] = []
    for index, rule in enumerate(rules):
        if strict or (rule.enabled and rule.scope in (scope, "both")):
            try:
                pattern = _compile(rule.pattern, rule.ignore_case, rule.multiline)
                pattern.sub(rule.replacement, "")  # a bad group reference fails here
            except (re.error, IndexError) as exc:
                if strict:
                    raise InvalidParams(
                        f"invalid params: regexRules[{index}] is not a valid rule ({exc}) - at `$.regexRules[{index}]`"
                    ) from exc
                log.warning("skipping regex rule %r: %s", rule.pattern, exc)
                continue
            if rule.enabled and rule.scope in (scope, "both"):
                out.append((pattern, rule.replacement))
    return out


def apply_rules(text: str, compiled: Sequence[tuple[re.Pattern[str], str]]) -> str:
    for pattern, replacement in compiled:
        try:
            text = pattern.sub(replacement, text)
        except (re.error, IndexError) as exc:
            log.warning("regex rule %r failed: %s", pattern.pattern, exc)
    return text


class UserRegexTransformer:
    """Runs before the nine transformers: the seed applies these rules to the input itself."""

    name = "UserRegex"

    def enabled(self, ctx: TransformContext) -> bool:
        return any(r.enabled and r.scope in ("user", "both") for r in ctx.assistant.regex_rules)

    async def transform(self, drafts: list[Draft], ctx: TransformContext) -> list[Draft]:
        compiled = compile_rules(ctx.assistant.regex_rules, "user")
        out: list[Draft] = []
        for draft in drafts:
            if draft.role != "user":
                out.append(draft)
                continue
            parts: list[ContentPart] = [
                TextPart(text=apply_rules(p.text, compiled)) if isinstance(p, TextPart) else p for p in draft.parts
            ]
            out.append(Draft(role="user", parts=parts, source_id=draft.source_id, created_at=draft.created_at))
        return out
