"""``tool_approval_rules``: the V1 request's own allow / ask / deny rules for permission requests.

Matching follows the rcoder spec shared by the V1 clients ("tool_approval_rules 工具审批
规则匹配规范"):
- rules are tried in order; the first whose pattern matches decides; none: no decision;
- a rule with ``tool_kind`` only applies to calls of that kind (case-insensitive) and
  matches one target: for command-like kinds (execute, bash, terminal, shell, command)
  the first of ``rawInput.command|cmd|script`` (or a string rawInput), otherwise the first
  of ``rawInput.tool|tool_name|toolName`` or the title's first word, else ``"tool"``;
- a rule without ``tool_kind`` matches any of those targets plus the whole title;
- patterns are globs, anchored, case-insensitive: ``*`` (any run, ``/`` included), ``?``,
  ``[abc]``, ``[a-z]``, ``[!abc]``; no braces, ``**`` is ``*``; an empty pattern never matches.

Where the decision sits: a call reaches these rules only when the stored tool policy asks
(a user's "always allow / deny" and ``tool:policy:set`` win, as the saved rules do in V1);
no decision leaves the call to the user unless ``trust_agent_mode`` and ``yolo`` say
otherwise (sidecar.compat.turns).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence
from typing import Any, Literal

import msgspec

from sidecar.compat.wire import ToolApprovalRuleIn, invalid

Action = Literal["allow", "ask", "deny"]
ACTIONS: tuple[Action, ...] = ("allow", "ask", "deny")
COMMAND_KINDS = frozenset({"execute", "bash", "terminal", "shell", "command"})
MAX_RULES = 256
MAX_PATTERNS = 256
MAX_PATTERN_CHARS = 1024


class Rule(msgspec.Struct, frozen=True):
    action: Action
    patterns: tuple[re.Pattern[str], ...]
    tool_kind: str | None


def compile_rules(rules: Sequence[ToolApprovalRuleIn] | None) -> tuple[Rule, ...]:
    """Checked and compiled rules; a bad one is a validation error naming it."""
    if not rules:
        return ()
    if len(rules) > MAX_RULES:
        raise invalid(f"agent_config.agent_server.tool_approval_rules has more than {MAX_RULES} rules")
    out: list[Rule] = []
    for i, rule in enumerate(rules):
        where = f"agent_config.agent_server.tool_approval_rules[{i}]"
        action = rule.action.strip().lower()
        if action not in ACTIONS:
            raise invalid(f"{where}.action must be one of ask, allow, deny")
        if len(rule.patterns) > MAX_PATTERNS or any(len(p) > MAX_PATTERN_CHARS for p in rule.patterns):
            raise invalid(f"{where}.patterns: at most {MAX_PATTERNS} patterns of {MAX_PATTERN_CHARS} characters")
        compiled = tuple(_glob(p.strip()) for p in rule.patterns if p.strip())
        kind = rule.tool_kind.strip().lower() if rule.tool_kind and rule.tool_kind.strip() else None
        out.append(Rule(action=action, patterns=compiled, tool_kind=kind))
    return tuple(out)


def decide(rules: Sequence[Rule], *, title: str, raw_input: Any, kind: str | None) -> Rule | None:
    """The first rule matching the call, or None."""
    actual = (kind or "other").lower()
    for rule in rules:
        if rule.tool_kind is not None and rule.tool_kind != actual:
            continue
        targets = _all_targets(title, raw_input) if rule.tool_kind is None else [_kind_target(title, raw_input, rule.tool_kind)]
        targets = [t for t in dict.fromkeys(targets) if t]
        if any(p.fullmatch(t) for p in rule.patterns for t in targets):
            return rule
    return None


def _glob(pattern: str) -> re.Pattern[str]:
    # fnmatch's dialect is the spec's (* spans "/", [!x] negates, no braces)
    return re.compile(fnmatch.translate(re.sub(r"\*{2,}", "*", pattern)), re.IGNORECASE)


def _field(raw_input: Any, *names: str) -> list[str]:
    if not isinstance(raw_input, dict):
        return []
    return [v for n in names if isinstance(v := raw_input.get(n), str) and v]


def _commands(raw_input: Any) -> list[str]:
    found = _field(raw_input, "command", "cmd", "script")
    if isinstance(raw_input, str) and raw_input:
        found.append(raw_input)
    return found


def _names(title: str, raw_input: Any) -> list[str]:
    found = _field(raw_input, "tool", "tool_name", "toolName")
    first = title.split(maxsplit=1)
    if first:
        found.append(first[0])
    return found


def _all_targets(title: str, raw_input: Any) -> list[str]:
    return [*_commands(raw_input), *_names(title, raw_input), title]


def _kind_target(title: str, raw_input: Any, kind: str) -> str:
    found = _commands(raw_input) if kind in COMMAND_KINDS else _names(title, raw_input)
    return found[0] if found else ("" if kind in COMMAND_KINDS else "tool")
