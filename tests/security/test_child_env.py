"""Child environments, over the subprocess: a workspace command, an MCP stdio server and an
ACP agent all get the same allow-listed environment; the sidecar's own secrets (the
README's ``CHAT_KEY_OPENAI``, anything ``*_KEY`` / ``*_TOKEN``, ``CHAT_SIDECAR_*``) reach
none of them, and a secret reaches a child only when the user configured it for that
child."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import anyio
import pytest
from acp_helpers import acp_session
from chat_helpers import configure_provider, events_of, wait_final
from scripted_server import scripted_provider
from sidecar_proc import sidecar_command, spawn_sidecar

pytestmark = pytest.mark.anyio

OPENAI_KEY = "sk-README-SETUP-KEY-41d9e0"
NOBODY = 65534
# what the sidecar's own environment holds besides: none of it may reach a child
SIDECAR_SECRETS = {
    "CHAT_KEY_OPENAI": OPENAI_KEY,
    "SOME_SERVICE_API_KEY": "svc-key-7b1c22",
    "GITHUB_TOKEN": "ghp-token-90aa31",
    "AWS_SECRET_ACCESS_KEY": "aws-secret-5e6f70",
    "CHAT_SIDECAR_TEST_MARKER": "marker-c0ffee",
}
# what a child may see of ours (names the shell or Python set for themselves come on top)
SHELL_OWN = {"PWD", "OLDPWD", "SHLVL", "_", "LC_CTYPE"}
DUMP = "import json, os, sys; open(sys.argv[1], 'w').write(json.dumps(dict(os.environ)))"


def assert_clean(env: dict[str, str], configured: dict[str, str]) -> None:
    leaked = {k for k, v in SIDECAR_SECRETS.items() if k in env or any(v in value for value in env.values())}
    assert not leaked, f"the sidecar's secrets reached the child: {sorted(leaked)}"
    for name, value in configured.items():
        assert env.get(name) == value, f"the configured {name} did not reach the child"
    assert env.get("PATH") and env.get("HOME")
    others = set(env) - set(configured) - SHELL_OWN
    looks_secret = [n for n in others if any(h in n.lower() for h in ("key", "token", "secret", "password", "auth"))]
    assert not looks_secret, looks_secret
    assert not [n for n in others if n.startswith("CHAT_")]


def parse_env(output: str) -> dict[str, str]:
    env: dict[str, str] = {}
    for line in output.splitlines():
        name, sep, value = line.partition("=")
        if sep and name.replace("_", "").isalnum():
            env[name] = value
    return env


async def wait_file(path: Path, timeout: float = 30) -> str:
    with anyio.fail_after(timeout):
        while True:
            try:
                text = path.read_text()
            except FileNotFoundError:
                text = ""
            if text.endswith("}"):
                return text
            await anyio.sleep(0.02)


def spawn(tmp_path: Path) -> Any:
    return spawn_sidecar(tmp_path / "data", env=SIDECAR_SECRETS)


async def test_an_approved_env_command_prints_no_key_of_the_sidecar(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    async with scripted_provider() as server, spawn(tmp_path) as proc:
        # the README's setup: the key comes from the sidecar's environment
        await configure_provider(proc, server.base_url, apiKey=None, apiKeyEnv="CHAT_KEY_OPENAI")
        session = await proc.call("chat:session:create", {"workspaceDir": str(workspace)})
        await server.script(
            {"tool_calls": [{"id": "c_env", "name": "workspace_run_command", "arguments": {"command": "env"}}]},
            {"text": "done"},
        )
        sent = await proc.call("chat:send", {"sessionId": session["id"], "input": {"content": "run env"}})
        await proc.wait_for(
            lambda m: isinstance(m, dict) and m.get("method") == "chat:stream"
            and m["params"]["type"] == "tool_approval_required", timeout=20,
        )
        approved = await proc.call(
            "chat:tool:approve", {"sessionId": session["id"], "toolCallId": "c_env", "decision": "approved"}
        )
        assert approved["success"] is True
        final = await wait_final(proc, approved.get("messageId") or sent["messageId"])
        assert final["type"] == "stream_end", final
        (result,) = [e["toolResult"] for e in events_of(proc, final["messageId"]) if e["type"] == "tool_result"]
        assert result["output"].startswith("exit code 0"), result
        assert_clean(parse_env(result["output"]), {})
        # and what went to the provider (the tool result in the next request) holds no key
        bodies = json.dumps(await server.requests())
        assert OPENAI_KEY not in bodies and "CHAT_KEY_OPENAI" not in bodies
        await proc.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/<pid>/environ is Linux's")
async def test_a_command_cannot_read_the_sidecars_environment_in_proc(tmp_path: Path) -> None:
    """Around the allow-list: the sidecar's own /proc/<pid>/environ holds the host's keys; the
    sidecar is not dumpable, so a child of the same user cannot open it. Root may read any
    process's, so as root the sidecar (and its command) run as ``nobody``, a user like any."""
    command = None
    root = tmp_path
    if os.getuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("as root this needs setpriv to run the sidecar as another user")
        root = Path(tempfile.mkdtemp(prefix="chat-sidecar-nobody-"))  # tmp_path's parents are root's alone
        os.chown(root, NOBODY, NOBODY)
        command = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *sidecar_command(root / "data")]
    workspace = root / "ws"
    workspace.mkdir()
    os.chown(workspace, os.getuid() or NOBODY, os.getgid() or NOBODY)
    try:
        async with scripted_provider() as server, spawn_sidecar(
            root / "data", env={**SIDECAR_SECRETS, "HOME": str(root)}, command=command, subprocess=True
        ) as proc:
            await configure_provider(proc, server.base_url, apiKey=None, apiKeyEnv="CHAT_KEY_OPENAI")
            await proc.call("tool:policy:set", {"key": "workspace_run_command", "policy": "auto"})
            session = await proc.call("chat:session:create", {"workspaceDir": str(workspace)})
            await server.script(
                {"tool_calls": [{"id": "c_proc", "name": "workspace_run_command",
                                 "arguments": {"command": "id -u; cat /proc/$PPID/environ"}}]},
                {"text": "done"},
            )
            sent = await proc.call("chat:send", {"sessionId": session["id"], "input": {"content": "read it"}})
            final = await wait_final(proc, sent["messageId"])
            (result,) = [e["toolResult"] for e in events_of(proc, final["messageId"]) if e["type"] == "tool_result"]
            output = result["output"]
            assert OPENAI_KEY not in output and "CHAT_KEY_OPENAI" not in output, result
            assert "Permission denied" in output and not output.startswith("exit code 0"), result
            assert f"\n{os.getuid() or NOBODY}\n" in output  # the command ran as the sidecar's user
            await proc.close()
    finally:
        if root is not tmp_path:
            shutil.rmtree(root, ignore_errors=True)


