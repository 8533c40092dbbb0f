#!/usr/bin/env python3
"""IM channel benchmarks: a long reply rendered and split for every dialect; a Telegram
message's way through a sidecar subprocess on loopback.

    python3 dev.py bench bench_channels [--kib 100] [--rounds 20] [--section all|render|telegram]

Render: in one run, for a reply of about ``kib`` KiB of realistic Markdown (English and Chinese
paragraphs, lists, tables, code fences), per dialect at its default limit: the median time
of ``text_chunks`` (parse, render, split), the number of chunks and the throughput in MB/s;
and as the baseline measured in the same run, markdown-it-py's own ``render`` (Markdown ->
HTML) of the same text, with the ratio ours / baseline. In stream mode a reply is rendered
again at every edit (at most once per ``editIntervalMs``, default 1 s), so a step must stay
well below that interval.

Telegram (``--telegram-rounds``, default 15): one sidecar subprocess, the scripted provider
(fixtures/scripted_provider.py) as its default model, the fake Bot API of the tests
(tests/platform_fakes.py) in this process, a ``telegram_polling`` channel. Per round a
message is put into the long poll; measured from that moment: the provider's first token as
the sidecar sees it (its first ``chat:stream`` text_delta on stdout: the poll, the inbox,
the session and the request on the way; the baseline) and the first ``sendMessage`` the
fake receives (plus render, split, the outbox and the Bot API call). Prints the medians, the
ratio first chunk / first token and the difference, for reply mode ``stream`` (the first
part goes while the reply streams) and ``once`` (the first chunk waits for the whole reply:
REPLY_CHUNKS deltas REPLY_DELAY_MS apart).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import msgspec  # noqa: E402
from markdown_it import MarkdownIt  # noqa: E402

from protocol.channels import ChannelConfigUpsertParams  # noqa: E402
from sidecar.channels.compose import text_chunks  # noqa: E402
from sidecar.channels.platforms import resolve_config  # noqa: E402

PLATFORM_OF = {
    "feishu_card": "feishu", "feishu_post": "feishu", "dingtalk_md": "dingtalk", "wecom_md": "wecom",
    "slack_blocks": "slack", "slack_mrkdwn": "slack", "telegram_md": "telegram", "discord_md": "discord",
    "plain": "wechat",
}
EN = "the reply is rendered for the platform and split at its limits without breaking code or tables".split()
ZH = ["渲染", "回复", "平台", "消息", "分割", "代码", "表格", "会话", "模型", "用户"]


def document(kib: int, rng: random.Random) -> str:
    blocks: list[str] = []
    size = 0
    i = 0
    while size < kib * 1024:
        kind = i % 5
        if kind == 0:
            block = " ".join(rng.choice(EN) for _ in range(80)) + ". **Bold** and [a link](https://example.com)."
        elif kind == 1:
            block = "，".join("".join(rng.choice(ZH) for _ in range(6)) for _ in range(20)) + "。"
        elif kind == 2:
            block = "\n".join(f"- item {j}: `{rng.choice(EN)}` {rng.choice(ZH)}" for j in range(8))
        elif kind == 3:
            block = "| key | value |\n|---|---|\n" + "\n".join(f"| k{j} | {rng.choice(EN)} {j} |" for j in range(12))
        else:
            block = "```python\n" + "\n".join(f"value_{j} = compute({j}, '{rng.choice(EN)}')" for j in range(15)) + "\n```"
        blocks.append(block)
        size += len(block.encode())
        i += 1
    return "\n\n".join(blocks)


def median_ms(fn: object, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


REPLY_CHUNKS = 20
REPLY_DELAY_MS = 20


async def telegram_rounds(mode: str, rounds: int) -> tuple[list[float], list[float]]:
    """(first token ms, first sendMessage ms) per round, from the message's arrival."""
    import tempfile

    import anyio

    from chat_helpers import configure_provider
    from platform_fakes import TELEGRAM_TOKEN, fake_telegram
    from scripted_server import scripted_provider
    from sidecar_proc import spawn_sidecar

    first_token: list[float] = []
    first_chunk: list[float] = []
    words = " ".join(f"word{i}" for i in range(REPLY_CHUNKS * 3))
    with tempfile.TemporaryDirectory() as data_dir:
        async with scripted_provider() as server, fake_telegram() as fake, spawn_sidecar(data_dir) as proc:
            await configure_provider(proc, server.base_url)
            await proc.call("channel:config:upsert", {
                "id": "tg", "platform": "telegram", "allowEveryone": True, "replyMode": mode,
                "connection": {"kind": "telegram_polling", "apiBaseUrl": fake.base_url, "pollTimeoutS": 30},
                "credentials": {"botToken": TELEGRAM_TOKEN},
            })
            await proc.call("channel:connect", {"id": "tg"})
            with anyio.fail_after(30):
                while (await proc.call("channel:config:get", {"id": "tg"}))["status"]["state"] != "connected":
                    await anyio.sleep(0.02)
            for number in range(rounds + 1):  # the first round warms up (imports, first request)
                await server.script({"text": words, "chunks": REPLY_CHUNKS, "delay_ms": REPLY_DELAY_MS})
                sent, seen = len(fake.sent), len(proc.lines)
                started = time.perf_counter()
                fake.post(f"question {number}", chat_id=1000 + number)
                token_at: float | None = None
                with anyio.fail_after(60):
                    while token_at is None or len(fake.sent) == sent:
                        if token_at is None and any(b'"text_delta"' in line for line in proc.lines[seen:]):
                            token_at = time.perf_counter()
                        seen = len(proc.lines) if token_at is None else seen
                        await anyio.sleep(0.0005)
                chunk_at = fake.sent_at[sent]
                with anyio.fail_after(60):  # the whole reply is out before the next round
                    while len((await proc.call("channel:messages", {"channel": "tg", "status": "replied"}))[
                            "entries"]) <= number:
                        await anyio.sleep(0.01)
                if number:
                    first_token.append((min(token_at, chunk_at) - started) * 1000)
                    first_chunk.append((chunk_at - started) * 1000)
            await proc.close()
    return first_token, first_chunk


