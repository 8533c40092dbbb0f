// The compiled client (protocol/generated/client.js) against the real sidecar and the
// scripted provider, plus its failure paths against a misbehaving peer (fake-sidecar.mjs).
// Run by tests/test_ts_client.py, which starts the scripted provider and sets:
//   SIDECAR_COMMAND  the sidecar's executable (a Python interpreter, or the bundle's launcher)
//   SIDECAR_ARGS     JSON array of its arguments (["-m", "sidecar"] for an interpreter)
//   PROVIDER_URL     the scripted provider's origin (http://127.0.0.1:PORT)
//   TEST_TMP         a scratch directory
// Every wait is bounded (WAIT_MS); nothing asserts timing.
import assert from "node:assert/strict";
import { mkdtempSync } from "node:fs";
import * as path from "node:path";
import { describe, it } from "node:test";
import { fileURLToPath } from "node:url";

import {
  ClientErrorCode,
  ErrorCode,
  PROTOCOL_VERSION,
  SidecarClient,
  SidecarError,
  createSidecar,
  fromIpcError,
  toIpcError,
} from "../../../protocol/generated/client.js";

const WAIT_MS = 60_000;
const here = path.dirname(fileURLToPath(import.meta.url));
const FAKE = path.join(here, "fake-sidecar.mjs");
const COMMAND = process.env.SIDECAR_COMMAND;
const ARGS = JSON.parse(process.env.SIDECAR_ARGS ?? "[]");
const PROVIDER_URL = process.env.PROVIDER_URL;
const TMP = process.env.TEST_TMP;
assert.ok(COMMAND && PROVIDER_URL && TMP, "run through tests/test_ts_client.py (SIDECAR_COMMAND, PROVIDER_URL, TEST_TMP)");

function dataDir() {
  return mkdtempSync(path.join(TMP, "data-"));
}

const logs = [];
function real(extra = {}) {
  return createSidecar({
    command: COMMAND,
    args: ARGS,
    dataDir: dataDir(),
    logLevel: "INFO",
    timeoutMs: WAIT_MS,
    startTimeoutMs: WAIT_MS,
    onLog: (line) => logs.push(line),
    clientInfo: { name: "node-test", version: "1" },
    ...extra,
  });
}

function options(extra = {}) {
  return {
    command: COMMAND,
    args: ARGS,
    dataDir: dataDir(),
    logLevel: "INFO",
    timeoutMs: WAIT_MS,
    startTimeoutMs: WAIT_MS,
    onLog: (line) => logs.push(line),
    ...extra,
  };
}

