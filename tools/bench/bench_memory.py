#!/usr/bin/env python3
"""Memory benchmark: retrieval over many memories, and what the MemoryEncoder costs a reply.

    python3 dev.py bench bench_memory [--memories 10000] [--dims 384] [--queries 300] [--rounds 30]

Figures, each beside a baseline measured in the same run:
1. memory retrieval, embedding call excluded: MemoryRetriever (the lexical leg over
   ``memories_fts`` + the vector leg over the in-memory index + fusion + reading the chosen
   rows), top 6 over MEMORIES memories x DIMS dims of one scope (the query vector given),
   p50 and p99 (target p50 <= 5 ms), against plain numpy brute force (norms per query, full
   argsort) and the lexical leg alone; plus the basic memory text (RAG off: the block of the
   scope's memories within the default 1,024-token budget) at the same size;
2. first-delta latency with the encoder on and off, in the same run: a real sidecar
   subprocess, the scripted provider on loopback streaming the replies, two assistants
   with encoder ``off`` (two of them: their difference is the run's noise) and one with
   ``auto`` (the off ones given as many memories as the encoder will write, so every
   request carries a basic memory text of the same size), whose sessions are sent to in
   rotating order; the encoder's
   side calls go to a second scripted provider that answers each (valid JSON, one new
   memory) after 200 ms, so an encoder is still running when the next send of its session
   starts. Prints the medians of send -> first text_delta, the ratio on / off beside the
   ratio off / off (the noise), and how many memories the encoder wrote.
The memories of part 1 are written through MemoryRepo (the product's write path) with
random unit vectors; the words are Zipf-distributed, a fifth of the texts Chinese.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import anyio  # noqa: E402
import numpy as np  # noqa: E402

from protocol.context import AssistantProfile, MemorySettings  # noqa: E402
from sidecar.memory.service import MemoryService, basic_text  # noqa: E402
from sidecar.store import Store  # noqa: E402
from sidecar.store.async_store import AsyncStore  # noqa: E402

SCOPE = "bench"
MODEL = "p/embed"
LATIN = [f"w{i}" for i in range(3000)]
CJK = [chr(0x4E00 + i) + chr(0x4E80 + i) for i in range(1500)]


def words(rng: np.random.Generator, vocab: list[str], n: int) -> list[str]:
    ranks = np.minimum(rng.zipf(1.3, n) - 1, len(vocab) - 1)
    return [vocab[r] for r in ranks]


def text_for(rng: np.random.Generator, i: int) -> str:
    if i % 5 == 0:
        return "用户" + "".join(words(rng, CJK, 8)) + f"。{i}"
    return "The user " + " ".join(words(rng, LATIN, 12)) + f" ({i})."


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.array(values), q))


async def bench_retrieval(args: argparse.Namespace, workdir: Path) -> None:
    rng = np.random.default_rng(7)
    store = Store(workdir / "retrieval")
    async_store = AsyncStore(store)

    async def no_embedder(model: str) -> Any:
        raise RuntimeError("the benchmark gives the query vector")

    service = MemoryService(store=async_store, notify=_no_notify, embedder_for=no_embedder,
                            assistant_for=_no_assistant)
    start = time.perf_counter()
    rows: list[tuple[int, bytes]] = []
    vectors = rng.standard_normal((args.memories, args.dims)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    with store.transaction():
        for i in range(args.memories):
            record = store.memory.create(service.new_memory(scope=SCOPE, kind="fact", text=text_for(rng, i),
                                                            source_kind="manual"))
            rows.append((record.rowid, vectors[i].tobytes()))
    store.memory.write_vectors(MODEL, args.dims, rows)
    print(f"wrote {args.memories} memories with {args.dims}-d vectors in {time.perf_counter() - start:.1f} s")
    queries = [" ".join(words(rng, LATIN, 4)) if q % 5 else "".join(words(rng, CJK, 3)) for q in range(args.queries)]
    qvecs = rng.standard_normal((args.queries, args.dims)).astype(np.float32)
    qvecs /= np.linalg.norm(qvecs, axis=1, keepdims=True)
    retriever = service.retriever
    await retriever.search_vectors([SCOPE, "global"], queries[0], limit=6, model=MODEL, vector=qvecs[0])  # load
    hybrid: list[float] = []
    found = 0
    for query, vector in zip(queries, qvecs):
        t = time.perf_counter()
        result = await retriever.search_vectors([SCOPE, "global"], query, limit=6, model=MODEL, vector=vector)
        hybrid.append((time.perf_counter() - t) * 1000)
        found += len(result.hits)
    lexical: list[float] = []
    for query in queries:
        t = time.perf_counter()
        await async_store.run(lambda s, q=query: s.memory.lexical([SCOPE, "global"], q, 50))
        lexical.append((time.perf_counter() - t) * 1000)
    brute: list[float] = []
    for vector in qvecs:
        t = time.perf_counter()
        matrix = vectors
        norms = np.linalg.norm(matrix, axis=1)
        scores = matrix @ vector / (norms * np.linalg.norm(vector))
        np.argsort(-scores)[:6]
        brute.append((time.perf_counter() - t) * 1000)
    profile = AssistantProfile(id=SCOPE, name="bench", memory=MemorySettings(enabled=True))
    basic: list[float] = []
    for _ in range(min(50, args.queries)):
        t = time.perf_counter()
        block = basic_text(store, profile)
        basic.append((time.perf_counter() - t) * 1000)
    print(f"\n1. memory retrieval over {args.memories} memories x {args.dims} dims, top 6, embedding excluded "
          f"({args.queries} queries, {found / args.queries:.1f} hits each)")
    print(f"   hybrid (MemoryRetriever)   p50 {pct(hybrid, 50):7.2f} ms   p99 {pct(hybrid, 99):7.2f} ms   (target p50 <= 5 ms)")
    print(f"   lexical leg alone          p50 {pct(lexical, 50):7.2f} ms   p99 {pct(lexical, 99):7.2f} ms")
    print(f"   numpy brute force (vector) p50 {pct(brute, 50):7.2f} ms   p99 {pct(brute, 99):7.2f} ms")
    print(f"   ratio hybrid / brute force p50 {pct(hybrid, 50) / pct(brute, 50):.2f}")
    print(f"   basic memory text (RAG off, 1,024 tokens: {block.count('<memory ') if block else 0} memories) "
          f"p50 {pct(basic, 50):7.2f} ms")
    store.close()


async def _no_notify(method: str, params: Any) -> None:
    return None


async def _no_assistant(session_id: str | None) -> AssistantProfile:
    raise RuntimeError("not used")


async def first_delta(proc: Any, session_id: str, text: str) -> float:
    start_index = len(proc.messages)
    start = time.perf_counter()
    sent = await proc.call("chat:send", {"sessionId": session_id, "input": {"content": text}}, timeout=120)
    mid = sent["messageId"]
    await proc.wait_for(lambda m: isinstance(m, dict) and m.get("method") == "chat:stream"
                        and m["params"]["messageId"] == mid and m["params"]["type"] == "text_delta",
                        timeout=120, start=start_index)
    first = time.perf_counter() - start
    _, end = await proc.wait_for(lambda m: isinstance(m, dict) and m.get("method") == "chat:stream"
                                 and m["params"]["messageId"] == mid
                                 and m["params"]["type"] in ("stream_end", "error", "aborted"),
                                 timeout=120, start=start_index)
    if end["params"]["type"] != "stream_end":
        raise SystemExit(f"generation failed: {end['params']}")
    return first * 1000


async def bench_encoder(args: argparse.Namespace, workdir: Path) -> None:
    from scripted_server import scripted_provider
    from sidecar_proc import spawn_sidecar

    async with scripted_provider() as chat, scripted_provider() as side, \
            spawn_sidecar(workdir / "encoder", env={"CHAT_SIDECAR_LOG_LEVEL": "WARNING"}) as proc:
        await proc.call("sidecar:initialize", {"protocolVersion": 1})
        providers = {}
        for name, server in (("chat", chat), ("side", side)):
            providers[name] = await proc.call("provider:upsert", {
                "name": name, "type": "openai-compat", "baseUrl": server.base_url, "apiKey": "sk-bench",
                "models": [{"id": "m1", "contextWindow": 32000}]})
        await proc.call("provider:setDefault", {"providerId": providers["chat"]["id"], "modelId": "m1"})
        await side.script(*[{
            "text": json.dumps({"remember": True, "reason": "bench", "memories": [
                {"kind": "fact", "text": f"The user mentioned topic number {i} in round {i}.", "subject": "user"}]}),
            "whole_delay_s": 0.2} for i in range(args.rounds + 5)])
        sessions = {}
        for mode in ("off", "off2", "auto"):
            await proc.call("assistant:upsert", {"id": f"enc-{mode}", "name": mode, "memory": {
                "enabled": True, "encoder": "off" if mode == "off2" else mode,
                "encoderModel": {"providerId": providers["side"]["id"], "modelId": "m1"}}})
            session = await proc.call("chat:session:create", {"title": f"bench {mode}"})
            await proc.call("chat:context:update", {"sessionId": session["id"], "assistantId": f"enc-{mode}"})
            sessions[mode] = session["id"]
        # the same memory load on both sides (the encoder fills its own scope as it runs), so
        # the difference is the encoder's work, not a longer basic memory text
        for scope in ("enc-off", "enc-off2"):
            for i in range(args.rounds + 1):
                await proc.call("memory:create", {"scope": scope,
                                                  "text": f"The user mentioned topic number {i} in round {i}."})
        for mode in ("off", "off2", "auto"):  # warm-up
            await first_delta(proc, sessions[mode], "warm up the path please")
        timings: dict[str, list[float]] = {"off": [], "off2": [], "auto": []}
        orders = [("off", "off2", "auto"), ("auto", "off", "off2"), ("off2", "auto", "off")]
        for i in range(args.rounds):
            for mode in orders[i % 3]:
                timings[mode].append(await first_delta(proc, sessions[mode], f"I like topic {i}, tell me more"))
        with anyio.fail_after(60):
            while len((await proc.call("memory:list", {"scope": "enc-auto", "limit": 500}))["memories"]) < args.rounds:
                await anyio.sleep(0.1)
        written = (await proc.call("memory:list", {"scope": "enc-auto", "limit": 500}))["total"]
        await proc.close(timeout=20)
    off, on = statistics.median(timings["off"]), statistics.median(timings["auto"])
    off2 = statistics.median(timings["off2"])
    print(f"\n2. first-delta latency, send -> first text_delta, {args.rounds} rounds each, rotating order")
    print(f"   encoder off   median {off:7.2f} ms   p90 {pct(timings['off'], 90):7.2f} ms")
    print(f"   encoder auto  median {on:7.2f} ms   p90 {pct(timings['auto'], 90):7.2f} ms   "
          f"({written} memories written by the encoder in the background)")
    print(f"   encoder off (a second assistant, the noise baseline) median {off2:7.2f} ms")
    print(f"   ratio on / off {on / off:.2f}, on / off2 {on / off2:.2f}, on / mean(off, off2) "
          f"{2 * on / (off + off2):.2f}; noise: off2 / off {off2 / off:.2f}  (target: no difference beyond noise)")


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp:
        workdir = Path(tmp)
        await bench_retrieval(args, workdir)
        await bench_encoder(args, workdir)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memories", type=int, default=10_000)
    parser.add_argument("--dims", type=int, default=384)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=30)
    anyio.run(main, parser.parse_args())
