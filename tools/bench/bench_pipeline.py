#!/usr/bin/env python3
"""Request-pipeline benchmark: building a request from a 10,000-message branch.

    python3 dev.py bench bench_pipeline [--messages 10000] [--rounds 30] [--window 0]

In one run, on a temporary database holding one session whose active branch has N messages
(realistic mixed English/Chinese/code text, 40-250 tokens each):
- first-time token counting: TokenLedger.counts over the whole branch with empty caches
  (the per-message estimate: tokenize + content hash), in tokens/s, against tiktoken alone
  (``encode_ordinary`` of the same texts with the same encoding) as the baseline; ratio;
- first build: RequestBuilder.build with nothing cached (walks the branch, counts it, writes
  the rolling summary with an instant stand-in summary model, builds the request);
- warm builds with a valid summary: the median (and p90) of ``rounds`` builds of the same
  branch (target: median < 20 ms), and of builds where each round first appends a new
  exchange (user + assistant) as a real conversation does;
- baseline: Store.messages.path of the whole branch (what reading the branch alone costs).
With ``--window N`` the model has a context window of N tokens: every build then also counts
the request as it will be sent and fits it to the window (the context budget).
The summary model is an in-process stand-in that answers at once: model latency is not
the pipeline's cost.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import anyio  # noqa: E402
import msgspec  # noqa: E402

from protocol.context import AssistantUpsertParams, ContextOptions  # noqa: E402
from protocol.sessions import CreateSessionOptions
from protocol.types import MessageV2  # noqa: E402
from sidecar import tokens as tk  # noqa: E402
from sidecar.pipeline.builder import RequestBuilder  # noqa: E402
from sidecar.pipeline.token_cache import TokenLedger  # noqa: E402
from sidecar.providers.types import GenerationParams, ModelInfo, RequestMessage  # noqa: E402
from sidecar.store import AsyncStore, Store  # noqa: E402
from sidecar.store.attachments import AttachmentStore  # noqa: E402
from sidecar.store.ids import new_id  # noqa: E402

MODEL = ModelInfo(id="gpt-4o")
WORDS = (
    "the request pipeline builds a copy of the branch for the provider while the stored history "
    "stays as it is summary window tokens threshold context assistant user tool result file "
    "数据库 会话 消息 摘要 窗口 上下文 模型 请求 用户 助手"
).split()
CODE = "def handler(event):\n    for key, value in event.items():\n        print(f'{key}={value}')\n"


def text_for(rng: random.Random, i: int) -> str:
    words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(30, 180)))
    return f"message {i}: {words}" + (f"\n```python\n{CODE}```" if i % 7 == 0 else "")


async def stand_in_model(provider_id: str, model_id: str, messages: list[RequestMessage], **kw: Any) -> str:
    return "Summary: the conversation so far covered the request pipeline and its tests."


def make_branch(store: Store, n: int) -> tuple[str, list[MessageV2]]:
    session = store.sessions.create(CreateSessionOptions(provider_id="p", model_id="m", title="bench"))
    rng = random.Random(6)
    messages: list[MessageV2] = []
    parent = None
    for i in range(n):
        mid = new_id()
        messages.append(MessageV2(
            id=mid, session_id=session.id, parent_id=parent, role="user" if i % 2 == 0 else "assistant",
            text_content=text_for(rng, i), created_at=1_700_000_000_000 + i, updated_at=1_700_000_000_000 + i,
        ))
        parent = mid
    exported = store.sessions.export(session.id)
    exported.session.active_leaf_id = parent
    store.sessions.import_(exported.session, messages, replace=True)
    return session.id, messages


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(tmp)
        store.assistants.upsert(
            AssistantUpsertParams(id="default", name="Default", context=ContextOptions(compress_threshold=32_000)), now=1
        )
        t0 = time.perf_counter()
        session_id, messages = make_branch(store, args.messages)
        print(f"branch of {len(messages)} messages stored in {time.perf_counter() - t0:.2f}s")

        # -- first-time token counting vs tiktoken alone (same texts, same encoding) --------
        encoding = tk.encoding_for_model(MODEL.id).encoding
        enc = tk.get_encoding(encoding)  # load the vocabulary outside the timings
        texts = [m.text_content or "" for m in messages]
        started = time.perf_counter()
        raw_tokens = sum(len(enc.encode_ordinary(t)) for t in texts)
        raw_s = time.perf_counter() - started
        ledger = TokenLedger(None)
        started = time.perf_counter()
        counted = sum(ledger.counts(messages, encoding))
        ledger_s = time.perf_counter() - started
        started = time.perf_counter()
        ledger.counts(messages, encoding)
        cached_s = time.perf_counter() - started
        print(f"\nfirst-time token counting ({encoding}, {raw_tokens:,} tokens of text):")
        print(f"  tiktoken alone        {raw_tokens / raw_s:>14,.0f} tokens/s  ({raw_s * 1000:.1f} ms)")
        print(f"  TokenLedger (first)   {raw_tokens / ledger_s:>14,.0f} tokens/s  ({ledger_s * 1000:.1f} ms,"
              f" {counted:,} estimated incl. framing)")
        print(f"  ratio ledger/tiktoken {raw_s / ledger_s:.2f}x the throughput")
        print(f"  TokenLedger (cached)  {cached_s * 1000:.1f} ms for the same branch")

        # -- request building ---------------------------------------------------------------
        builder = RequestBuilder(AsyncStore(store), AttachmentStore(Path(tmp)), call_model=stand_in_model)
        model = msgspec.structs.replace(MODEL, context_window=args.window or None)
        if args.window:
            print(f"\nthe model has a context window of {args.window:,} tokens (the budget counts every request)")
        leaf = messages[-1].id

        async def build_once(leaf_id: str) -> Any:
            session = store.sessions.get(session_id)
            return await builder.build_detailed(session=session, leaf_id=leaf_id, model=model, params=GenerationParams())

        started = time.perf_counter()
        request, info = await build_once(leaf)
        first_s = time.perf_counter() - started
        assert info.window.summary is not None and info.window.refreshed
        print(f"\nfirst build (walk + count {len(messages)} messages + summary + request): {first_s * 1000:.1f} ms;"
              f" request: {len(request.messages)} messages, summary covers {info.window.summary.covered_count}")

        same: list[float] = []
        for _ in range(args.rounds):
            started = time.perf_counter()
            _, info = await build_once(leaf)
            same.append((time.perf_counter() - started) * 1000)
            assert info.window.summary is not None and not info.window.refreshed
        growing: list[float] = []
        refreshes = 0
        for i in range(args.rounds):
            user = store.messages.append(session_id, role="user", text_content=text_for(random.Random(i), i))
            reply = store.messages.append(session_id, role="assistant", text_content=text_for(random.Random(-i), i))
            started = time.perf_counter()
            _, info = await build_once(reply.id)
            growing.append((time.perf_counter() - started) * 1000)
            refreshes += info.window.refreshed
            assert user.id
        started = time.perf_counter()
        for _ in range(5):
            store.messages.path(session_id, leaf)
        path_ms = (time.perf_counter() - started) * 1000 / 5

        if args.window:
            print(f"  last request: {info.budget.total:,} of {args.window:,} tokens, {info.budget.dropped} dropped")
        print(f"\nwarm builds with a valid summary ({args.rounds} rounds each):")
        print(f"  same branch           median {statistics.median(same):6.2f} ms   p90 {pct(same, 0.9):6.2f} ms"
              f"   (target: median < 20 ms)")
        print(f"  +1 exchange per round median {statistics.median(growing):6.2f} ms   p90 {pct(growing, 0.9):6.2f} ms"
              f"   ({refreshes} summary refreshes)")
        print(f"  baseline: Store.messages.path of the whole branch {path_ms:.1f} ms"
              f" -> warm build / full read = {statistics.median(same) / path_ms:.2f}")
        store.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--window", type=int, default=0, help="the model's context window (0: none)")
    anyio.run(main, parser.parse_args())