/** `promise`, or a rejection naming `what` after WAIT_MS (a stream that never ends fails here). */
function within(promise, what) {
  let timer;
  const late = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: no end within ${WAIT_MS} ms`)), WAIT_MS);
  });
  return Promise.race([promise, late]).finally(() => clearTimeout(timer));
}

/** chat:send, then its final event (seen through on(), not stream()). */
async function sendAndWait(client, sessionId, content) {
  let off;
  const done = new Promise((resolve) => {
    off = client.on("chat:stream", (event) => {
      if (["stream_end", "error", "aborted"].includes(event.type)) resolve(event);
    });
  });
  const { messageId } = await client.call("chat:send", { sessionId, input: { content } });
  for (;;) {
    const end = await within(done, "the reply");
    if (end.messageId === messageId) break;
  }
  off();
  return messageId;
}

function fake(env = {}) {
  return createSidecar({ command: process.execPath, args: [FAKE], env, timeoutMs: WAIT_MS, onLog: (line) => logs.push(line) });
}

async function script(replies) {
  const response = await fetch(`${PROVIDER_URL}/_script`, { method: "POST", body: JSON.stringify({ replies }) });
  assert.equal(response.status, 200);
}

async function configure(client) {
  const provider = await client.call("provider:upsert", {
    name: "Scripted",
    type: "openai-compat",
    baseUrl: `${PROVIDER_URL}/v1`,
    models: [{ id: "scripted-1", contextWindow: 32000 }],
  });
  await client.call("provider:setDefault", { providerId: provider.id, modelId: "scripted-1" });
  await client.call("settings:update", { generateTitles: false });
  return client.call("chat:session:create", { title: "From Node" });
}

/** Resolves with the first payload of `event` that matches, within WAIT_MS. */
function next(client, event, predicate = () => true) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      off();
      reject(new Error(`no ${event} within ${WAIT_MS} ms`));
    }, WAIT_MS);
    const off = client.on(event, (payload) => {
      if (!predicate(payload)) return;
      clearTimeout(timer);
      off();
      resolve(payload);
    });
  });
}

async function collect(iterator) {
  const events = [];
  for await (const event of iterator) events.push(event);
  return events;
}

function assertSeqs(events) {
  assert.deepEqual(
    events.map((e) => e.seq),
    events.map((_, i) => i + 1),
  );
}

describe("the generated client against the real sidecar", () => {
  it("handshakes, streams a reply from the scripted provider and quits", async () => {
    const client = await real();
    try {
      assert.equal(client.info.protocolVersion, PROTOCOL_VERSION);
      assert.ok(client.info.capabilities.implemented.includes("chat:send"));
      const session = await configure(client);
      assert.equal(session.title, "From Node");
      assert.deepEqual(session.tags, []);
      assert.equal(session.isPinned, false);

      const updated = next(client, "chat:session:updated", (s) => s.id === session.id);
      const { messageId, userMessageId } = await client.call("chat:send", {
        sessionId: session.id,
        input: { content: "Hello from Node" },
      });
      const events = await collect(client.stream(messageId));
      assert.equal(events[0].type, "stream_start");
      assert.equal(events.at(-1).type, "stream_end");
      assertSeqs(events);
      const text = events.filter((e) => e.type === "text_delta").map((e) => e.text).join("");
      assert.match(text, /You wrote: “Hello from Node”/);

      const messages = await client.call("chat:messages:get", { sessionId: session.id });
      assert.deepEqual(messages.map((m) => m.id), [userMessageId, messageId]);
      assert.equal(messages[1].status, "completed");
      assert.equal(messages[1].textContent, text);
      assert.equal((await updated).messageCount, 2);
    } finally {
      const exit = await client.close();
      assert.equal(exit.code, 0, exit.stderrTail);
      assert.equal(exit.expected, true);
    }
    await assert.rejects(client.call("provider:list"), (e) => e instanceof SidecarError && e.code === ClientErrorCode.NOT_RUNNING);
  });

  it("keeps code, message and data of errors, also through the IPC encoding", async () => {
    const client = await real();
    try {
      const missing = await client.call("chat:session:get", { id: "no-such-session" }).catch((e) => e);
      assert.ok(missing instanceof SidecarError);
      assert.equal(missing.code, ErrorCode.NOT_FOUND);

      // what ipcRenderer.invoke rejects with when the handler threw toIpcError(missing)
      const viaElectron = new Error(`Error invoking remote method 'sidecar:call': ${String(toIpcError(missing))}`);
      const decoded = fromIpcError(viaElectron);
      assert.equal(decoded.code, ErrorCode.NOT_FOUND);
      assert.equal(decoded.message, missing.message);
      assert.equal(fromIpcError(new Error("unrelated")), null);

      const session = await configure(client);
      const refused = await client
        .call("chat:send", { sessionId: session.id, input: { content: [{ type: "tool_use", id: "t", name: "x", input: {} }] } })
        .catch((e) => e);
      assert.equal(refused.code, ErrorCode.INVALID_PARAMS);
      assert.match(refused.message, /input\.content\[0\]/);
      const roundTrip = fromIpcError(new Error(String(toIpcError(new SidecarError(ErrorCode.BAD_STATE, "m", { expected: 1, got: 2 })))));
      assert.deepEqual(roundTrip.data, { expected: 1, got: 2 });
    } finally {
      await client.close();
    }
  });

  it("ends a stream with the aborted event of chat:abort", async () => {
    const client = await real();
    try {
      const session = await configure(client);
      await script([{ text: "slow ", repeat: 400, delay_ms: 20 }]);
      const { messageId } = await client.call("chat:send", { sessionId: session.id, input: { content: "go" } });
      const events = [];
      for await (const event of client.stream(messageId)) {
        events.push(event);
        if (event.type === "text_delta" && events.filter((e) => e.type === "text_delta").length === 1) {
          assert.deepEqual(await client.call("chat:abort", { sessionId: session.id }), { success: true });
        }
      }
      assert.equal(events.at(-1).type, "aborted");
      assertSeqs(events);
    } finally {
      await client.close();
    }
  });

  it("replays the buffered events of a reply that ended before stream() was called", async () => {
    const client = await real();
    try {
      const session = await configure(client);
      let ended;
      const done = new Promise((resolve) => {
        ended = client.on("chat:stream", (event) => {
          if (event.type === "stream_end") resolve(event);
        });
      });
      const { messageId } = await client.call("chat:send", { sessionId: session.id, input: { content: "buffer me" } });
      const end = await done;
      ended();
      assert.equal(end.messageId, messageId);
      const events = await collect(client.stream(messageId));
      assert.equal(events[0].type, "stream_start");
      assert.equal(events.at(-1).seq, end.seq);
      assertSeqs(events);
    } finally {
      await client.close();
    }
  });

  it("rejects a stream of a reply that ended and is no longer kept, and of an unknown message", async () => {
    const dir = dataDir();
    const client = await real({ dataDir: dir, streamBuffer: { messages: 1, events: 5000 } });
    let session, first;
    try {
      session = await configure(client);
      first = await sendAndWait(client, session.id, "one");
      await sendAndWait(client, session.id, "two"); // keeps only its own events now
      const error = await within(collect(client.stream(first)), "stream of an ended reply").catch((e) => e);
      assert.ok(error instanceof SidecarError, String(error));
      assert.equal(error.code, ClientErrorCode.STREAM_UNAVAILABLE);
      assert.equal(error.data.reason, "ended");
      assert.equal(error.data.sessionId, session.id);
      assert.equal(error.data.final.type, "stream_end");
    } finally {
      await client.close();
    }
    // a new process: nothing of the message seen; the stored row says it ended
    const again = await real({ dataDir: dir });
    try {
      const ended = await within(collect(again.stream(first, { sessionId: session.id })), "stream after a restart").catch((e) => e);
      assert.equal(ended.code, ClientErrorCode.STREAM_UNAVAILABLE, String(ended));
      assert.equal(ended.data.final, null);
      const unknown = await within(collect(again.stream(first)), "stream without a session").catch((e) => e);
      assert.equal(unknown.code, ErrorCode.NOT_FOUND, String(unknown));
      const missing = await within(collect(again.stream("no-such-message", { sessionId: session.id })), "unknown id").catch((e) => e);
      assert.equal(missing.code, ErrorCode.NOT_FOUND, String(missing));
      // the process keeps serving
      assert.equal((await again.call("chat:session:list")).total, 1);
    } finally {
      await again.close();
    }
  });

  it("gives every event to each of two streams of the same message", async () => {
    const client = await real();
    try {
      const session = await configure(client);
      await script([{ text: "part ", repeat: 20, delay_ms: 10 }]);
      const started = next(client, "chat:stream", (e) => e.type === "stream_start");
      const { messageId } = await client.call("chat:send", { sessionId: session.id, input: { content: "twice" } });
      await started; // kept events exist before either stream asks
      const [a, b] = await within(Promise.all([collect(client.stream(messageId)), collect(client.stream(messageId))]), "two streams");
      assertSeqs(a);
      assertSeqs(b);
      assert.deepEqual(b, a);
      assert.equal(a.at(-1).type, "stream_end");
      // and a third one after the end replays them all
      assert.deepEqual(await within(collect(client.stream(messageId)), "a third stream"), a);
    } finally {
      await client.close();
    }
  });

  it("sends calls made during the handshake right behind it, in order", async () => {
    const client = new SidecarClient(options());
    try {
      const started = client.start();
      const listed = client.call("chat:session:list");
      const settings = client.call("settings:get");
      const [info, list] = await Promise.all([started, listed]);
      assert.equal(info.protocolVersion, PROTOCOL_VERSION);
      assert.deepEqual(list, { sessions: [], total: 0 });
      assert.equal(typeof (await settings).generateTitles, "boolean");
      await assert.rejects(new SidecarClient(options()).call("chat:session:list"), (e) => e.code === ClientErrorCode.NOT_RUNNING);
    } finally {
      await client.close();
    }
  });

  it("fails a stream when the sidecar dies, and restart() brings it back with its data", async () => {
    const client = await real();
    try {
      const session = await configure(client);
      await script([{ text: "stuck", fault: "stall", stall_s: 120 }]);
      const { messageId } = await client.call("chat:send", { sessionId: session.id, input: { content: "hang" } });
      const exited = next(client, "exit");
      const oldPid = client.pid;
      const iterator = client.stream(messageId);
      const first = await iterator.next();
      assert.equal(first.value.type, "stream_start");
      process.kill(client.pid, "SIGKILL");
      await assert.rejects(
        (async () => {
          for await (const _ of iterator); // the rest of the stream
        })(),
        (e) => e instanceof SidecarError && e.code === ClientErrorCode.PROCESS_EXITED,
      );
      const exit = await exited;
      assert.equal(exit.signal, "SIGKILL");
      assert.equal(exit.expected, false);
      assert.equal(client.running, false);

      const info = await client.restart();
      assert.equal(info.protocolVersion, PROTOCOL_VERSION);
      assert.notEqual(client.pid, oldPid);
      const messages = await client.call("chat:messages:get", { sessionId: session.id });
      assert.equal(messages.find((m) => m.id === messageId).status, "aborted");
    } finally {
      await client.close();
    }
  });
});

describe("the generated client against a misbehaving peer", () => {
  it("skips lines that are not JSON-RPC and keeps answering", async () => {
    const client = await fake();
    try {
      const problems = [];
      client.on("protocol-error", (problem) => problems.push(problem.reason));
      assert.deepEqual(await client.call("test:garbage"), { fine: true });
      assert.equal(problems.length, 5, problems.join("; "));
      assert.match(problems[0], /not JSON/);
    } finally {
      await client.close();
    }
  });

  it("times a call out and sends $/cancelRequest for it", async () => {
    const client = await fake();
    try {
      const cancelled = next(client, "test:cancelled");
      const error = await client.call("test:hang", {}, { timeoutMs: 100 }).catch((e) => e);
      assert.equal(error.code, ClientErrorCode.TIMEOUT);
      assert.deepEqual(error.data, { method: "test:hang", timeoutMs: 100 });
      assert.equal(typeof (await cancelled).id, "number");
    } finally {
      await client.close();
    }
  });

  it("cancels a call on its AbortSignal", async () => {
    const client = await fake();
    try {
      const controller = new AbortController();
      const cancelled = next(client, "test:cancelled");
      const pending = client.call("test:hang", {}, { signal: controller.signal });
      controller.abort();
      await assert.rejects(pending, (e) => e.code === ErrorCode.REQUEST_CANCELLED);
      await cancelled;
      await assert.rejects(client.call("test:hang", {}, { signal: controller.signal }), (e) => e.code === ErrorCode.REQUEST_CANCELLED);
    } finally {
      await client.close();
    }
  });

  it("rejects every pending call when the process exits", async () => {
    const client = await fake();
    const hanging = [client.call("test:hang"), client.call("test:hang")];
    client.call("test:exit").catch(() => undefined);
    for (const call of hanging) {
      await assert.rejects(call, (e) => e.code === ClientErrorCode.PROCESS_EXITED && e.data.code === 3);
    }
    const exit = await client.waitForExit();
    assert.equal(exit.code, 3);
    assert.equal(exit.expected, false);
  });

  it("kills a process that ignores the shutdown", async () => {
    const client = await fake({ FAKE_STUBBORN: "1" });
    const exit = await client.close({ timeoutMs: 300 });
    assert.equal(exit.signal, "SIGKILL");
    assert.equal(exit.expected, true);
    assert.ok(logs.some((line) => line.includes("sending SIGKILL")));
  });

  it("refuses a sidecar of another protocol version", async () => {
    const error = await fake({ FAKE_PROTOCOL_VERSION: "99" }).catch((e) => e);
    assert.ok(error instanceof SidecarError);
    assert.equal(error.code, ErrorCode.BAD_STATE);
    assert.deepEqual(error.data, { expected: PROTOCOL_VERSION, got: 99 });
  });

  it("reports a command that cannot be started", async () => {
    const error = await createSidecar({ command: path.join(TMP, "no-such-sidecar") }).catch((e) => e);
    assert.ok(error instanceof SidecarError);
    assert.equal(error.code, ClientErrorCode.PROCESS_EXITED);
    assert.match(error.message, /ENOENT/);
  });
});
