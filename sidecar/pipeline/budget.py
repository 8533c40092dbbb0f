"""ContextBudget: what one provider request may hold, counted part by part (seed 004 §4.3).

Owns the arithmetic of a request against the model's context window: the output reserved
for the reply, what the system prompt, the tool schemas and the messages cost, the
summarize threshold that leaves room for all of that, and the last cut that makes a built
request fit.

Rules (README "Context window"):
- the window is ``ModelConfig.contextWindow``; without one nothing is cut for it (the
  compress threshold alone plans the request) and the parts are still counted;
- reserved output: the request's ``maxTokens`` (at most the model's ``maxOutputTokens``), else
  the model's ``maxOutputTokens``, else a quarter of the window, at most DEFAULT_RESERVE
  (4,096) tokens; it is what the request asks for as its output limit (every provider gets
  it: ``max_tokens`` / ``max_completion_tokens``, Ollama's ``num_predict``), so the reply
  cannot run past it;
- counted as sent: the system message (session or assistant prompt, Soul.md, capability
  notes, rolling summary, basic memories, tool prompts, and whatever the input transformers
  put there: knowledge, memories, time...), the tool schemas (the JSON of each function
  definition as the providers receive it, plus TOOL_OVERHEAD), and every message
  (MESSAGE_OVERHEAD each; text, tool calls and results with the real tokenizer; images and
  files by the estimates of ``tokens.py``);
- the tokenizer is the model's when it is known (``exact``); otherwise cl100k is an
  estimate and ESTIMATE_MARGIN of the window is kept free as well;
- the summarize threshold is the smaller of ``compressThreshold`` and the room left for
  the history (window - reserve - margin - system prompt - tools - the reply so far);
- ``fit``: a built request that still exceeds the window loses its oldest history, whole
  messages at a time; it never starts with a reply after the system prompt, and the latest
  user message with everything after it (the turn being answered, the reply so far) is
  always kept. If that alone does not fit, the request is refused (ContextOverflow): a
  request never holds more than the window, and never falls back to the full history.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

import msgspec

from protocol.types import (
    CodePart,
    ContentPart,
    FilePart,
    ImagePart,
    TextPart,
    ThinkingPart,
    ToolResultPart,
    ToolUsePart,
)
from sidecar.errors import EngineError
from sidecar import tokens as tk
from sidecar.providers.types import GenerationParams, ModelInfo, RequestMessage, ToolSpec

__all__ = [
    "DEFAULT_RESERVE",
    "ESTIMATE_MARGIN",
    "TOOL_OVERHEAD",
    "REQUEST_OVERHEAD",
    "BudgetParts",
    "ContextOverflow",
    "CountCache",
    "reserved_output",
    "sent_params",
    "input_limit",
    "tool_tokens",
    "part_tokens",
    "message_tokens",
    "fit",
]

DEFAULT_RESERVE = 4096
ESTIMATE_MARGIN = 0.10
TOOL_OVERHEAD = 8
"""Framing of one tool definition beyond its JSON (its place in the tools list)."""
REQUEST_OVERHEAD = 8
"""Framing of the request beyond its messages (the reply's priming tokens)."""


class ContextOverflow(EngineError):
    """The request cannot fit the model's context window even with the latest message alone."""


class BudgetParts(msgspec.Struct, kw_only=True):
    """The token parts of one request (protocol ContextBudgetInfo)."""

    context_window: int | None = None
    reserved_output: int = 0
    system_prompt: int = 0
    summary: int = 0
    tools: int = 0
    messages: int = 0
    message_count: int = 0
    attachments: int = 0
    threshold: int = 0
    dropped: int = 0
    exact: bool = True
    model_id: str = ""

    @property
    def total(self) -> int:
        return self.system_prompt + self.tools + self.messages + self.reserved_output

    @property
    def available(self) -> int | None:
        return None if self.context_window is None else self.context_window - self.total


class CountCache:
    """``count_text`` remembered by (encoding, text), bounded by the characters it holds.

    A conversation's request repeats most of its text from one step to the next; counting
    it again would cost a tokenizer pass over the whole window each time. Thread-safe: a
    lookup is one dict read (atomic under the GIL); inserts and evictions (oldest first)
    take the lock.
    """

    def __init__(self, max_chars: int = 4_000_000) -> None:
        self._max = max_chars
        self._held = 0
        self._items: OrderedDict[tuple[str, str], int] = OrderedDict()
        self._lock = threading.Lock()

    def count(self, text: str, encoding: str) -> int:
        if not text:
            return 0
        key = (encoding, text)
        hit = self._items.get(key)
        if hit is not None:
            return hit
        n = tk.count_text(text, encoding)
        with self._lock:
            if key not in self._items:
                self._items[key] = n
                self._held += len(text)
                while self._held > self._max and self._items:
                    (_, old), _ = self._items.popitem(last=False)
                    self._held -= len(old)
        return n

    def uncached_chars(self, texts: Sequence[str], encoding: str) -> int:
        """How many characters of ``texts`` would have to be tokenized now."""
        items = self._items
        return sum(len(t) for t in texts if t and (encoding, t) not in items)


def reserved_output(model: ModelInfo, params: GenerationParams) -> int:
    """What the reply may take: sent as the request's output limit (``sent_params``)."""
    ceiling = model.max_output_tokens if model.max_output_tokens is not None and model.max_output_tokens > 0 else None
    if params.max_tokens is not None and params.max_tokens > 0:
        return min(params.max_tokens, ceiling) if ceiling is not None else params.max_tokens
    if ceiling is not None:
        return ceiling
    if model.context_window is not None and model.context_window > 0:
        return min(DEFAULT_RESERVE, model.context_window // 4)
    return 0


def sent_params(params: GenerationParams, reserve: int) -> GenerationParams:
    """The params a request goes out with: its output limit is the reserved output, so the
    reply cannot run past what the budget kept for it (0: nothing reserved, the provider's
    own default applies)."""
    if reserve <= 0 or params.max_tokens == reserve:
        return params
    return msgspec.structs.replace(params, max_tokens=reserve)


def input_limit(window: int | None, reserve: int, exact: bool) -> int | None:
    """Tokens the request's input may take (None: no window known)."""
    if window is None or window <= 0:
        return None
    margin = 0 if exact else int(window * ESTIMATE_MARGIN)
    return window - reserve - margin - REQUEST_OVERHEAD


def _encode(value: object) -> str:
    return msgspec.json.encode(value).decode()


def tool_tokens(specs: Sequence[ToolSpec], encoding: str, counts: CountCache) -> int:
    total = 0
    for spec in specs:
        definition = {
            "type": "function",
            "function": {"name": spec.name, "description": spec.description, "parameters": spec.parameters},
        }
        total += counts.count(_encode(definition), encoding) + TOOL_OVERHEAD
    return total


def part_tokens(part: ContentPart, encoding: str, counts: CountCache) -> tuple[int, int]:
    """(tokens, of which attachment estimates) of one part as it is sent."""
    if isinstance(part, (TextPart, ThinkingPart)):
        return counts.count(part.text, encoding), 0
    if isinstance(part, ImagePart):
        return tk.IMAGE_TOKENS, tk.IMAGE_TOKENS
    if isinstance(part, FilePart):  # left as a file: the adapter names it (a short note)
        return tk.UNKNOWN_FILE_TOKENS, tk.UNKNOWN_FILE_TOKENS
    if isinstance(part, ToolUsePart):
        return counts.count(part.name, encoding) + counts.count(_encode(part.input), encoding) + 8, 0
    if isinstance(part, ToolResultPart):
        return counts.count(part.content, encoding) + 8, 0
    if isinstance(part, CodePart):
        return counts.count(part.code, encoding) + 4, 0
    return 0, 0  # display-only parts (diffs, steps) are not sent


def part_texts(parts: Sequence[ContentPart]) -> list[str]:
    """The texts ``part_tokens`` would tokenize (to decide whether counting is long work)."""
    out: list[str] = []
    for part in parts:
        if isinstance(part, (TextPart, ThinkingPart)):
            out.append(part.text)
        elif isinstance(part, ToolResultPart):
            out.append(part.content)
        elif isinstance(part, CodePart):
            out.append(part.code)
    return out


def message_tokens(message: RequestMessage, encoding: str, counts: CountCache) -> tuple[int, int]:
    """(tokens, of which attachment estimates) of one request message."""
    total, attached = tk.MESSAGE_OVERHEAD, 0
    for part in message.parts:
        n, a = part_tokens(part, encoding, counts)
        total += n
        attached += a
    return total, attached


def fit(
    costs: Sequence[int], roles: Sequence[str], *, droppable: Sequence[bool], pinned_from: int, limit: int
) -> list[int]:
    """Indices of the messages to drop so ``sum(costs)`` fits ``limit``: the oldest droppable
    ones before ``pinned_from`` first (the latest user message and what follows it are never
    dropped), and with each a reply that would then lead the history. The caller checks
    whether what is kept fits (ContextOverflow when it does not)."""
    total = sum(costs)
    dropped: list[int] = []
    candidates = [i for i in range(min(pinned_from, len(costs))) if droppable[i]]
    k = 0
    while total > limit and k < len(candidates):
        i = candidates[k]
        dropped.append(i)
        total -= costs[i]
        k += 1
        # what is left of the history must start with the user's message, not a reply
        while k < len(candidates) and roles[candidates[k]] != "user":
            dropped.append(candidates[k])
            total -= costs[candidates[k]]
            k += 1
    return dropped
