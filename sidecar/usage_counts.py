"""Token counts as peers report them: the one rule for a count in a Usage.

Providers, agent engines, the Qiming server and embedding endpoints report how many tokens a
call used. Their numbers are untrusted like the rest of what they send: a JSON integer may be
negative or have thirty digits. The rule:
- a reported count is an int from 0 to ``MAX_REPORTED`` (2**40, about 10**12 tokens: thousands
  of times any context window, and low enough that any real price makes a cost the store
  accepts). Anything else is not a count: it reads as not reported (None; 0 for the input and
  output counts, which a Usage always has);
- counts are added with ``plus``, which saturates: a reply's steps at ``MAX_REPORTED`` (so
  the reply's usage is itself a count), a session's totals at ``MAX_TOTAL`` (2**62, the
  store's bound), so no sum leaves the wire's Int64 nor SQLite's INTEGER.

Must stay true: every Usage that reaches the wire, a message row or a session's totals has
passed ``reported`` (the reply lifecycle's ``report_usage``, ``SideUsage.record``), and
every sum of counts is ``plus`` (a reply's steps, a session's totals).
"""

from __future__ import annotations

from protocol.types import Usage

__all__ = ["MAX_REPORTED", "MAX_TOTAL", "count", "plus", "reported", "added"]

MAX_REPORTED = 2**40
MAX_TOTAL = 2**62


def count(value: object) -> int | None:
    """``value`` if it is a count a peer could have meant, else None."""
    return value if type(value) is int and 0 <= value <= MAX_REPORTED else None


def plus(a: int | None, b: int | None, *, cap: int = MAX_REPORTED) -> int | None:
    """The sum of two counts, at most ``cap``; None when neither was reported."""
    if a is None and b is None:
        return None
    return min(cap, (a or 0) + (b or 0))


def reported(usage: Usage) -> Usage:
    """``usage`` with every count that is not one read as not reported."""
    return Usage(
        input_tokens=count(usage.input_tokens) or 0,
        output_tokens=count(usage.output_tokens) or 0,
        cache_read_tokens=count(usage.cache_read_tokens),
        cache_write_tokens=count(usage.cache_write_tokens),
        reasoning_tokens=count(usage.reasoning_tokens),
        context_used=count(usage.context_used),
        context_size=count(usage.context_size),
    )


def added(base: Usage | None, step: Usage) -> Usage:
    """A reply's usage after one more step (``base`` None: the first), both ``reported``."""
    step = reported(step)
    if base is None:
        return step
    return Usage(
        input_tokens=plus(base.input_tokens, step.input_tokens) or 0,
        output_tokens=plus(base.output_tokens, step.output_tokens) or 0,
        cache_read_tokens=plus(base.cache_read_tokens, step.cache_read_tokens),
        cache_write_tokens=plus(base.cache_write_tokens, step.cache_write_tokens),
        reasoning_tokens=plus(base.reasoning_tokens, step.reasoning_tokens),
    )