async def test_an_mcp_stdio_server_gets_the_allow_list_and_its_configured_env(tmp_path: Path) -> None:
    dump = tmp_path / "mcp-env.json"
    async with spawn(tmp_path) as proc:
        await proc.call("sidecar:initialize", {})
        configured = {"FX_API_TOKEN": "configured-for-mcp-13"}
        await proc.call("mcp:server:upsert", {
            "name": "envdump", "command": sys.executable, "args": ["-c", DUMP, str(dump)],
            "env": configured, "connectTimeoutS": 5,
        })
        env = json.loads(await wait_file(dump))
        assert_clean(env, configured)
        await proc.close()


async def test_an_acp_agent_gets_the_allow_list_and_its_configured_env(tmp_path: Path) -> None:
    dump = tmp_path / "acp-env.json"
    async with spawn(tmp_path) as proc:
        await proc.call("sidecar:initialize", {})
        configured = {"AGENT_SECRET": "configured-for-acp-29"}
        engine = await proc.call("provider:upsert", {
            "name": "Dump", "type": "acp-engine",
            "engine": {"command": sys.executable, "args": ["-c", DUMP, str(dump)], "env": configured,
                       "startupTimeoutMs": 5000},
        })
        session = await acp_session(proc, engine["id"])
        sent = await proc.call("chat:send", {"sessionId": session["id"], "input": {"content": "hi"}})
        env = json.loads(await wait_file(dump))
        assert_clean(env, configured)
        # the dump exits at once: the turn ends with an error, and the process keeps serving
        assert (await wait_final(proc, sent["messageId"]))["type"] == "error"
        await proc.close()


async def test_every_kind_of_child_inherits_the_same_names(tmp_path: Path) -> None:
    """One rule: what a workspace command, an MCP server and an ACP agent inherit of ours is
    the same set of names."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    dumps = {kind: tmp_path / f"{kind}.json" for kind in ("command", "mcp", "acp")}
    async with scripted_provider() as server, spawn(tmp_path) as proc:
        await configure_provider(proc, server.base_url)
        await proc.call("tool:policy:set", {"key": "workspace_run_command", "policy": "auto"})
        session = await proc.call("chat:session:create", {"workspaceDir": str(workspace)})
        command = f"{sys.executable} -c \"{DUMP}\" {dumps['command']}"
        await server.script(
            {"tool_calls": [{"id": "c_dump", "name": "workspace_run_command", "arguments": {"command": command}}]},
            {"text": "done"},
        )
        sent = await proc.call("chat:send", {"sessionId": session["id"], "input": {"content": "dump"}})
        assert (await wait_final(proc, sent["messageId"]))["type"] == "stream_end"
        await proc.call("mcp:server:upsert", {
            "name": "envdump", "command": sys.executable, "args": ["-c", DUMP, str(dumps["mcp"])], "connectTimeoutS": 5,
        })
        engine = await proc.call("provider:upsert", {
            "name": "Dump", "type": "acp-engine",
            "engine": {"command": sys.executable, "args": ["-c", DUMP, str(dumps["acp"])], "startupTimeoutMs": 5000},
        })
        acp = await acp_session(proc, engine["id"])
        sent = await proc.call("chat:send", {"sessionId": acp["id"], "input": {"content": "hi"}})
        await wait_final(proc, sent["messageId"])
        names = {kind: set(json.loads(await wait_file(path))) - SHELL_OWN for kind, path in dumps.items()}
        assert names["command"] == names["mcp"] == names["acp"], names
        await proc.close()


def test_no_inherited_name_looks_like_a_secret() -> None:
    from sidecar.children.env import INHERITED_POSIX, INHERITED_WINDOWS
    from sidecar.secrets.names import is_secret_name

    assert not [n for n in (*INHERITED_POSIX, *INHERITED_WINDOWS) if is_secret_name(n) or n.startswith("CHAT_")]
