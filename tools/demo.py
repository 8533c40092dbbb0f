#!/usr/bin/env python3
"""The demo: drive the sidecar over stdio exactly as the Electron main process would.

    python3 dev.py demo                          scripted provider on loopback (no key needed)
    python3 dev.py demo --provider openai-compat --base-url https://api.openai.com/v1 \\
        --model gpt-4o-mini --api-key-env OPENAI_API_KEY
    python3 dev.py demo --provider anthropic --base-url https://api.anthropic.com \\
        --model claude-sonnet-4-5 --api-key-env ANTHROPIC_API_KEY
    python3 dev.py demo --provider ollama --base-url http://127.0.0.1:11434 --model llama3.2

It spawns ``python -m sidecar`` with its own data dir (a fresh temporary one unless
``--data-dir`` is given; the database is the default embedded SQLite store), speaks
NDJSON JSON-RPC to it through our own JsonRpcPeer, and shows: the handshake, provider
configuration, a streamed reply, a regenerate (a second branch), an edit-and-resend (a
third), the message tree, a full-text search in Chinese and English, the session list,
and a clean shutdown.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from protocol import ChatStreamEvent  # noqa: E402
from sidecar.rpc import Handler, JsonRpcPeer  # noqa: E402

BOLD, DIM, CYAN, GREEN, YELLOW, RESET = (
    ("\033[1m", "\033[2m", "\033[36m", "\033[32m", "\033[33m", "\033[0m")
    if sys.stdout.isatty()
    else ("",) * 6
)


def say(text: str = "") -> None:
    print(text, flush=True)


def step(title: str) -> None:
    say(f"\n{BOLD}== {title}{RESET}")


class Stream:
    """Prints chat:stream events as they arrive and signals each message's end."""

    def __init__(self) -> None:
        self.done: dict[str, anyio.Event] = {}
        self.final: dict[str, Any] = {}
        self.seqs: dict[str, list[int]] = {}

    def expect(self, message_id: str) -> anyio.Event:
        return self.done.setdefault(message_id, anyio.Event())

    async def on_event(self, event: Any) -> None:
        self.seqs.setdefault(event.message_id, []).append(event.seq)
        tag = type(event).__struct_config__.tag
        if tag == "text_delta":
            print(event.text, end="", flush=True)
        elif tag == "thinking_delta":
            print(f"{DIM}{event.thinking}{RESET}", end="", flush=True)
        elif tag == "stream_start":
            print(f"{CYAN}assistant ({event.model_id}):{RESET} ", end="", flush=True)
        elif tag in ("stream_end", "error", "aborted"):
            detail = ""
            if tag == "stream_end" and event.usage:
                detail = f" usage in={event.usage.input_tokens} out={event.usage.output_tokens}"
            elif tag == "error":
                detail = f" {event.error}"
            seqs = self.seqs[event.message_id]
            say(f"\n{DIM}[{tag}{detail}; {len(seqs)} events, seq 1..{seqs[-1]}]{RESET}")
            self.final[event.message_id] = event
            self.expect(event.message_id).set()


