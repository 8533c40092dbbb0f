"""What untrusted text must never do to a prompt: the definitions the prompt-injection tests check.

Written independently of sidecar/untrusted.py (a test that reused the escape function's
own idea of a line would prove nothing).

- A line is what ``str.splitlines`` yields: every Unicode line boundary counts (``\\n``,
  ``\\r``, VT, FF, FS/GS/RS, NEL, U+2028, U+2029), since a tokenizer or a reader may break
  at any of them.
- A line starts a role when, after blanks and Markdown decoration (``#`` headings, ``*``,
  ``_``), it begins with a role label and a colon (``system:``, ``Assistant：``...), a
  heading naming a role (``### System``, ``## Instruction``), or an instruction-format marker
  (``[INST]``, ``<<SYS>>``, ``<|...|>``, ``<start_of_turn>``). A line that starts with
  ``>`` is a Markdown quotation of someone, not a role.
- A chat-template token (``<|im_start|>``, ``<|endoftext|>``, ``<start_of_turn>``,
  ``<<SYS>>``...) is wrong anywhere. (``[INST]`` is plain text to the tokenizers: it counts
  at the start of a line.)
- A tag of ours (or one a model reads as a prompt section) opens or closes a block:
  ``<knowledge>``, ``</knowledge>``, ``<source ...>``, ``<memories>``, ``<memory ...>``,
  ``<system>``, ``</system>``, ``<conversation_summary>``, ``<soul>``, ``<document ...>``... Our prompts contain some of them; tests compare their count
  with what the prompt is built to contain.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

__all__ = ["ROLE_WORDS", "role_lines", "template_tokens", "block_tags", "texts_of_body"]

ROLE_WORDS = r"(?:system|assistant|user|developer|tool|function|human|ai|model|bot)"
_ROLE_LINE = re.compile(rf"^[ \t*_]*(?:#{{1,6}}[ \t*_]*)?{ROLE_WORDS}[ \t*_]*[:：]", re.IGNORECASE)
_HEADING_ROLE = re.compile(r"^[ \t]*#{1,6}[ \t]*(?:system|instructions?|response|user|assistant)\b", re.IGNORECASE)
_MARKER_LINE = re.compile(r"^[ \t]*(?:\[/?INST\]|<</?SYS>>|<\|[^|]{1,40}\|>|<(?:start|end)_of_turn>)", re.IGNORECASE)
_TEMPLATE = re.compile(r"<\|[A-Za-z_][^|<>\n]{0,40}\|>|<(?:start|end)_of_turn>|<</?SYS>>", re.IGNORECASE)
BLOCKS = (
    "knowledge", "source", "memories", "memory", "system", "user", "assistant", "instructions",
    "conversation_summary", "previous_summary", "new_messages", "exchange", "document", "file", "soul", "image_ocr",
)
_TAG = re.compile(r"<\s*(/?)\s*(" + "|".join(BLOCKS) + r")(?=[\s>/])", re.IGNORECASE)


def role_lines(text: str) -> list[str]:
    """The lines of ``text`` that start a role."""
    return [line for line in text.splitlines() if any(p.match(line) for p in (_ROLE_LINE, _HEADING_ROLE, _MARKER_LINE))]


def template_tokens(text: str) -> list[str]:
    return _TEMPLATE.findall(text)


def block_tags(text: str) -> Counter[str]:
    """How many times each of our tags opens (``knowledge``) or closes (``/knowledge``)."""
    return Counter(f"{m.group(1)}{m.group(2).lower()}" for m in _TAG.finditer(text))


def texts_of_body(body: dict[str, Any]) -> list[tuple[str, str]]:
    """(role, text) of every message of an OpenAI-style request body."""
    out: list[tuple[str, str]] = []
    for message in body["messages"]:
        content = message.get("content")
        if isinstance(content, str):
            out.append((message["role"], content))
        elif isinstance(content, list):
            out.append((message["role"], "\n".join(p.get("text", "") for p in content if isinstance(p, dict))))
    return out
