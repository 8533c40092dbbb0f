"""Reasoning level -> each wire format's knob, per model family (seed 000 §6).

Owns the tables below; adapters call ``openai_effort``, ``openai_family``,
``anthropic_thinking`` and ``ollama_think``. A level is applied only when the
model says ``supports_reasoning``; ``None`` and ``auto`` leave the provider's
default (nothing is sent).

OpenAI-compatible ``reasoning_effort`` (model id matched after any ``vendor/`` prefix):

    family            efforts offered                    off        max
    o1 / o3 / o4-*    low medium high                    (omit)     high
    gpt-5 (5.0)       minimal low medium high            minimal    high
    gpt-5.1           none low medium high               none       high
    gpt-5.2+, *-max   none low medium high xhigh         none       xhigh
    anything else     low medium high                    (omit)     high

A level the family lacks is clamped to the nearest offered one below it (or the
lowest offered). o-series and gpt-5 families also take ``max_completion_tokens``
instead of ``max_tokens`` and reject sampling parameters (temperature/top_p are
not sent to them).

Anthropic ``thinking: {type: enabled, budget_tokens}``:

    low 2048, medium 8192, high 16384 budget tokens; max = the largest budget that
    fits: max_tokens is raised to the model's max output (32000 when unknown) and
    the budget is that minus room for the answer (min(4096, max_tokens/4)).
    For low..high, max_tokens is raised to budget + 4096 when smaller, but never
    above the model's max output (the budget shrinks instead). Budgets below the
    API minimum of 1024 turn thinking off. off/auto: not sent (the API default is
    off). temperature/top_p are not sent with thinking (the API rejects them).

Ollama ``think``:

    gpt-oss family    "low" / "medium" / "high" (max -> "high"; off -> omitted: it
                      cannot stop reasoning)
    other families    off -> false, low..max -> true
"""

from __future__ import annotations

import re

import msgspec

from sidecar.providers.types import ModelInfo, ReasoningLevel

__all__ = [
    "OpenAIFamily",
    "openai_family",
    "openai_effort",
    "AnthropicThinking",
    "anthropic_thinking",
    "ollama_think",
    "ANTHROPIC_BUDGETS",
    "ANTHROPIC_DEFAULT_MAX_TOKENS",
]

_EFFORT_ORDER = ("none", "minimal", "low", "medium", "high", "xhigh")


class OpenAIFamily(msgspec.Struct, frozen=True):
    name: str
    efforts: tuple[str, ...]
    off: str | None
    reasoning_model: bool
    """Takes max_completion_tokens and rejects temperature/top_p."""


_DEFAULT = OpenAIFamily("default", ("low", "medium", "high"), None, False)
_FAMILIES: tuple[tuple[re.Pattern[str], OpenAIFamily], ...] = (
    (re.compile(r"^o[134](-|$)"), OpenAIFamily("o-series", ("low", "medium", "high"), None, True)),
    (
        re.compile(r"^gpt-5(\.[2-9]|\.\d{2,}|\.1-codex-max)"),
        OpenAIFamily("gpt-5.2", ("none", "low", "medium", "high", "xhigh"), "none", True),
    ),
    (re.compile(r"^gpt-5\.1"), OpenAIFamily("gpt-5.1", ("none", "low", "medium", "high"), "none", True)),
    (re.compile(r"^gpt-5(-|$)"), OpenAIFamily("gpt-5", ("minimal", "low", "medium", "high"), "minimal", True)),
)


def _bare(model_id: str) -> str:
    return model_id.rsplit("/", 1)[-1].lower()


def openai_family(model_id: str) -> OpenAIFamily:
    bare = _bare(model_id)
    for pattern, family in _FAMILIES:
        if pattern.search(bare):
            return family
    return _DEFAULT


def openai_effort(model: ModelInfo, level: ReasoningLevel | None) -> str | None:
    """The ``reasoning_effort`` value to send, or None to send nothing."""
    if not model.supports_reasoning or level is None or level == "auto":
        return None
    family = openai_family(model.id)
    if level == "off":
        return family.off
    if level == "max":
        return family.efforts[-1]
    if level in family.efforts:
        return level
    wanted = _EFFORT_ORDER.index(level)
    below = [e for e in family.efforts if _EFFORT_ORDER.index(e) <= wanted]
    return below[-1] if below else family.efforts[0]


# -- Anthropic -------------------------------------------------------------------

ANTHROPIC_BUDGETS: dict[str, int] = {"low": 2048, "medium": 8192, "high": 16384}
ANTHROPIC_DEFAULT_MAX_TOKENS = 4096
_MIN_BUDGET = 1024
_ANSWER_ROOM = 4096
_UNKNOWN_CEILING = 32000


class AnthropicThinking(msgspec.Struct, frozen=True):
    max_tokens: int
    budget_tokens: int | None
    """None: thinking is not enabled."""


def anthropic_thinking(model: ModelInfo, level: ReasoningLevel | None, max_tokens: int | None) -> AnthropicThinking:
    """``max_tokens`` (required by the API) and the thinking budget, if any."""
    requested = max_tokens or model.max_output_tokens or ANTHROPIC_DEFAULT_MAX_TOKENS
    if not model.supports_reasoning or level in (None, "auto", "off"):
        return AnthropicThinking(requested, None)
    ceiling = model.max_output_tokens
    if level == "max":
        top = ceiling if ceiling is not None else max(requested, _UNKNOWN_CEILING)
        budget = top - min(_ANSWER_ROOM, top // 4)
        if budget < _MIN_BUDGET:
            return AnthropicThinking(requested, None)
        return AnthropicThinking(top, budget)
    budget = ANTHROPIC_BUDGETS[level]
    total = max(requested, budget + _ANSWER_ROOM)
    if ceiling is not None and total > ceiling:
        total = max(ceiling, requested)
        budget = min(budget, total - min(_ANSWER_ROOM, total // 4))
    if budget < _MIN_BUDGET:
        return AnthropicThinking(requested, None)
    return AnthropicThinking(total, budget)


# -- Ollama -----------------------------------------------------------------------

_GPT_OSS = re.compile(r"^gpt-oss")


def ollama_think(model: ModelInfo, level: ReasoningLevel | None) -> bool | str | None:
    """The ``think`` value to send, or None to send nothing."""
    if not model.supports_reasoning or level is None or level == "auto":
        return None
    if _GPT_OSS.search(_bare(model.id)):
        if level == "off":
            return None
        return "high" if level == "max" else level
    return level != "off"
