"""The context-window planner: pure functions over a branch's token counts and roles.

Rules (seed 000 section 2):
- a threshold of 0 or less (the legacy "disabled" value) means the default, 32,000
  estimated tokens;
- a branch of fewer than four messages gets no plan;
- the estimate is the valid summary's tokens plus the tokens of the messages after it;
  at or under the threshold nothing changes;
- above it, the recent window takes the newest messages while they fit in 55% of the
  threshold, and at least four of them whatever their size;
- the window start then moves back (towards the root) to a user message, so a tool result
  is never separated from the turn that called it;
- the messages before the window that the current summary does not cover yet are the
  newly covered ones; the refreshed summary merges the previous summary with them and
  covers the whole prefix before the window. If the window already starts right after the
  summary there is nothing to summarize (no refresh).
Manual compaction runs the same rules with ``target`` in place of the threshold and
``force`` (plan even when the estimate is under it).

TruncationStrategy (seed 004 section 4.3):
- ``summarize-old``: the rules above (a model writes the summary);
- ``sliding-window``: no summary; the window may use the whole threshold (not 55%), with
  the same at-least-four and back-to-a-user-message rules;
- ``smart-select``: no summary; keeps (1) the recent window (55%, same rules), (2) the first
  turn of the branch (the first user message and the replies up to the next user message:
  usually the task statement), if it fits, and (3) older whole turns ranked by how many
  distinct words (letters/digits, 3+ characters; CJK characters one by one) they share with
  the latest user message, best first, while they fit in what is left of the threshold; all
  kept in their original order.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import msgspec

__all__ = [
    "DEFAULT_THRESHOLD",
    "RECENT_SHARE",
    "MIN_RECENT",
    "MIN_PLAN_MESSAGES",
    "RollingPlan",
    "effective_threshold",
    "window_start",
    "plan_summarize",
    "plan_sliding",
    "plan_smart",
]

DEFAULT_THRESHOLD = 32_000
RECENT_SHARE = 0.55
MIN_RECENT = 4
MIN_PLAN_MESSAGES = 4


class RollingPlan(msgspec.Struct, kw_only=True):
    """What to send of ``tail`` (the messages after the valid summary, root side first)."""

    estimated: int
    """Summary + tail tokens before any cut."""
    window_start: int = 0
    """Index in the tail where the verbatim window starts."""
    refresh: bool = False
    """The summary must be refreshed to cover tail[:window_start] (summarize-old)."""
    kept_older: list[int] = []
    """smart-select: indices before window_start that are kept too (ascending)."""

    @property
    def cuts(self) -> bool:
        return self.window_start > 0


def effective_threshold(value: int | None) -> int:
    return value if value is not None and value > 0 else DEFAULT_THRESHOLD


def window_start(tokens: Sequence[int], roles: Sequence[str], budget: float) -> int:
    """Start of the newest run of messages that fits ``budget`` (at least MIN_RECENT),
    moved back to a user message."""
    n = len(tokens)
    start = n
    used = 0
    while start > 0:
        cost = tokens[start - 1]
        if n - start >= MIN_RECENT and used + cost > budget:
            break
        used += cost
        start -= 1
    while start > 0 and roles[start] != "user":
        start -= 1
    return start


def plan_summarize(
    tokens: Sequence[int],
    roles: Sequence[str],
    *,
    summary_tokens: int = 0,
    covered_count: int = 0,
    threshold: int | None = None,
    target: int | None = None,
    force: bool = False,
) -> RollingPlan:
    estimated = summary_tokens + sum(tokens)
    limit = effective_threshold(target if target is not None else threshold)
    if covered_count + len(tokens) < MIN_PLAN_MESSAGES:
        return RollingPlan(estimated=estimated)
    if estimated <= limit and not force:
        return RollingPlan(estimated=estimated)
    start = window_start(tokens, roles, limit * RECENT_SHARE)
    return RollingPlan(estimated=estimated, window_start=start, refresh=start > 0)


def plan_sliding(
    tokens: Sequence[int], roles: Sequence[str], *, threshold: int | None = None
) -> RollingPlan:
    estimated = sum(tokens)
    limit = effective_threshold(threshold)
    if len(tokens) < MIN_PLAN_MESSAGES or estimated <= limit:
        return RollingPlan(estimated=estimated)
    return RollingPlan(estimated=estimated, window_start=window_start(tokens, roles, limit))


_WORD = re.compile(r"[^\W\d_]{3,}|\d{3,}|[\u3040-\u30ff\u3400-\u9fff\uf900-\ufaff]", re.UNICODE)


def _words(text: str) -> set[str]:
    return {w.lower() for w in _WORD.findall(text)}


def plan_smart(
    tokens: Sequence[int], roles: Sequence[str], texts: Sequence[str], *, threshold: int | None = None
) -> RollingPlan:
    estimated = sum(tokens)
    limit = effective_threshold(threshold)
    n = len(tokens)
    if n < MIN_PLAN_MESSAGES or estimated <= limit:
        return RollingPlan(estimated=estimated)
    start = window_start(tokens, roles, limit * RECENT_SHARE)
    if start == 0:
        return RollingPlan(estimated=estimated)
    budget = limit - sum(tokens[start:])
    # whole turns before the window: [user, replies...]
    turns: list[list[int]] = []
    for i in range(start):
        if roles[i] == "user" or not turns:
            turns.append([i])
        else:
            turns[-1].append(i)
    kept: list[int] = []
    first = turns[0]
    first_cost = sum(tokens[i] for i in first)
    if first_cost <= budget:
        kept.extend(first)
        budget -= first_cost
    query_index = next((i for i in range(n - 1, -1, -1) if roles[i] == "user"), n - 1)
    query = _words(texts[query_index])
    scored: list[tuple[int, int, list[int]]] = []
    for number, turn in enumerate(turns[1:], start=1):
        overlap = len(query & _words(" ".join(texts[i] for i in turn))) if query else 0
        if overlap:
            scored.append((overlap, number, turn))
    scored.sort(key=lambda item: (-item[0], -item[1]))  # more shared words, then newer
    for _, _, turn in scored:
        cost = sum(tokens[i] for i in turn)
        if cost <= budget:
            kept.extend(turn)
            budget -= cost
    return RollingPlan(estimated=estimated, window_start=start, kept_older=sorted(kept))
