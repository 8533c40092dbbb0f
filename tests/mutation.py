"""What the property tests share to play an untrusted peer: its real answers, mutated.

    mutated_document(doc)   a JSON document with a few values replaced by any JSON value
                            (``json_values``: huge and negative numbers, wrong types, long
                            text) or keys dropped
    edited(items)           a sequence (events, updates) with a few dropped, repeated, swapped
    sendable(value)         what a strict JSON encoder can send (no Infinity, no lone surrogate)
    fixed_draws(n)          the settings of an end-to-end property: n examples drawn the same
                            every run (a failure replays), no shrinking (each example runs a
                            sidecar and its peers: shrinking would take minutes)
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st

__all__ = ["json_values", "mutated_document", "edited", "sendable", "fixed_draws"]


def fixed_draws(examples: int) -> settings:
    return settings(max_examples=examples, deadline=None, derandomize=True, database=None, phases=[Phase.generate],
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


scalars = st.one_of(
    st.none(), st.booleans(), st.sampled_from([0, -1, 1, 2**31, 2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**30]),
    st.integers(), st.floats(allow_nan=False), st.text(max_size=40), st.sampled_from(["", "null", "[DONE]", "x" * 5000]),
)
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                           max_leaves=6)


def _paths(value: Any, here: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [here]
    if isinstance(value, dict):
        for key, item in value.items():
            found += _paths(item, (*here, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += _paths(item, (*here, index))
    return found


def _set(value: Any, path: tuple[Any, ...], new: Any, *, drop: bool) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        copy = dict(value)
        if drop and not rest:
            copy.pop(head, None)
        else:
            copy[head] = _set(copy[head], rest, new, drop=drop)
        return copy
    copy_list = list(value)
    if drop and not rest:
        del copy_list[head]
    else:
        copy_list[head] = _set(copy_list[head], rest, new, drop=drop)
    return copy_list


@st.composite
def mutated_document(draw: st.DrawFn, document: Any) -> Any:
    """``document`` with a few of its values replaced or dropped."""
    for _ in range(draw(st.integers(0, 3))):
        path = draw(st.sampled_from(_paths(document)))
        drop = bool(path) and draw(st.booleans())
        document = _set(document, path, None if drop else draw(json_values), drop=drop)
    return document


def sendable(value: Any) -> Any:
    """``value`` as a peer's JSON encoder could send it: no Infinity, no lone surrogate (strict
    encoders refuse both; the fakes and fixtures use such encoders)."""
    if isinstance(value, float) and value in (float("inf"), float("-inf")):
        return None
    if isinstance(value, str):
        return value.encode("utf-8", "replace").decode("utf-8")
    if isinstance(value, list):
        return [sendable(v) for v in value]
    if isinstance(value, dict):
        return {sendable(k): sendable(v) for k, v in value.items()}
    return value


@st.composite
def edited(draw: st.DrawFn, items: list[Any]) -> list[Any]:
    """``items`` (events of a stream, updates of a turn) with a few dropped, repeated or swapped."""
    out = list(items)
    for _ in range(draw(st.integers(0, 2))):
        if out and draw(st.booleans()):
            i = draw(st.integers(0, len(out) - 1))
            edit = draw(st.sampled_from(["drop", "repeat", "swap"]))
            if edit == "drop":
                del out[i]
            elif edit == "repeat":
                out.insert(i, out[i])
            elif i + 1 < len(out):
                out[i], out[i + 1] = out[i + 1], out[i]
    return out
