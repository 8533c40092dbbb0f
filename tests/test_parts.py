"""The bundle's optional parts (sidecar/parts.py): a missing one is a typed error naming the
part, and the parts of a source install are all there."""

from __future__ import annotations

import pytest

from protocol import ErrorCode
from sidecar import parts


def test_a_source_install_has_every_part() -> None:
    assert all(parts.available(part) for part in parts.PARTS)
    parts.require("vectors")
    parts.require("html")


def test_a_missing_part_is_feature_unavailable_with_its_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(parts.PARTS, "absent", ("no_such_module_of_a_part", "a test feature"))
    with pytest.raises(parts.FeatureUnavailable) as err:
        parts.require("absent")
    assert err.value.code == ErrorCode.FEATURE_UNAVAILABLE == -32010
    assert err.value.data == {"part": "absent", "module": "no_such_module_of_a_part"}
    assert "a test feature needs the bundle's optional part 'absent'" in err.value.message
