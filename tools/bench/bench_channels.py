#!/usr/bin/env python3
"""IM channel rendering benchmark: a long reply rendered and split for every dialect.

    python3 dev.py bench bench_channels [--kib 100] [--rounds 20]

In one run, for a reply of about ``kib`` KiB of realistic Markdown (English and Chinese
paragraphs, lists, tables, code fences), per dialect at its default limit: the median time
of ``text_chunks`` (parse, render, split), the number of chunks and the throughput in MB/s;
and as the baseline measured in the same run, markdown-it-py's own ``render`` (Markdown ->
HTML) of the same text, with the ratio ours / baseline. In stream mode a reply is rendered
again at every edit (at most once per ``editIntervalMs``, default 1 s), so a step must stay
well below that interval.
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

import msgspec  # noqa: E402
from markdown_it import MarkdownIt  # noqa: E402

from protocol.channels import ChannelConfigUpsertParams  # noqa: E402
from sidecar.channels.compose import text_chunks  # noqa: E402
from sidecar.channels.platforms import resolve_config  # noqa: E402

PLATFORM_OF = {
    "feishu_card": "feishu", "feishu_post": "feishu", "dingtalk_md": "dingtalk", "wecom_md": "wecom",
    "slack_blocks": "slack", "slack_mrkdwn": "slack", "plain": "wechat",
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kib", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
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
