#!/usr/bin/env python3
"""Reads while replies stream: session list and search latency over the wire, idle and
with N replies streaming at once, in one run.

    python3 dev.py bench bench_reads [--sessions 200] [--streams 50] [--samples 300]
                                     [--baseline-root DIR] [--rounds N]

A data dir of ``--sessions`` sessions (bench_store's generator: real migrated schema,
searchable text; ``--streams`` of them are created over the wire to stream into) is
served by a real sidecar subprocess, driven by a lean blocking client (a reader thread stamps every line as it arrives and parses only responses and endings,
so the client's own JSON work is not counted). A loopback OpenAI-compatible server
(fixtures/scripted_provider.py) streams ``--streams`` replies at once (``--chunk-ms``
between deltas, a fast model's pace). Measured, each request sent when the previous one
was answered, alternating:

- ``chat:session:list`` (page of 50) and ``chat:messages:search`` (top 20, common words):
  p50 / p99 / max, first idle, then while every reply is streaming (samples stop when the
  first reply ends), and the ratio loaded / idle (the baseline of the same run);
- the floor: ``compat:status`` (answered from memory, no database work), the same way: what
  the event loop and the pipes alone add under the same load, which no store change removes;
- every reply must end ``stream_end`` and be stored ``completed`` with its full text.

Then the gateway alone, in this process, with no pipeline and no pipes: ``--streams``
writers persist a growing partial reply every ``--persist-ms`` (the lifecycle's default
interval) while the same list and search are timed around the gateway call, once through
one lane as before (``run`` for all) and once through the read lane with batched writes.

Goals: with 50 replies streaming, list p99 <= 10 ms and search p99 <= 25 ms.
``--baseline-root DIR`` also runs the same measurement against the sidecar of another
checkout (e.g. ``git archive`` of main), on a copy of the same data dir, so a change is
compared before/after in one run; ``--rounds N`` measures each tree N times, in
alternating order, and compares the medians. The sidecar's CPU seconds per second during
the loaded window are printed too. The load average is printed: on a shared machine,
figures are only comparable within a run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tools" / "bench"))

import anyio  # noqa: E402
import anyio.to_thread  # noqa: E402

from bench_generation import cpu_seconds  # noqa: E402
from bench_store import generate  # noqa: E402
from protocol.messages import SearchOptions  # noqa: E402
from protocol.sessions import CreateSessionOptions, SessionFilter  # noqa: E402
from scripted_server import scripted_provider  # noqa: E402
from sidecar.store import AsyncStore, Store  # noqa: E402

ENDINGS = (b'"stream_end"', b'"error"', b'"aborted"')
LIST_PARAMS = {"limit": 50}
SEARCH_QUERIES = ("function", "问题", "the data", "server")
GOALS = {"list": 10.0, "search": 25.0}


class WireClient:
    """A sidecar subprocess over NDJSON pipes; responses stamped on arrival."""

    def __init__(self, root: Path, data_dir: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sidecar", "--data-dir", str(data_dir), "--log-level", "WARNING"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=root,
            env={**os.environ, "PYTHONPATH": str(root)},
        )
        self.next_id = 0
        self._cond = threading.Condition()
        self._responses: dict[int, tuple[float, dict[str, Any]]] = {}
        self.ended: dict[str, str] = {}
        self.first_delta: set[str] = set()
        self.events = 0
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            stamp = time.perf_counter()
            head = line[:60]
            if b'"method"' in head:
                self.events += 1
                if b'"chat:stream"' not in line[:120]:
                    continue
                if any(marker in line for marker in ENDINGS) or b'"text_delta"' in line[:400]:
                    params = json.loads(line)["params"]
                    with self._cond:
                        if params["type"] == "text_delta":
                            self.first_delta.add(params["messageId"])
                        elif params["type"] in ("stream_end", "error", "aborted"):
                            detail = params.get("error")
                            self.ended[params["messageId"]] = params["type"] + (f": {detail}" if detail else "")
                        self._cond.notify_all()
                continue
            message = json.loads(line)
            if "id" in message and message["id"] is not None:
                with self._cond:
                    self._responses[message["id"]] = (stamp, message)
                    self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def send(self, method: str, params: Any) -> int:
        assert self.proc.stdin is not None
        self.next_id += 1
        line = json.dumps({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()
        return self.next_id

    def wait(self, request_id: int, timeout: float = 60) -> tuple[float, Any]:
        deadline = time.monotonic() + timeout
        with self._cond:
            while request_id not in self._responses:
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    raise SystemExit(f"no answer to request {request_id}")
                self._cond.wait(left)
            stamp, message = self._responses.pop(request_id)
        if "error" in message:
            raise SystemExit(f"request {request_id}: {message['error']}")
        return stamp, message["result"]

    def call(self, method: str, params: Any) -> Any:
        return self.wait(self.send(method, params))[1]

    def timed(self, method: str, params: Any) -> float:
        start = time.perf_counter()
        stamp, _ = self.wait(self.send(method, params))
        return (stamp - start) * 1000

    def until(self, predicate: Any, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not predicate():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise SystemExit("timed out waiting for the streams")
                self._cond.wait(left)

    def close(self) -> None:
        try:
            self.call("sidecar:shutdown", {})
            self.proc.wait(timeout=30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()


def sample(client: WireClient, count: int, keep_going: Any = lambda: True) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"list": [], "search": [], "floor": []}
    for i in range(count):
        if not keep_going():
            break
        out["floor"].append(client.timed("compat:status", {}))
        out["list"].append(client.timed("chat:session:list", LIST_PARAMS))
        query = SEARCH_QUERIES[i % len(SEARCH_QUERIES)]
        out["search"].append(client.timed("chat:messages:search", {"query": query, "options": {"limit": 20}}))
    return out


def stats(values: list[float]) -> tuple[float, float, float]:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(round(0.99 * (len(ordered) - 1))))]
    return statistics.median(ordered), p99, ordered[-1]


def measure(root: Path, data_dir: Path, base_url: str, args: argparse.Namespace) -> dict[str, Any]:
    client = WireClient(root, data_dir)
    try:
        client.call("sidecar:initialize", {})
        provider = client.call("provider:upsert", {
            "name": "bench", "type": "openai-compat", "baseUrl": base_url, "models": [{"id": "bench-1"}],
        })
        client.call("provider:setDefault", {"providerId": provider["id"], "modelId": "bench-1"})
        client.call("settings:update", {"generateTitles": False})
        # the generated sessions name no provider: the replies stream into sessions of the
        # bench's own, which complete the data dir's count
        sessions = [client.call("chat:session:create", {"title": f"stream {i}"})["id"] for i in range(args.streams)]
        sample(client, 20)  # warm up: imports, page cache, statement cache
        idle = sample(client, args.samples)
        load_before = os.getloadavg()
        ids = [client.call("chat:send", {"sessionId": sid, "input": {"content": "go"}})["messageId"] for sid in sessions]
        client.until(lambda: set(ids) <= client.first_delta | client.ended.keys(), 120)
        if client.ended.keys() & set(ids):
            raise SystemExit(f"a reply ended before every reply streamed: {client.ended}")
        events_before = client.events
        started = time.perf_counter()
        cpu_before = cpu_seconds(client.proc.pid)
        loaded = sample(client, args.samples, keep_going=lambda: not (client.ended.keys() & set(ids)))
        window = time.perf_counter() - started
        cpu = cpu_seconds(client.proc.pid) - cpu_before
        events = client.events - events_before
        streaming_at_end = len(set(ids) - client.ended.keys())
        client.until(lambda: set(ids) <= client.ended.keys(), 300)
        load_after = os.getloadavg()
        bad = {mid: kind for mid, kind in client.ended.items() if mid in ids and kind != "stream_end"}
        if bad:
            raise SystemExit(f"replies did not complete: {bad}")
        expected = args.word * args.chunks
        for sid, mid in zip(sessions, ids):
            stored = [m for m in client.call("chat:messages:get", {"sessionId": sid}) if m["id"] == mid]
            if not stored or stored[0]["status"] != "completed" or stored[0]["textContent"] != expected:
                raise SystemExit(f"reply {mid} was not stored whole: {stored[0]['status'] if stored else 'missing'}")
        return {
            "idle": idle, "loaded": loaded, "window_s": window, "events": events,
            "streaming_at_end": streaming_at_end, "load": (load_before, load_after), "cpu_s": cpu,
        }
    finally:
        client.close()


def report(label: str, result: dict[str, Any], streams: int) -> dict[str, float]:
    before, after = result["load"]
    print(f"{label}: {len(result['loaded']['list'])} loaded samples in {result['window_s']:.1f} s, "
          f"{result['events'] / max(result['window_s'], 1e-9):.0f} events/s on the wire, "
          f"{result['streaming_at_end']} of {streams} still streaming at the last sample; sidecar CPU "
          f"{result['cpu_s'] / max(result['window_s'], 1e-9):.2f} s/s; "
          f"load average {before[0]:.2f} -> {after[0]:.2f}")
    out: dict[str, float] = {}
    f50, f99, fmax = stats(result["idle"]["floor"])
    l50, l99, lmax = stats(result["loaded"]["floor"])
    print(f"  floor  idle   p50 {f50:6.2f}  p99 {f99:6.2f}  max {fmax:7.2f} ms   (compat:status: no database work)")
    print(f"  floor  loaded p50 {l50:6.2f}  p99 {l99:6.2f}  max {lmax:7.2f} ms   (the event loop's own latency)")
    out["floor p99"] = l99
    for kind in ("list", "search"):
        i50, i99, imax = stats(result["idle"][kind])
        l50, l99, lmax = stats(result["loaded"][kind])
        met = "met" if l99 <= GOALS[kind] else "NOT met"
        print(f"  {kind:6} idle   p50 {i50:6.2f}  p99 {i99:6.2f}  max {imax:7.2f} ms")
        print(f"  {kind:6} loaded p50 {l50:6.2f}  p99 {l99:6.2f}  max {lmax:7.2f} ms   "
              f"p99 loaded/idle {l99 / i99:5.2f}   goal p99 <= {GOALS[kind]:.0f} ms: {met}")
        out[f"{kind} p99"] = l99
    return out


async def gateway(data_dir: Path, lanes: bool, args: argparse.Namespace) -> dict[str, list[float]]:
    """The store gateway alone, in this process: ``--streams`` writers persisting a growing
    partial reply every ``--persist-ms`` (as the lifecycle does), and the same list and
    search, timed around the gateway call. ``lanes``: reads through ``read``, partial writes
    through ``persist``; otherwise everything through ``run`` (one lane, one transaction per
    write: the gateway as it was)."""
    store = await AsyncStore.open(data_dir)
    out: dict[str, list[float]] = {"list": [], "search": []}
    try:
        def rows(s: Store) -> list[str]:
            ids = []
            with s.transaction():
                for i in range(args.streams):
                    session = s.sessions.create(CreateSessionOptions(title=f"gateway {i}"))
                    user = s.messages.append(session.id, role="user", text_content="go")
                    ids.append(s.messages.append(session.id, role="assistant", parent_id=user.id, status="pending").id)
            return ids

        replies = await store.run(rows)
        stop = anyio.Event()
        read = store.read if lanes else store.run
        per_tick = max(1, round(args.persist_ms / args.chunk_ms))

        async def writer(message_id: str) -> None:
            text = ""
            while not stop.is_set():
                await anyio.sleep(args.persist_ms / 1000)
                text += args.word * per_tick

                def write(s: Store, text: str = text) -> None:
                    s.messages.update_partial(message_id, text_content=text, parts=None, seq=len(text))

                await (store.persist(write) if lanes else store.run(write))

        async def timed(fn: Any) -> float:
            start = time.perf_counter()
            await read(fn)
            return (time.perf_counter() - start) * 1000

        async with anyio.create_task_group() as tg:
            for message_id in replies:
                tg.start_soon(writer, message_id)
            await anyio.sleep(args.persist_ms / 1000 * 2)  # every writer has written
            for i in range(args.samples):
                out["list"].append(await timed(lambda s: s.sessions.query(SessionFilter(limit=50))))
                query = SEARCH_QUERIES[i % len(SEARCH_QUERIES)]
                out["search"].append(await timed(lambda s, q=query: s.search.messages(q, SearchOptions(limit=20))))
            stop.set()
    finally:
        await store.close()
    return out


def report_gateway(results: dict[str, dict[str, list[float]]]) -> None:
    print("the gateway alone, in process (no pipeline, no pipes): list and search while the writers persist")
    for kind in ("list", "search"):
        for label, result in results.items():
            p50, p99, top = stats(result[kind])
            print(f"  {kind:6} {label:30} p50 {p50:6.2f}  p99 {p99:6.2f}  max {top:7.2f} ms")
        one = stats(results["one lane (as before)"][kind])[1]
        two = stats(results["read lane + batched writes"][kind])[1]
        print(f"  {kind:6} p99 lanes / one lane: {two / one:.2f}   goal p99 <= {GOALS[kind]:.0f} ms: "
              f"{'met' if two <= GOALS[kind] else 'NOT met'}")


async def main(args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="bench-reads-"))
    try:
        pristine = work / "pristine"
        pristine.mkdir()
        await anyio.to_thread.run_sync(generate, pristine, args.sessions - args.streams, args.messages)
        print(f"data dir: {args.sessions} sessions, {args.messages} messages; {args.streams} replies of "
              f"{args.chunks} deltas, {args.chunk_ms} ms apart; load average {os.getloadavg()[0]:.2f}")
        trees: list[tuple[str, Path]] = []
        if args.baseline_root:
            trees.append(("baseline", Path(args.baseline_root).resolve()))
        trees.append(("this tree", ROOT))
        figures: dict[str, list[dict[str, float]]] = {label: [] for label, _ in trees}
        async with scripted_provider() as server:
            for round_ in range(args.rounds):
                # the order alternates, so neither tree always runs on a machine the other warmed
                for label, root in trees if round_ % 2 == 0 else trees[::-1]:
                    data_dir = work / f"{label.replace(' ', '-')}-{round_}"
                    shutil.copytree(pristine, data_dir)
                    await server.script(*[
                        {"text": args.word, "repeat": args.chunks, "delay_ms": args.chunk_ms}
                        for _ in range(args.streams)
                    ])
                    result = await anyio.to_thread.run_sync(measure, root, data_dir, server.base_url, args)
                    figures[label].append(report(f"{label}, round {round_ + 1}", result, args.streams))
                    shutil.rmtree(data_dir, ignore_errors=True)
        results: dict[str, dict[str, list[float]]] = {}
        for lanes, label in ((False, "one lane (as before)"), (True, "read lane + batched writes")):
            data_dir = work / f"gateway-{int(lanes)}"
            shutil.copytree(pristine, data_dir)
            results[label] = await gateway(data_dir, lanes, args)
            shutil.rmtree(data_dir, ignore_errors=True)
        print(f"load average {os.getloadavg()[0]:.2f}")
        report_gateway(results)
        if len(figures) == 2:
            for kind in ("list p99", "search p99", "floor p99"):
                mine = statistics.median(f[kind] for f in figures["this tree"])
                base = statistics.median(f[kind] for f in figures["baseline"])
                print(f"{kind} loaded, median of {args.rounds} rounds: this tree {mine:.1f} ms, baseline "
                      f"{base:.1f} ms, ratio {mine / base:.2f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--streams", type=int, default=50)
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--chunks", type=int, default=1500, help="deltas per reply")
    parser.add_argument("--chunk-ms", type=float, default=10.0, help="pause between deltas")
    parser.add_argument("--word", default="word ", help="the text of each delta")
    parser.add_argument("--persist-ms", type=float, default=250.0, help="the gateway part's persistence interval")
    parser.add_argument("--baseline-root", help="another checkout whose sidecar is measured too")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each tree, in alternating order")
    anyio.run(main, parser.parse_args())
