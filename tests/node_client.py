"""Run the TypeScript side from pytest: the pinned tsc and Node's test runner on the
generated client (tools/electron/).

``python3 dev.py test`` and ``.ci/run`` install the compiler (``npm ci --prefix
tools/electron``). Without ``node`` on PATH these tests skip with a message saying so, except
under CI (``CI`` set), where a missing Node is a failure: CI must run them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import anyio
import pytest

from scripted_server import scripted_provider

ROOT = Path(__file__).resolve().parent.parent
NODE_TOOLS = ROOT / "tools" / "electron"
TSC = NODE_TOOLS / "node_modules" / "typescript" / "bin" / "tsc"
NODE_TEST = NODE_TOOLS / "test" / "client.test.mjs"
NODE_TIMEOUT_S = 600


def node() -> str:
    found = shutil.which("node")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("node is not on PATH: CI must run the TypeScript client tests")
        pytest.skip("node is not on PATH: the TypeScript client tests need Node.js 18+ (and npm)")
    return found


def tsc() -> list[str]:
    runner = node()
    if not TSC.exists():
        pytest.fail(
            f"{TSC.relative_to(ROOT)} is missing: run `python3 dev.py test` (it runs"
            " `npm ci --prefix tools/electron`) or that npm command yourself"
        )
    return [runner, str(TSC)]


def run(cmd: Sequence[str], *, timeout: float = 300, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(cmd), capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env, check=False
    )


async def run_node_client_tests(tmp_path: Path, command: str, args: Sequence[str]) -> str:
    """Node's test runner on tools/electron/test/client.test.mjs with the scripted provider
    running; returns its output (asserting it passed)."""
    runner = node()
    async with scripted_provider() as server:
        env = {
            **os.environ,
            "SIDECAR_COMMAND": command,
            "SIDECAR_ARGS": json.dumps(list(args)),
            "PROVIDER_URL": server.root,
            "TEST_TMP": str(tmp_path),
        }
        env.pop("NODE_OPTIONS", None)
        with anyio.fail_after(NODE_TIMEOUT_S):
            done = await anyio.run_process(
                [runner, "--test", "--test-reporter=spec", str(NODE_TEST)], env=env, cwd=ROOT, check=False
            )
    output = done.stdout.decode("utf-8", "replace") + done.stderr.decode("utf-8", "replace")
    assert done.returncode == 0, f"node --test failed ({done.returncode}):\n{output[-20000:]}"
    return output


def python_sidecar() -> tuple[str, list[str]]:
    return sys.executable, ["-m", "sidecar"]


def assert_all_ran(output: str) -> None:
    """Node's spec reporter ran every ``it(...)`` of the test file and none failed."""
    declared = len(re.findall(r"^\s+it\(", NODE_TEST.read_text(encoding="utf-8"), flags=re.MULTILINE))
    passed = re.search(r"^ℹ pass (\d+)$", output, flags=re.MULTILINE)
    failed = re.search(r"^ℹ fail (\d+)$", output, flags=re.MULTILINE)
    assert passed and failed, output[-4000:]
    assert (int(passed.group(1)), int(failed.group(1))) == (declared, 0), output[-4000:]
