"""Untrusted text in a prompt: the one rule for writing it so it stays data.

Every text the process did not write and the user did not type into this turn's message,
that goes into a request as text (knowledge chunks, memories, an IM sender's name and the
message it quotes, a conversation title that came from a server or a chat, the messages of
the transcript a summary or a side call reads, what a model wrote from such text: the
rolling summary and Soul.md, an attached file's text and the text read from an image,
the names in a working directory), is written with ``escape``, inside an element that
starts its line:

- ``&``, ``<``, ``>`` and ``"`` become ``&amp;``, ``&lt;``, ``&gt;`` and ``&quot;``, so the text
  can neither close nor open an element of ours (``</knowledge>``, ``<memory ...>``) nor
  write a chat-template token (``<|im_start|>``), and it fits in a quoted attribute;
- every line break (``\\r\\n``, ``\\r``, ``\\n``, and the other Unicode line boundaries:
  VT, FF, the file/group/record separators, NEL, U+2028, U+2029) becomes a visible ``\\n``
  (a backslash and an ``n``), so the whole text is on the line it starts on and no line of
  it can pose as a role (``system:``, ``### System``, ``[INST]``) or a heading;
- other control characters (C0 but the tab, DEL, C1) are dropped.

The text is still readable: code blocks and tables come through with their line breaks
shown as ``\\n``. A literal backslash-n already in the text reads the same (not escaped:
doubling every backslash would make code and paths harder to read, and both mean a line
break to the reader anyway).

Not written with it: tool results (the tool role keeps them apart, and the model edits
the exact bytes it read) and a message's own text in its role (SECURITY.md says why).

Where it is written, the prompt says what it is (a header for the block, or the system
prompt's note for IM turns) and that it is data, not instructions: ``ESCAPING`` is the
sentence every such header uses to explain the escaping.

Must stay true: ``escape(x)`` contains no ``<``, ``>``, ``"`` and no character for which
``str.splitlines`` breaks a line; it is a pure function of its argument. A leaf module:
it imports nothing from the process, so every layer may use it.
"""

from __future__ import annotations

import re

__all__ = ["escape", "ESCAPING"]

ESCAPING = (
    'Inside them &lt; &gt; &amp; &quot; stand for < > & " and \\n stands for a line break '
    "(code and tables keep their lines that way)."
)

# chained str.replace: each a C-speed scan (a translate table or a regex substitution of
# the line breaks is 5-20 times slower on a knowledge block of 12,000 characters)
_ENTITIES = (("&", "&amp;"), ("<", "&lt;"), (">", "&gt;"), ('"', "&quot;"))
_LINE_BREAKS = ("\r\n", "\r", "\n", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029")
_CONTROL = re.compile("[\x00-\x08\x0e-\x1b\x1f\x7f-\x84\x86-\x9f]")


def escape(text: str) -> str:
    """``text`` as data: entity-escaped, on one line (line breaks shown as ``\\n``), no
    control characters but the tab."""
    for raw, entity in _ENTITIES:
        text = text.replace(raw, entity)
    for line_break in _LINE_BREAKS:
        text = text.replace(line_break, "\\n")
    if not text.isprintable():  # a C-speed test that nearly every text passes
        text = _CONTROL.sub("", text)
    return text