def telegram(rounds: int) -> None:
    import anyio

    print(f"Telegram loopback, {rounds} rounds per mode; a reply is {REPLY_CHUNKS} deltas {REPLY_DELAY_MS} ms apart")
    for mode in ("stream", "once"):
        token, chunk = anyio.run(telegram_rounds, mode, rounds)
        t, c = statistics.median(token), statistics.median(chunk)
        print(
            f"  {mode:6s} message in -> provider's first token {t:7.1f} ms (baseline)"
            f"   -> first sendMessage {c:7.1f} ms   ratio {c / t:5.2f}x   +{c - t:.1f} ms"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kib", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--telegram-rounds", type=int, default=15)
    parser.add_argument("--section", choices=("all", "render", "telegram"), default="all")
    args = parser.parse_args()
    if args.section in ("all", "telegram"):
        telegram(args.telegram_rounds)
    if args.section == "telegram":
        return
    text = document(args.kib, random.Random(7))
    mb = len(text.encode()) / 1e6
    md = MarkdownIt("commonmark").enable(["table", "strikethrough"])
    md.render(text)
    baseline = median_ms(lambda: md.render(text), args.rounds)
    print(f"reply: {len(text.encode()) / 1024:.0f} KiB, {len(text)} chars; rounds {args.rounds}")
    print(f"baseline markdown-it render to HTML: {baseline:.1f} ms ({mb / baseline * 1000:.1f} MB/s)")
    for dialect, platform in PLATFORM_OF.items():
        config = resolve_config(
            msgspec.convert({"id": "b", "platform": platform, "dialect": dialect}, ChannelConfigUpsertParams), 0
        )
        chunks, _ = text_chunks(text, config)
        ours = median_ms(lambda: text_chunks(text, config), args.rounds)
        print(
            f"{dialect:13s} limit {config.limits.max_message_size:>6} {config.limits.size_unit:10s}"
            f" {len(chunks):>4} chunks  {ours:7.1f} ms  {mb / ours * 1000:5.1f} MB/s  ratio {ours / baseline:4.2f}x"
        )


if __name__ == "__main__":
    main()
