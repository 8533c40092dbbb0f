"""The command line: the quick parse of ordinary arguments agrees with argparse, and
hands everything else (help, version, mistakes) to it."""

from __future__ import annotations

import pytest

from sidecar.__main__ import OPTIONS, _parser, _quick_parse

ORDINARY = [
    [],
    ["serve"],
    ["--data-dir", "/tmp/x"],
    ["--data-dir=/tmp/x", "serve"],
    ["serve", "--data-dir", "/tmp/a b", "--log-level", "DEBUG"],
    ["--max-line-bytes", "4096", "--secret-key-fd", "7"],
    ["--max-line-bytes=4096", "--no-keychain", "--bench"],
    ["--data-dir", ""],
    ["--data-dir", "/a", "--data-dir", "/b"],  # the last one wins
    ["--log-level=", "--data-dir=/x=y"],
]

HANDED_ON = [
    ["--help"],
    ["-h"],
    ["--version"],
    ["--data"],  # a prefix: argparse's rules
    ["--data-dir"],  # no value
    ["--data-dir", "--bench"],
    ["--max-line-bytes", "lots"],
    ["--max-line-bytes", "-5"],
    ["--bench=yes"],
    ["serve", "serve"],
    ["run"],
    ["--unknown"],
]


@pytest.mark.parametrize("argv", ORDINARY)
def test_ordinary_arguments_parse_as_argparse_parses_them(argv: list[str]) -> None:
    quick = _quick_parse(argv)
    parsed = _parser().parse_args(argv)
    assert quick == {option.dest: getattr(parsed, option.dest) for option in OPTIONS}


@pytest.mark.parametrize("argv", HANDED_ON)
def test_anything_else_is_left_to_argparse(argv: list[str]) -> None:
    assert _quick_parse(argv) is None
