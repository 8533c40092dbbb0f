#!/usr/bin/env python3
"""Store benchmark: 100,000 sessions / 1,000,000 messages (one third Chinese), then the
queries the renderer makes, through the Store API, each next to a raw-apsw baseline
measured in the same run.

    python3 dev.py bench bench_store [--scale 1.0] [--data-dir DIR] [--keep] [--no-subprocess]

Figures printed (with their targets):
- chat:session:list with folder + tag filter, page of 50: median (< 10 ms)
- chat:messages:search, common and rare words, Chinese and English, top 20: median (< 30 ms)
- chat:messages:get of a 2,000-message branch: median (< 30 ms)
- append_message, one transaction each: messages/s
- database size, RSS of this process (and of the sidecar subprocess when it is measured)
- the migration that folds the full-text indexes (``m_fts_fold``: every message re-indexed),
  run as a start-up runs it: opening the store with it pending, against opening it current
  (``--no-migration`` skips it; it rewrites the index of every message)

Generation writes rows with raw apsw in big transactions (its speed is not the measure)
into a database created and migrated by the Store itself, using the store's own FTS text
transformation, so the measured queries run on exactly what the product would have
written. The data dir defaults to a fresh directory under /tmp (deleted unless --keep).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import apsw  # noqa: E402

from protocol.messages import MessageQueryOptions, SearchOptions
from protocol.sessions import SessionFilter
from protocol.types import DateRange  # noqa: E402
from sidecar.store import Store  # noqa: E402
from sidecar.store import fts  # noqa: E402
from sidecar.store.ids import new_id  # noqa: E402
from sidecar.store.search import SEARCH_WINDOW  # noqa: E402

FULL_SESSIONS = 100_000
FULL_MESSAGES = 1_000_000
LONG_BRANCH = 2_000
FOLDERS = [f"folder-{i}" for i in range(20)]
TAGS = [f"tag-{i}" for i in range(40)]
RARE_EN = "zephyrine"
RARE_ZH = "量子纠缠"
RARE_COUNT = 12

EN_WORDS = """the of and to a in is that for it as with was on be by this are or from at an
which have not but had his they you were their one all we can her has there been if more when
will would who so no what up out about into than them some could only other time then its also
two may like over these first new after any use how our well just where most very work should
because each through such make made many before must those same while under might still world
code function value data model system user file error test server request response class
method string list table query index search result message session token stream network memory
cache update python rust javascript database version feature issue problem question answer
example config setting option default performance latency thread process window context prompt
chat reply branch history summary title folder tag archive export import review design build
deploy release support docs library package module type field number object array return""".split()

ZH_WORDS = """我们 今天 问题 可以 这个 一个 没有 什么 知道 时候 现在 因为 所以 如果 但是 已经
需要 工作 时间 方法 系统 数据 用户 文件 错误 测试 服务器 请求 响应 函数 模型 代码 消息 会话
搜索 全文 索引 结果 功能 设计 性能 内存 缓存 更新 版本 配置 选项 默认 延迟 线程 进程 窗口
上下文 提示 回复 分支 历史 摘要 标题 文件夹 标签 归档 导出 导入 检查 构建 部署 发布 支持 文档
库 模块 类型 字段 数字 对象 数组 返回 处理 分析 讨论 研究 学习 开发 项目 团队 客户 产品 市场
计划 目标 任务 进度 报告 会议 邮件 地址 网络 安全 权限 密码 登录 注册 账号 界面 按钮 页面
链接 图片 视频 音频 文本 格式 编码 解码 压缩 加密 备份 恢复 同步 异步 并发 队列 日志 监控
告警 指标 统计 图表 表格 查询 排序 过滤 分页 上传 下载 安装 卸载 启动 停止 重启 关闭 打开
保存 删除 修改 添加 创建 复制 粘贴 移动 重命名 比较 合并 冲突 解决 优化 改进 重构 迁移""".split()

USER_SENTENCES_EN = (2, 6)
ASSISTANT_SENTENCES = (4, 30)


def zipf_weights(n: int, s: float = 1.0) -> list[float]:
    return [1.0 / (i + 1) ** s for i in range(n)]


class TextPool:
    """Pre-built sentences (with their FTS text) composed into messages quickly."""

    def __init__(self, rng: random.Random, size: int = 6000) -> None:
        en_w = zipf_weights(len(EN_WORDS))
        zh_w = zipf_weights(len(ZH_WORDS))
        self.en: list[tuple[str, str]] = []
        self.zh: list[tuple[str, str]] = []
        for _ in range(size):
            words = rng.choices(EN_WORDS, en_w, k=rng.randint(6, 18))
            s = " ".join(words).capitalize() + rng.choice([".", ".", "?", "!"])
            self.en.append((s, fts.index_text(s)))
            words = rng.choices(ZH_WORDS, zh_w, k=rng.randint(4, 12))
            z = "".join(words) + rng.choice(["。", "。", "？", "，"])
            self.zh.append((z, fts.index_text(z)))

    def message(self, rng: random.Random, chinese: bool, n: int) -> tuple[str, str]:
        picks = rng.choices(self.zh if chinese else self.en, k=n)
        sep = "" if chinese else " "
        return sep.join(p[0] for p in picks), " ".join(p[1] for p in picks)


def generate(store_dir: Path, n_sessions: int, n_messages: int, seed: int = 7) -> dict[str, Any]:
    """Bulk-load the database; returns facts the measurements need."""
    Store(store_dir).close()  # create + migrate with the product's own migrations
    rng = random.Random(seed)
    pool = TextPool(rng)
    conn = apsw.Connection(str(store_dir / "chat.db"))
    conn.execute("PRAGMA journal_mode = WAL; PRAGMA synchronous = OFF; PRAGMA foreign_keys = OFF")
    base_ms = 1_700_000_000_000
    span_ms = 2 * 365 * 24 * 3600 * 1000
    per_session = max(1, n_messages // n_sessions)
    long_session = None
    docid = 0
    made = 0
    rare_left = {"en": RARE_COUNT, "zh": RARE_COUNT}
    batch_sessions = 2000
    s_rows: list[tuple[Any, ...]] = []
    t_rows: list[tuple[str, str]] = []
    m_rows: list[tuple[Any, ...]] = []
    d_rows: list[tuple[int, str]] = []
    f_rows: list[tuple[int, str, str, str]] = []

    def flush() -> None:
        with conn:
            conn.executemany(
                "INSERT INTO sessions_v2(id, title, summary, provider_id, model_id, tags, folder,"
                " is_pinned, is_archived, message_count, created_at, updated_at, last_message_at,"
                " active_leaf_id) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                s_rows,
            )
            conn.executemany("INSERT INTO session_tags(session_id, tag) VALUES (?, ?)", t_rows)
            conn.executemany(
                "INSERT INTO messages_v2(id, session_id, parent_id, role, content_type,"
                " text_content, model_id, status, created_at, updated_at)"
                " VALUES (?,?,?,?,'text',?,?,'completed',?,?)",
                m_rows,
            )
            conn.executemany("INSERT INTO search_docs(docid, message_id) VALUES (?, ?)", d_rows)
            conn.executemany(
                "INSERT INTO messages_fts(rowid, body, sid, role) VALUES (?, ?, ?, ?)", f_rows
            )
        for rows in (s_rows, t_rows, m_rows, d_rows, f_rows):
            rows.clear()

    for i in range(n_sessions):
        sid = new_id()
        remaining_sessions = n_sessions - i
        budget = n_messages - made
        if i == 0:
            count = min(LONG_BRANCH, budget)
            long_session = sid
        elif remaining_sessions == 1:
            count = budget
        else:
            avg = max(1, (budget - LONG_BRANCH * 0) // remaining_sessions)
            count = max(1, min(budget - (remaining_sessions - 1), int(rng.expovariate(1 / avg)) + 1))
            count = min(count, 200)
        created = base_ms + rng.randrange(span_ms)
        chinese_session = rng.random() < 1 / 3
        t = created
        parent: str | None = None
        prev_parent: str | None = None
        sid_token = fts.session_token(sid)
        last_id = None
        for k in range(count):
            role = "user" if k % 2 == 0 else "assistant"
            mid = new_id()
            t += rng.randint(1000, 120_000)
            if role == "user":
                text, body = pool.message(rng, chinese_session, rng.randint(*USER_SENTENCES_EN))
            else:
                text, body = pool.message(rng, chinese_session, rng.randint(*ASSISTANT_SENTENCES))
            lang = "zh" if chinese_session else "en"
            if rare_left[lang] and rng.random() < 0.001:
                rare_left[lang] -= 1
                word = RARE_ZH if chinese_session else RARE_EN
                text += (" " if not chinese_session else "") + word
                body += " " + fts.index_text(word)
            # About 3% of assistant replies are regenerations: a sibling of the previous one.
            this_parent = parent
            if role == "assistant" and k >= 3 and rng.random() < 0.03:
                this_parent = prev_parent
            m_rows.append((mid, sid, this_parent, role, text, "gpt-4o" if role == "assistant" else None, t, t))
            docid += 1
            d_rows.append((docid, mid))
            f_rows.append((docid, body, sid_token, role))
            prev_parent = this_parent
            parent = mid
            last_id = mid
        made += count
        n_tags = rng.choice([0, 0, 1, 1, 2, 3])
        tags = rng.sample(TAGS[:12], n_tags) if rng.random() < 0.7 else rng.sample(TAGS, n_tags)
        folder = rng.choice(FOLDERS) if rng.random() < 0.8 else None
        title = pool.message(rng, chinese_session, 1)[0][:40]
        s_rows.append(
            (sid, title, None, "openai", "gpt-4o", json.dumps(tags), folder,
             int(rng.random() < 0.02), int(rng.random() < 0.1), count, created, t, t, last_id)
        )
        t_rows.extend((sid, tag) for tag in tags)
        if (i + 1) % batch_sessions == 0:
            flush()
    flush()
    conn.execute("PRAGMA optimize")
    conn.close()
    return {"long_session": long_session, "messages": made, "sessions": n_sessions}


def median_ms(fn: Callable[[], Any], runs: int) -> tuple[float, Any]:
    fn()  # warm the statement cache and the page cache
    times = []
    result = None
    for _ in range(runs):
        t0 = time.perf_counter()
        result = fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times), result


def rss_mib(pid: int | str = "self") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def row(name: str, value: float, unit: str, baseline: float | None = None, note: str = "") -> None:
    ratio = f"  x{value / baseline:5.1f} of raw {baseline:7.2f} {unit}" if baseline else ""
    print(f"  {name:<46} {value:9.2f} {unit}{ratio}  {note}")


def measure(store_dir: Path, facts: dict[str, Any], runs: int) -> dict[str, float]:
    out: dict[str, float] = {}
    store = Store(store_dir)
    raw = apsw.Connection(str(store_dir / "chat.db"), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        print("chat:session:list  folder + tag filter, page of 50 (pinned first, total)")
        combos = [("folder-3", ["tag-1"]), ("folder-7", ["tag-0", "tag-2"]), ("folder-11", ["tag-30"])]
        for folder, tags in combos:
            flt = SessionFilter(folder=folder, tags=tags, limit=50)
            t, res = median_ms(lambda: store.sessions.query(flt), runs)
            base, _ = median_ms(
                lambda: raw.execute(
                    "SELECT * FROM sessions_v2 WHERE folder = ? ORDER BY is_pinned DESC,"
                    " updated_at DESC LIMIT 50", (folder,)
                ).fetchall(),
                runs,
            )
            row(f"{folder} {'+'.join(tags)} (total {res.total})", t, "ms", base,
                "raw = folder-indexed page without the tag filter")
            out[f"list {folder} {'+'.join(tags)}"] = t
        for label, flt in (
            ("tag-1 only", SessionFilter(tags=["tag-1"], limit=50)),
            ("tag-30 only", SessionFilter(tags=["tag-30"], limit=50)),
            ("title/summary search 'function'", SessionFilter(search="function", limit=50)),
            ("not archived, by last_message_at", SessionFilter(is_archived=False, sort_by="last_message_at")),
        ):
            t, res = median_ms(lambda: store.sessions.query(flt), runs)
            row(f"{label} (total {res.total})", t, "ms")
        flt = SessionFilter(limit=50)
        t, res = median_ms(lambda: store.sessions.query(flt), runs)
        row(f"no filter (total {res.total})", t, "ms")
        out["list unfiltered"] = t

        print("chat:messages:search  top 20")
        n_docs = raw.execute("SELECT count(*) FROM search_docs").fetchall()[0][0]
        for label, query in (
            ("common zh", "问题"),
            ("common zh 3-char", "服务器"),
            ("rare zh", RARE_ZH),
            ("common en", "function"),
            ("rare en", RARE_EN),
            ("very common en (stopword)", "the"),
            ("mixed zh+en", "python 问题"),
        ):
            expr = fts.build_match(fts.parse_query(query))
            df = raw.execute(
                "SELECT count(*) FROM messages_fts WHERE messages_fts MATCH ?", (expr,)
            ).fetchall()[0][0]
            t, res = median_ms(lambda: store.search.messages(query, SearchOptions(limit=20)), runs)
            # Baseline: the raw walk over the same window of newest matches (bare rowids,
            # no scoring): what the ranking costs on top of FTS5 itself.
            base, _ = median_ms(
                lambda: raw.execute(
                    "SELECT rowid FROM messages_fts WHERE messages_fts MATCH ?"
                    " ORDER BY rowid DESC LIMIT ?",
                    (expr, SEARCH_WINDOW),
                ).fetchall(),
                runs,
            )
            full, _ = median_ms(
                lambda: raw.execute(
                    "SELECT rowid FROM messages_fts WHERE messages_fts MATCH ? ORDER BY rank LIMIT 20",
                    (expr,),
                ).fetchall(),
                max(3, runs // 5),
            )
            row(f"{label} {query!r} ({df} docs = {100 * df / n_docs:.2f}%)", t, "ms", base,
                f"{len(res)} results; FTS5 built-in bm25 over all matches: {full:.1f} ms")
            out[f"search {label}"] = t
        sid_scope = facts["long_session"]
        t, res = median_ms(
            lambda: store.search.messages("function", SearchOptions(session_id=sid_scope)), runs
        )
        row("'function' scoped to one session", t, "ms", note=f"{len(res)} results")
        out["search scoped"] = t
        t, res = median_ms(
            lambda: store.search.messages("问题", SearchOptions(include_archived=False)), runs
        )
        row("'问题' excluding archived sessions", t, "ms", note=f"{len(res)} results")
        out["search not archived"] = t
        t, res = median_ms(
            lambda: store.search.messages(
                "function", SearchOptions(role="assistant", date_range=DateRange(
                    from_=1_700_000_000_000, to=1_700_000_000_000 + 90 * 86_400_000))),
            runs,
        )
        row("'function' by assistants in a 90-day range", t, "ms", note=f"{len(res)} results")
        out["search dated"] = t

        print(f"chat:messages:get  {LONG_BRANCH}-message branch")
        long_sid = facts["long_session"]
        t, res = median_ms(lambda: store.messages.query(long_sid), runs)
        base, _ = median_ms(
            lambda: raw.execute(
                "SELECT * FROM messages_v2 WHERE session_id = ? ORDER BY created_at", (long_sid,)
            ).fetchall(),
            runs,
        )
        row(f"active branch ({len(res)} messages)", t, "ms", base)
        out["messages get 2000"] = t
        t, res = median_ms(
            lambda: store.messages.query(long_sid, MessageQueryOptions(limit=50)), runs
        )
        row(f"last 50 of it ({len(res)} messages)", t, "ms")
        t, res = median_ms(lambda: store.messages.tree(long_sid), max(5, runs // 4))
        row("chat:messages:tree of that session", t, "ms")

        print("append_message  one transaction each")
        n = 2000
        target = store.sessions.create(__import__("protocol").CreateSessionOptions(title="bench"))
        t0 = time.perf_counter()
        for i in range(n):
            store.messages.append(
                target.id, role="user" if i % 2 == 0 else "assistant",
                text_content=f"benchmark message {i} 这是一条测试消息，包含中文和 English words.",
            )
        api_rate = n / (time.perf_counter() - t0)
        wconn = apsw.Connection(str(store_dir / "chat.db"))
        wconn.execute("PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON")
        t0 = time.perf_counter()
        for i in range(n):
            with wconn:
                wconn.execute(
                    "INSERT INTO messages_v2(id, session_id, role, text_content, created_at, updated_at)"
                    " VALUES (?, ?, 'user', ?, ?, ?)",
                    (new_id(), target.id, f"raw message {i}", i, i),
                )
        raw_rate = n / (time.perf_counter() - t0)
        wconn.close()
        print(f"  {'append_message (row + counters + FTS)':<46} {api_rate:9.0f} msg/s"
              f"  x{raw_rate / api_rate:5.1f} slower than raw single-row INSERT {raw_rate:7.0f} msg/s")
        out["append rate"] = api_rate
        m = store.messages.append(target.id, role="assistant", status="streaming")
        t0 = time.perf_counter()
        for i in range(n):
            store.messages.update_partial(m.id, text_content="x" * (i % 500), parts=None, seq=i)
        part_rate = n / (time.perf_counter() - t0)
        print(f"  {'update_partial (streaming flush)':<46} {part_rate:9.0f} upd/s")
        out["update_partial rate"] = part_rate
    finally:
        raw.close()
        store.close()
    return out


def measure_fold_migration(store_dir: Path, facts: dict[str, Any]) -> None:
    """Open the store with ``m_fts_fold`` pending (as the first start of the version that
    brings it), against opening it at the current version."""
    from sidecar.store import migrations

    print("migration m_fts_fold  (re-index every message, chunk and memory)")
    conn = apsw.Connection(str(store_dir / "chat.db"))
    conn.execute(f"PRAGMA user_version = {migrations.MIGRATIONS.index(migrations.m_fts_fold)}")
    conn.close()
    t0 = time.perf_counter()
    Store(store_dir).close()
    migrated = time.perf_counter() - t0
    t0 = time.perf_counter()
    Store(store_dir).close()
    current = time.perf_counter() - t0
    row(f"open with the migration pending ({facts['messages']} messages)", migrated * 1000, "ms", current * 1000,
        f"raw = opening it current; {facts['messages'] / migrated:,.0f} messages/s")


def measure_subprocess(store_dir: Path, facts: dict[str, Any], runs: int) -> None:
    """Round trips through the real sidecar process (NDJSON over pipes)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "sidecar", "--data-dir", str(store_dir), "--log-level", "WARNING"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=ROOT,
    )
    assert proc.stdin and proc.stdout
    next_id = 0

    def call(method: str, params: Any) -> Any:
        nonlocal next_id
        next_id += 1
        proc.stdin.write(json.dumps({"jsonrpc": "2.0", "id": next_id, "method": method,
                                     "params": params}).encode() + b"\n")
        proc.stdin.flush()
        while True:
            msg = json.loads(proc.stdout.readline())
            if msg.get("id") == next_id:
                if "error" in msg:
                    raise RuntimeError(msg["error"])
                return msg["result"]

    try:
        call("sidecar:initialize", {})
        print("through the sidecar subprocess (request -> response over pipes)")
        t, res = median_ms(lambda: call("chat:session:list", {"folder": "folder-3", "tags": ["tag-1"], "limit": 50}), runs)
        row(f"chat:session:list folder-3 + tag-1 (total {res['total']})", t, "ms")
        for query in ("问题", RARE_ZH, "function", RARE_EN):
            t, res = median_ms(lambda: call("chat:messages:search", {"query": query, "options": {"limit": 20}}), runs)
            row(f"chat:messages:search {query!r}", t, "ms", note=f"{len(res)} results")
        t, res = median_ms(lambda: call("chat:messages:get", {"sessionId": facts["long_session"]}), runs)
        line = json.dumps({"jsonrpc": "2.0", "id": 1, "result": res}, ensure_ascii=False).encode()
        decode, _ = median_ms(lambda: json.loads(line), runs)
        row(f"chat:messages:get ({len(res)} messages, {len(line) / 2**20:.1f} MiB)", t, "ms",
            note=f"of which this client's json.loads: {decode:.1f} ms")
        print(f"  sidecar RSS after these requests: {rss_mib(proc.pid):.0f} MiB")
        call("sidecar:shutdown", {})
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of 100k sessions / 1M messages")
    ap.add_argument("--data-dir", type=Path, help="where to build the database (default: a new /tmp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the data dir afterwards")
    ap.add_argument("--reuse", action="store_true", help="measure an existing --data-dir (no generation)")
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--no-subprocess", action="store_true")
    ap.add_argument("--no-migration", action="store_true", help="skip the re-index migration's figure")
    args = ap.parse_args()
    data_dir = args.data_dir or Path(tempfile.mkdtemp(prefix="bench-store-", dir="/tmp"))
    n_sessions = max(2, int(FULL_SESSIONS * args.scale))
    n_messages = max(LONG_BRANCH + n_sessions, int(FULL_MESSAGES * args.scale))
    facts_file = data_dir / "bench-facts.json"
    try:
        if args.reuse and facts_file.exists():
            facts = json.loads(facts_file.read_text())
            print(f"reusing {data_dir}: {facts['sessions']} sessions, {facts['messages']} messages")
        else:
            if data_dir.exists():
                shutil.rmtree(data_dir)
            print(f"generating {n_sessions} sessions / {n_messages} messages in {data_dir} ...")
            t0 = time.perf_counter()
            facts = generate(data_dir, n_sessions, n_messages)
            facts_file.write_text(json.dumps(facts))
            print(f"  generated in {time.perf_counter() - t0:.0f} s")
        size = sum(p.stat().st_size for p in data_dir.glob("chat.db*"))
        print(f"  database size {size / 2**20:.0f} MiB ({size / facts['messages']:.0f} bytes/message)")
        measure(data_dir, facts, args.runs)
        print(f"  this process: RSS now {rss_mib():.0f} MiB, peak "
              f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB (includes generation)")
        if not args.no_migration:
            measure_fold_migration(data_dir, facts)
        if not args.no_subprocess:
            measure_subprocess(data_dir, facts, max(10, args.runs // 2))
    finally:
        if not args.keep:
            shutil.rmtree(data_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
