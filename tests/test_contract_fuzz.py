"""Every method of the contract, called with params shaped by its own JSON Schema (random
values within the shape: edge numbers and strings, optional fields or not, ids the sidecar
handed out earlier in the run), never answers -32603 and never logs a traceback; the
process keeps serving.

Deterministic: each seed of ``SEEDS`` draws the same calls every run, so a failure replays
with its seed. The sidecar has the scripted provider as its default, so chat methods run
turns. What would reach outside loopback or start a process is kept in: a provider is of an
HTTP type, an MCP server is an HTTP one on a closed loopback port, the V1 endpoint starts
with no agent command; ``channel:connect`` and ``channel:config:upsert`` (platforms on the
internet) and ``sidecar:shutdown`` are not called.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import pytest
from chat_helpers import configure_provider
from scripted_server import scripted_provider
from sidecar_proc import CallError, spawn_sidecar

pytestmark = pytest.mark.anyio

SCHEMA = json.loads((Path(__file__).resolve().parent.parent / "protocol" / "generated" / "schema.json").read_text())
DEFS = SCHEMA["$defs"]
NOT_CALLED = {"sidecar:shutdown", "channel:connect", "channel:config:upsert"}
CLOSED = "http://127.0.0.1:9"
SEEDS = range(2)
CALLS = 1500
EDGE_TEXT = [
    "", " ", "x", "..", "../../etc/passwd", "/etc/passwd", "漢字", "\u202e", "a" * 300, "\x00", CLOSED + "/v1", "*",
    "%", "\\", '"', "01a23d62-f31d-70ae-9375-1f44f5775189", "default", "NaN", "1e309", "-1", "0 * * * *",
]
EDGE_INT = [0, 1, -1, 2, 10, 2**31, 2**53, 2**63 - 1, -(2**63), 10**6]
ID_KEY = re.compile(r"(?i)id$")


class Draw:
    """Params for a schema, with the ids seen in earlier results (by field name)."""

    def __init__(self, seed: int) -> None:
        self.rnd = random.Random(seed)
        self.ids: dict[str, list[str]] = {}

    def value(self, schema: dict[str, Any], depth: int = 0, name: str = "") -> Any:
        rnd = self.rnd
        if "$ref" in schema:
            return self.value(DEFS[schema["$ref"].rsplit("/", 1)[1]], depth, name)
        for key in ("anyOf", "oneOf", "allOf"):
            if key in schema:
                return self.value(rnd.choice(schema[key]), depth, name)
        if "const" in schema:
            return schema["const"]
        if "enum" in schema:
            return rnd.choice(schema["enum"]) if rnd.random() < 0.95 else "zz"
        kind = schema.get("type")
        if isinstance(kind, list):
            kind = rnd.choice(kind)
        if kind == "object" or "properties" in schema:
            required = set(schema.get("required", []))
            out = {key: self.value(sub, depth + 1, key) for key, sub in schema.get("properties", {}).items()
                   if key in required or (depth < 4 and rnd.random() < (0.5 if depth == 0 else 0.2))}
            extra = schema.get("additionalProperties")
            if isinstance(extra, dict) and depth < 4:
                for _ in range(rnd.randint(0, 2)):
                    out[rnd.choice(["k", "X-Key", *EDGE_TEXT[:8]])] = self.value(extra, depth + 1)
            return out
        if kind == "array":
            count = rnd.randint(schema.get("minItems", 0), min(schema.get("maxItems", 3), 3)) if depth < 5 else 0
            return [self.value(schema.get("items", {}), depth + 1, name) for _ in range(count)]
        if kind == "string":
            known = self.ids.get(name) or (sum(self.ids.values(), []) if ID_KEY.search(name) else [])
            if known and rnd.random() < 0.7:
                return rnd.choice(known)
            if rnd.random() < 0.7:
                return rnd.choice(EDGE_TEXT)
            return "".join(rnd.choice("ab漢\n -_./") for _ in range(rnd.randint(1, 12)))
        if kind == "integer":
            low, high = schema.get("minimum"), schema.get("maximum")
            if low is not None and high is not None and rnd.random() < 0.6:
                return rnd.randint(int(low), int(min(high, low + 1000)))
            return rnd.choice(EDGE_INT)
        if kind == "number":
            return rnd.choice([0, 0.5, -1.5, 1e300, 3.0, 100.0])
        if kind == "boolean":
            return rnd.random() < 0.5
        if kind == "null":
            return None
        return rnd.choice([None, 1, "x", [], {}])

    def params(self, method: str) -> Any:
        schema = SCHEMA["methods"][method].get("params")
        params = self.value(schema) if schema else {}
        if isinstance(params, dict):
            if method == "provider:upsert":  # never an acp-engine: its command would run
                params["type"] = self.rnd.choice(["openai-compat", "anthropic", "ollama"])
                params.pop("engine", None)
            elif method == "mcp:server:upsert":  # never a stdio server
                params.update(transport="http", url=CLOSED + "/mcp")
                params.pop("command", None)
            elif method == "compat:start":  # no agent command, loopback only
                params.pop("agentCommands", None)
                params.pop("allowRemote", None)
                params["port"] = 0
        return params

    def keep_ids(self, value: Any) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                if isinstance(item, str) and ID_KEY.search(key) and len(item) < 80:
                    self.ids.setdefault(key, []).append(item)
                    if key == "id" and "messageCount" in value:
                        self.ids.setdefault("sessionId", []).append(item)
                self.keep_ids(item)
        elif isinstance(value, list):
            for item in value[:20]:
                self.keep_ids(item)


@pytest.mark.parametrize("seed", SEEDS)
async def test_schema_shaped_params_never_meet_an_internal_error(tmp_path: Path, seed: int) -> None:
    draw = Draw(seed)
    methods = sorted(m for m, spec in SCHEMA["methods"].items()
                     if spec.get("direction") == "client->server" and m not in NOT_CALLED)
    internal: list[tuple[str, str, str]] = []
    answered = 0
    async with scripted_provider() as server, spawn_sidecar(tmp_path / "data") as proc:
        await configure_provider(proc, server.base_url)
        for _ in range(3):
            draw.keep_ids(await proc.call("chat:session:create", {"title": "seed"}))
        for _ in range(CALLS):
            method = draw.rnd.choice(methods)
            params = draw.params(method)
            try:
                draw.keep_ids(await proc.call(method, params, timeout=30))
                answered += 1
            except CallError as err:
                if err.code == -32603:
                    internal.append((method, json.dumps(params)[:300], err.message[:300]))
        assert isinstance((await proc.call("chat:session:list", {}))["sessions"], list)
        await proc.close(timeout=60)
    assert not internal, internal[:10]
    assert answered > CALLS // 5  # the draws reach the methods, not only their validation
    proc.assert_no_traceback()