async def run(args: argparse.Namespace) -> int:
    data_dir = args.data_dir or tempfile.mkdtemp(prefix="chat-sidecar-demo-")
    provider_proc = None
    if args.provider is None:
        provider_proc = subprocess.Popen(
            [sys.executable, str(ROOT / "fixtures" / "scripted_provider.py"), "--port", "0"],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert provider_proc.stdout is not None
        port = int(provider_proc.stdout.readline().split()[1])
        provider = {"name": "Scripted (loopback)", "type": "openai-compat", "baseUrl": f"http://127.0.0.1:{port}/v1"}
        model = {"id": "scripted-1", "contextWindow": 32000, "inputPrice": 0.5, "outputPrice": 1.5}
    else:
        provider = {"name": args.provider, "type": args.provider, "baseUrl": args.base_url}
        if args.api_key_env:
            provider["apiKeyEnv"] = args.api_key_env
        model = {"id": args.model, "supportsImages": False}
    provider["models"] = [model]

    stream = Stream()
    env = dict(os.environ, CHAT_SIDECAR_LOG_LEVEL=os.environ.get("CHAT_SIDECAR_LOG_LEVEL", "WARNING"))
    cmd = [sys.executable, "-m", "sidecar", "--data-dir", data_dir]
    say(f"{DIM}spawning: {' '.join(cmd)}{RESET}")
    try:
        async with await anyio.open_process(cmd, env=env, cwd=ROOT, stderr=None) as process:
            assert process.stdout is not None and process.stdin is not None
            handlers = {"chat:stream": Handler(ChatStreamEvent, stream.on_event)}
            async with JsonRpcPeer(process.stdout, process.stdin, handlers, name="demo") as peer:
                code = await scenario(peer, stream, provider, model["id"], data_dir)
            with anyio.fail_after(10):
                await process.wait()
            say(f"\n{DIM}sidecar exited with code {process.returncode}{RESET}")
            return code or process.returncode or 0
    finally:
        if provider_proc is not None:
            provider_proc.terminate()
            provider_proc.wait(timeout=5)


async def scenario(peer: JsonRpcPeer, stream: Stream, provider: dict[str, Any], model_id: str, data_dir: str) -> int:
    async def call(method: str, params: Any = None) -> Any:
        return await peer.request(method, params, timeout=60)

    async def reply_to(result: dict[str, Any]) -> Any:
        with anyio.fail_after(120):
            await stream.expect(result["messageId"]).wait()
        return stream.final[result["messageId"]]

    step("sidecar:initialize")
    info = await call("sidecar:initialize", {"protocolVersion": 1, "clientInfo": {"name": "demo"}})
    say(f"{info['serverInfo']['name']} {info['serverInfo']['version']}, protocol {info['protocolVersion']}, "
        f"data dir {info['dataDir']}, {len(info['capabilities']['implemented'])} methods implemented")

    step("provider:upsert + provider:setDefault")
    created = await call("provider:upsert", provider)
    await call("provider:setDefault", {"providerId": created["id"], "modelId": model_id})
    say(f"provider {created['name']} ({created['type']}) {created['baseUrl']}, key set: {created['hasApiKey']}")

    step("chat:session:create")
    session = await call("chat:session:create", {"tags": ["demo"], "folder": "Demo"})
    sid = session["id"]
    say(f"session {sid} with model {session['modelId']}")

    step("chat:send (streamed)")
    question = "我们今天讨论全文搜索功能: how should search work for Chinese and English?"
    say(f"{GREEN}user:{RESET} {question}")
    sent = await call("chat:send", {"sessionId": sid, "input": {"content": question}})
    first = await reply_to(sent)
    if type(first).__struct_config__.tag != "stream_end":
        say(f"{YELLOW}the provider failed; stopping the demo here{RESET}")
        await call("sidecar:shutdown")
        return 1

    step("chat:regenerate (a second reply, a new branch)")
    regen = await call("chat:regenerate", {"sessionId": sid})
    await reply_to(regen)

    step("chat:editResend (an edited question, a third branch)")
    say(f"{GREEN}user (edited):{RESET} Explain bigram indexing in one paragraph.")
    edited = await call(
        "chat:editResend",
        {"sessionId": sid, "messageId": sent["userMessageId"], "newContent": "Explain bigram indexing in one paragraph."},
    )
    await reply_to(edited)

    step("chat:messages:tree")
    tree = await call("chat:messages:tree", {"sessionId": sid})

    def show(nodes: list[dict[str, Any]], depth: int = 0) -> None:
        for node in nodes:
            m = node["message"]
            mark = "*" if node["isActive"] else " "
            text = (m["textContent"] or "").replace("\n", " ")
            say(f"  {mark} {'  ' * depth}{m['role']:9} {m['status']:9} {text[:60]}")
            show(node["children"], depth + 1)

    show(tree)
    say(f"{DIM}(* = the active branch){RESET}")

    step("chat:messages:select (switch back to the first branch)")
    first_reply = tree[0]["children"][0]["message"]["id"]
    path = await call("chat:messages:select", {"sessionId": sid, "leafId": first_reply})
    say("active branch now: " + " -> ".join(f"{m['role']}:{(m['textContent'] or '')[:20]!r}" for m in path))

    step("chat:messages:search")
    for query in ("搜索", "SEARCH", "bigram"):
        hits = await call("chat:messages:search", {"query": query, "options": {"limit": 3}})
        say(f"  {query!r}: {len(hits)} hit(s)")
        for hit in hits:
            say(f"     [{hit['role']}] {hit['snippet'][:90]}")

    step("chat:session:list")
    listed = await call("chat:session:list", {"folder": "Demo", "tags": ["demo"]})
    for s in listed["sessions"]:
        say(f"  {s['title']!r}: {s['messageCount']} messages, {s['totalTokens']} tokens, ${s['totalCost']:.6f}")

    step("sidecar:shutdown")
    await call("sidecar:shutdown")
    say(f"done; the database stays in {data_dir}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description="Drive chat-sidecar over stdio as Electron would.")
    parser.add_argument("--provider", choices=["openai-compat", "anthropic", "ollama"], help="a real provider (default: the scripted loopback server)")
    parser.add_argument("--base-url", help="the provider's base URL")
    parser.add_argument("--model", help="model id")
    parser.add_argument("--api-key-env", help="environment variable holding the API key")
    parser.add_argument("--data-dir", help="data dir for the sidecar (default: a new temporary dir)")
    args = parser.parse_args()
    if args.provider and not (args.base_url and args.model):
        parser.error("--provider needs --base-url and --model")
    return anyio.run(run, args)


if __name__ == "__main__":
    sys.exit(main())
