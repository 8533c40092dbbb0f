/**
 * The main-process client of chat-sidecar: spawn it, call it, listen to it, quit it.
 *
 *     const sidecar = await createSidecar({ command, args, dataDir, onLog });
 *     const session = await sidecar.call("chat:session:create", { title: "Hello" });
 *     const { messageId } = await sidecar.call("chat:send", { sessionId: session.id, input: { content: "Hi" } });
 *     for await (const event of sidecar.stream(messageId)) { ... }   // ends after stream_end/error/aborted
 *     await sidecar.close();                                          // the quit sequence
 *
 * Node only (child_process), no dependencies. What must stay true:
 * - every call settles: with its result, its SidecarError, a TIMEOUT (after which
 *   `$/cancelRequest` is sent), REQUEST_CANCELLED when its AbortSignal fires, or
 *   PROCESS_EXITED when the sidecar exits first;
 * - a line of stdout that is not a JSON-RPC message is reported (`protocol-error`, onLog)
 *   and skipped; it never throws out of the reader;
 * - `close()` always ends the process: `sidecar:shutdown`, stdin closed, a bounded wait,
 *   then SIGKILL;
 * - a listener that throws is reported through onLog and does not stop the others.
 */

import { spawn, type ChildProcessWithoutNullStreams } from "node:child_process";

import { ClientErrorCode, SidecarError } from "./errors.js";
import { ErrorCode, PROTOCOL_VERSION, isFinalEvent } from "./protocol.js";
import type {
  ChatStreamEvent,
  ClientInfo,
  InitializeResult,
  MessageStatus,
  MethodName,
  MethodParams,
  MethodResult,
  Notifications,
  ServerNotificationName,
} from "./protocol.js";
import { MessageStreams, unavailable, type StreamSubscriber } from "./streams.js";

export { ClientErrorCode, IPC_ERROR_MARKER, SidecarError, fromIpcError, ipcHandler, isSidecarError, toIpcError } from "./errors.js";
export type * from "./errors.js";
export { ErrorCode, FINAL_EVENT_TYPES, METHOD_NAMES, PROTOCOL_VERSION, SERVER_NOTIFICATIONS, isFinalEvent } from "./protocol.js";

export type LogLevel = "DEBUG" | "INFO" | "WARNING" | "ERROR" | "CRITICAL";

export interface SidecarOptions {
  /**
   * The executable: the bundle's launcher (`<resources>/chat-sidecar/chat-sidecar`, `.exe`
   * on Windows) or a Python interpreter (then `args: ["-m", "sidecar"]`). Not looked up
   * as `chat-sidecar` on PATH: pass a path.
   */
  command: string;
  /** Arguments before the ones the client adds (`--data-dir`, `--log-level`). */
  args?: readonly string[];
  /** Extra environment variables, on top of this process's environment (`undefined` removes one). */
  env?: Readonly<Record<string, string | undefined>>;
  /** `--data-dir`: where chat.db and attachments live (default: the sidecar's platform default). */
  dataDir?: string;
  /** Working directory of the process (default: this process's). */
  cwd?: string;
  /** Default per-call timeout in ms (default 30000); 0 waits forever. */
  timeoutMs?: number;
  /** Timeout of the handshake in ms (default 30000: a cold start from a slow disk). */
  startTimeoutMs?: number;
  /** How long `close()` waits for a clean exit before SIGKILL, in ms (default 5000). */
  shutdownTimeoutMs?: number;
  /** `--log-level` (the sidecar's default is WARNING). */
  logLevel?: LogLevel;
  /** Each line the sidecar writes to stderr (its log), and the client's own reports. */
  onLog?: (line: string) => void;
  /** Sent in `sidecar:initialize`. */
  clientInfo?: ClientInfo;
  /**
   * The events of the most recent `messages` messages are kept, at most `events` each
   * (default 16 and 5000), so `stream(id)` called after `chat:send` answered, or a second
   * `stream(id)` of the same message, still gets every event from the first.
   */
  streamBuffer?: { messages: number; events: number };
  /** Longest stdout line accepted, in characters (default 256 Mi); longer ones are dropped. */
  maxLineLength?: number;
}

export interface CallOptions {
  /** Overrides the client's `timeoutMs` for this call; 0 waits forever. */
  timeoutMs?: number;
  /** Aborting rejects the call with REQUEST_CANCELLED and sends `$/cancelRequest`. */
  signal?: AbortSignal;
}

/** `call`'s arguments: params may be left out when every field of them is optional. */
export type CallArgs<M extends MethodName> = {} extends MethodParams<M>
  ? [params?: MethodParams<M>, options?: CallOptions]
  : [params: MethodParams<M>, options?: CallOptions];

export interface SidecarExit {
  /** The exit code, or null when a signal ended the process (or it never started). */
  code: number | null;
  signal: string | null;
  /** True when `close()` (or `restart()`) ended it. */
  expected: boolean;
  /** Why the process could not be started or watched (e.g. `spawn ENOENT`). */
  error?: string;
  /** The last lines of its stderr. */
  stderrTail: string;
}

export interface ProtocolErrorInfo {
  /** The offending line (cut to 1000 characters). */
  line: string;
  reason: string;
}

/** What `on()` can listen to: the sidecar's notifications, its exit, and unreadable lines. */
export type SidecarEvents = { [N in ServerNotificationName]: Notifications[N]["params"] } & {
  exit: SidecarExit;
  "protocol-error": ProtocolErrorInfo;
};
export type SidecarEventName = keyof SidecarEvents;

export interface StreamOptions {
  /** Aborting ends the iteration with a REQUEST_CANCELLED SidecarError (the reply goes on). */
  signal?: AbortSignal;
  /**
   * The message's session, for a message this client has seen nothing of (no event, no
   * `chat:send`/`chat:regenerate`/... answer naming it): the stored message is then
   * checked, and a reply that already ended rejects with STREAM_UNAVAILABLE.
   */
  sessionId?: string;
}

const ENDED: readonly MessageStatus[] = ["completed", "error", "aborted"];

const DEFAULT_TIMEOUT_MS = 30_000;
const DEFAULT_SHUTDOWN_MS = 5_000;
const KILL_WAIT_MS = 5_000;
const EXIT_FLUSH_MS = 2_000;
const STDERR_TAIL = 8_192;
const DEFAULT_MAX_LINE = 256 * 1024 * 1024;

/** Spawn the sidecar, complete the handshake, and return the client. */
export async function createSidecar(options: SidecarOptions): Promise<SidecarClient> {
  const client = new SidecarClient(options);
  await client.start();
  return client;
}

type Listener = (payload: never) => void;

export class SidecarClient {
  #options: SidecarOptions;
  readonly #listeners = new Map<string, Set<Listener>>();
  #connection: Connection | null = null;
  #info: InitializeResult | null = null;
  #lastExit: SidecarExit | null = null;
  #starting: Promise<InitializeResult> | null = null;

  constructor(options: SidecarOptions) {
    this.#options = options;
  }

  /** The handshake's answer (server info, capabilities, data dir) of the running process. */
  get info(): InitializeResult | null {
    return this.#info;
  }

  /** The process id while it runs. */
  get pid(): number | undefined {
    return this.#connection?.pid;
  }

  /** True between a completed handshake and the exit. */
  get running(): boolean {
    return this.#connection !== null && this.#connection.state === "running";
  }

  /** How the last process ended (null while it runs or before the first exit). */
  get lastExit(): SidecarExit | null {
    return this.#lastExit;
  }

  /** Spawn the process and complete the handshake (createSidecar does this). */
  start(): Promise<InitializeResult> {
    if (this.#starting) return this.#starting;
    if (this.#connection && this.#connection.state !== "exited") {
      return Promise.reject(new SidecarError(ClientErrorCode.NOT_RUNNING, "the sidecar is already started"));
    }
    this.#starting = this.#start().finally(() => {
      this.#starting = null;
    });
    return this.#starting;
  }

  async #start(): Promise<InitializeResult> {
    this.#info = null;
    const connection = new Connection(this.#options, (name, payload) => this.#emit(name, payload), (exit) => {
      this.#lastExit = exit;
      if (this.#connection === connection) this.#info = null;
    });
    this.#connection = connection;
    try {
      const info = await connection.initialize();
      this.#info = info;
      return info;
    } catch (error) {
      await connection.close(this.#options.shutdownTimeoutMs ?? DEFAULT_SHUTDOWN_MS);
      throw error;
    }
  }

  /**
   * Send a request; resolves with its result or rejects with a SidecarError. A call made
   * while the handshake is under way (after `start()`, before it resolved) is written
   * right behind `sidecar:initialize`, in order: the sidecar answers a handshake and a
   * first `chat:session:list` that wait in its input before anything else loads.
   */
  call<M extends MethodName>(method: M, ...args: CallArgs<M>): Promise<MethodResult<M>> {
    const [params, options] = args as [MethodParams<M> | undefined, CallOptions | undefined];
    const connection = this.#connection;
    if (!connection || (connection.state !== "running" && connection.state !== "starting")) {
      return Promise.reject(
        new SidecarError(ClientErrorCode.NOT_RUNNING, `cannot call ${method}: the sidecar is not running`),
      );
    }
    return connection.call(method, params ?? {}, options ?? {}, ["starting", "running"]) as Promise<MethodResult<M>>;
  }

  /** Listen to a notification, the exit or unreadable lines; returns the function that stops listening. */
  on<E extends SidecarEventName>(event: E, listener: (payload: SidecarEvents[E]) => void): () => void {
    let set = this.#listeners.get(event);
    if (!set) {
      set = new Set();
      this.#listeners.set(event, set);
    }
    const stored = listener as Listener;
    set.add(stored);
    return () => {
      this.#listeners.get(event)?.delete(stored);
    };
  }

  /**
   * The events of one message, in order from its first, ending after its final event
   * (stream_end, error or aborted), which is yielded too; every concurrent `stream()` of
   * a message gets every event. Throws PROCESS_EXITED if the sidecar exits first,
   * STREAM_UNAVAILABLE if the reply ended before and its events are no longer kept
   * (`data`: StreamUnavailableData; read the message with `chat:messages:get`), and
   * NOT_FOUND for a message this client knows nothing of and whose stored row (with
   * `options.sessionId`) does not exist; without `sessionId` such a message is NOT_FOUND.
   */
  stream(messageId: string, options: StreamOptions = {}): AsyncIterableIterator<ChatStreamEvent> {
    const connection = this.#connection;
    if (!connection || connection.state === "exited") {
      return failedIterator(new SidecarError(ClientErrorCode.NOT_RUNNING, "the sidecar is not running"));
    }
    const queue: ChatStreamEvent[] = [];
    let failure: unknown = null;
    let wake: (() => void) | null = null;
    let ended = false;
    const subscriber: StreamSubscriber = {
      push(event) {
        ended ||= isFinalEvent(event);
        queue.push(event);
        wake?.();
      },
      fail(error) {
        failure ??= error;
        wake?.();
      },
    };
    const { outcome, unsubscribe } = connection.subscribe(messageId, subscriber);
    if (outcome === "unknown") {
      // nothing of it seen here: it may be a reply that ended before this process (or
      // never existed); the stored row says, and an answer comes after every event the
      // sidecar sent before reading it (one ordered stdout)
      const sessionId = options.sessionId;
      if (sessionId === undefined) {
        subscriber.fail(
          new SidecarError(
            ErrorCode.NOT_FOUND,
            `message ${messageId} is unknown to this client (no event or send result of it): pass { sessionId } to check the stored message`,
            { messageId },
          ),
        );
      } else {
        connection
          .call("chat:messages:get", { sessionId, options: { leafId: messageId, limit: 1 } }, {}, ["starting", "running"])
          .then((found) => {
            const message = (found as MethodResult<"chat:messages:get">)[0];
            if (message === undefined || message.id !== messageId) {
              subscriber.fail(new SidecarError(ErrorCode.NOT_FOUND, `message ${messageId} not found`, { messageId }));
            } else if (ENDED.includes(message.status) && !ended) {
              subscriber.fail(unavailable(messageId, sessionId, null, "ended"));
            }
          })
          .catch((error: unknown) => subscriber.fail(error));
      }
    }
    const signal = options.signal;
    const onAbort = (): void => subscriber.fail(cancelled(`stream of ${messageId} aborted`));
    if (signal?.aborted) onAbort();
    signal?.addEventListener("abort", onAbort, { once: true });
    async function* iterate(): AsyncGenerator<ChatStreamEvent, void, undefined> {
      try {
        for (;;) {
          while (queue.length > 0 && failure === null) {
            const event = queue.shift() as ChatStreamEvent;
            yield event;
            if (isFinalEvent(event)) return;
          }
          if (failure !== null) throw failure;
          await new Promise<void>((resolve) => {
            wake = resolve;
          });
          wake = null;
        }
      } finally {
        unsubscribe();
        signal?.removeEventListener("abort", onAbort);
      }
    }
    return iterate();
  }

  /**
   * The quit sequence: `sidecar:shutdown` (running replies are stored as aborted), close
   * stdin, wait up to `timeoutMs` (default `shutdownTimeoutMs`) for the exit, then SIGKILL.
   */
  async close(options: { timeoutMs?: number } = {}): Promise<SidecarExit> {
    const connection = this.#connection;
    if (!connection) {
      return this.#lastExit ?? { code: null, signal: null, expected: true, stderrTail: "" };
    }
    return connection.close(options.timeoutMs ?? this.#options.shutdownTimeoutMs ?? DEFAULT_SHUTDOWN_MS);
  }

  /**
   * Close the running process (if any) and start a new one, with `changes` applied to the
   * options (e.g. a new `env`); listeners stay registered.
   */
  async restart(changes: Partial<SidecarOptions> = {}): Promise<InitializeResult> {
    await this.close();
    if (this.#starting) await this.#starting.catch(() => undefined);
    this.#options = { ...this.#options, ...changes };
    return this.start();
  }

  /** Resolves when the current process has exited (at once if none runs). */
  waitForExit(): Promise<SidecarExit> {
    const connection = this.#connection;
    if (!connection) return Promise.resolve(this.#lastExit ?? { code: null, signal: null, expected: true, stderrTail: "" });
    return connection.exited;
  }

  #emit(name: string, payload: unknown): void {
    const set = this.#listeners.get(name);
    if (!set) return;
    for (const listener of [...set]) {
      try {
        (listener as (payload: unknown) => void)(payload);
      } catch (error) {
        const detail = error instanceof Error ? (error.stack ?? error.message) : String(error);
        this.#options.onLog?.(`chat-sidecar client: a listener of ${name} threw: ${detail}`);
      }
    }
  }
}

type State = "starting" | "running" | "closing" | "exited";

interface Pending {
  method: string;
  resolve(result: unknown): void;
  reject(error: SidecarError): void;
  cleanup(): void;
}

/** One spawned process: its pipes, pending calls, stream subscribers and exit. */
class Connection {
  state: State = "starting";
  readonly exited: Promise<SidecarExit>;
  readonly #options: SidecarOptions;
  readonly #emit: (name: string, payload: unknown) => void;
  readonly #onExit: (exit: SidecarExit) => void;
  readonly #child: ChildProcessWithoutNullStreams | null = null;
  readonly #pending = new Map<number, Pending>();
  readonly #streams: MessageStreams;
  readonly #maxLine: number;
  #resolveExit: (exit: SidecarExit) => void = () => undefined;
  #nextId = 1;
  #stdout = "";
  #stderr = "";
  #stderrTail = "";
  #expected = false;
  #closing: Promise<SidecarExit> | null = null;
  #exitSeen = false;
  #exitInfo: SidecarExit | null = null;

  constructor(
    options: SidecarOptions,
    emit: (name: string, payload: unknown) => void,
    onExit: (exit: SidecarExit) => void,
  ) {
    this.#options = options;
    this.#emit = emit;
    this.#onExit = onExit;
    this.#streams = new MessageStreams({
      messages: options.streamBuffer?.messages ?? 16,
      events: options.streamBuffer?.events ?? 5000,
    });
    this.#maxLine = options.maxLineLength ?? DEFAULT_MAX_LINE;
    this.exited = new Promise((resolve) => {
      this.#resolveExit = resolve;
    });
    const args = [...(options.args ?? [])];
    if (options.dataDir !== undefined) args.push("--data-dir", options.dataDir);
    if (options.logLevel !== undefined) args.push("--log-level", options.logLevel);
    let child: ChildProcessWithoutNullStreams;
    try {
      child = spawn(options.command, args, {
        stdio: ["pipe", "pipe", "pipe"],
        env: { ...process.env, ...options.env },
        windowsHide: true,
        ...(options.cwd !== undefined ? { cwd: options.cwd } : {}),
      });
    } catch (error) {
      this.#finish({ code: null, signal: null, error: describe(error) });
      return;
    }
    this.#child = child;
    child.stdin.on("error", () => undefined); // EPIPE after an exit: the exit handler reports it
    child.stdout.setEncoding("utf8");
    child.stdout.on("data", (chunk: string) => this.#onStdout(chunk));
    child.stderr.setEncoding("utf8");
    child.stderr.on("data", (chunk: string) => this.#onStderr(chunk));
    child.on("error", (error) => {
      // spawn failures (ENOENT, EACCES) come here; kill failures after an exit too
      if (this.state !== "exited" && child.pid === undefined) this.#finish({ code: null, signal: null, error: describe(error) });
      else this.#log(`chat-sidecar client: process error: ${describe(error)}`);
    });
    child.on("exit", (code, signal) => {
      this.#exitSeen = true;
      // 'close' follows once stdout is read to its end; a grandchild holding the pipe
      // open must not keep the calls waiting, hence the bound
      setTimeout(() => this.#finish({ code, signal }), EXIT_FLUSH_MS).unref();
    });
    child.on("close", (code: number | null, signal: NodeJS.Signals | null) => this.#finish({ code, signal }));
  }

  get pid(): number | undefined {
    return this.#child?.pid;
  }

  async initialize(): Promise<InitializeResult> {
    const params = {
      protocolVersion: PROTOCOL_VERSION,
      ...(this.#options.clientInfo !== undefined ? { clientInfo: this.#options.clientInfo } : {}),
    };
    const timeoutMs = this.#options.startTimeoutMs ?? DEFAULT_TIMEOUT_MS;
    const info = (await this.call("sidecar:initialize", params, { timeoutMs }, ["starting"])) as InitializeResult;
    if (info.protocolVersion !== PROTOCOL_VERSION) {
      // a sidecar from before the version check answers instead of refusing
      throw new SidecarError(
        ErrorCode.BAD_STATE,
        `protocol version mismatch: the client speaks protocol ${PROTOCOL_VERSION}, the sidecar speaks protocol ${info.protocolVersion}`,
        { expected: PROTOCOL_VERSION, got: info.protocolVersion },
      );
    }
    if (this.state === "starting") this.state = "running";
    return info;
  }

  call(method: string, params: unknown, options: CallOptions, allowed: readonly State[] = ["running"]): Promise<unknown> {
    if (this.state === "exited" || this.#child === null) return Promise.reject(this.#exitError());
    if (!allowed.includes(this.state)) {
      return Promise.reject(new SidecarError(ClientErrorCode.NOT_RUNNING, `cannot call ${method}: the sidecar is ${this.state}`));
    }
    const signal = options.signal;
    if (signal?.aborted) return Promise.reject(cancelled(`${method} was aborted before it was sent`));
    const id = this.#nextId++;
    return new Promise<unknown>((resolve, reject) => {
      const timeoutMs = options.timeoutMs ?? this.#options.timeoutMs ?? DEFAULT_TIMEOUT_MS;
      let timer: NodeJS.Timeout | null = null;
      const onAbort = (): void => this.#cancel(id, cancelled(`${method} was aborted`));
      const pending: Pending = {
        method,
        resolve: (result) => {
          this.#noteMessage(params, result);
          resolve(result);
        },
        reject,
        cleanup: () => {
          if (timer !== null) clearTimeout(timer);
          signal?.removeEventListener("abort", onAbort);
        },
      };
      this.#pending.set(id, pending);
      if (timeoutMs > 0) {
        timer = setTimeout(
          () =>
            this.#cancel(
              id,
              new SidecarError(ClientErrorCode.TIMEOUT, `${method} got no answer within ${timeoutMs} ms`, { method, timeoutMs }),
            ),
          timeoutMs,
        );
        timer.unref();
      }
      signal?.addEventListener("abort", onAbort, { once: true });
      let sent: boolean;
      try {
        sent = this.#write({ jsonrpc: "2.0", id, method, params });
      } catch (error) {
        this.#settle(id)?.reject(new SidecarError(ErrorCode.INVALID_PARAMS, `params of ${method} are not JSON: ${describe(error)}`));
        return;
      }
      if (!sent) {
        this.#settle(id)?.reject(new SidecarError(ClientErrorCode.PROCESS_EXITED, `cannot send ${method}: the sidecar's stdin is closed`));
      }
    });
  }

  subscribe(messageId: string, subscriber: StreamSubscriber): ReturnType<MessageStreams["subscribe"]> {
    if (this.state === "exited") {
      subscriber.fail(this.#exitError());
      return { outcome: "live", unsubscribe: () => undefined };
    }
    return this.#streams.subscribe(messageId, subscriber);
  }

  /** A result naming the reply it started (chat:send, chat:regenerate...) tells the session of that message. */
  #noteMessage(params: unknown, result: unknown): void {
    const messageId = (result as { messageId?: unknown } | null)?.messageId;
    const sessionId = (params as { sessionId?: unknown } | null)?.sessionId;
    if (typeof messageId === "string" && typeof sessionId === "string") this.#streams.note(messageId, sessionId);
  }

  close(timeoutMs: number): Promise<SidecarExit> {
    this.#closing ??= this.#close(timeoutMs);
    return this.#closing;
  }

  async #close(timeoutMs: number): Promise<SidecarExit> {
    this.#expected = true;
    const child = this.#child;
    if (this.state === "exited" || child === null) return this.exited;
    const deadline = Date.now() + Math.max(0, timeoutMs);
    const wasUsable = this.state === "running" || this.state === "starting";
    this.state = "closing";
    if (wasUsable && !this.#exitSeen) {
      try {
        await this.call("sidecar:shutdown", {}, { timeoutMs: Math.max(1, timeoutMs) }, ["closing"]);
      } catch {
        // no answer (hung, already exiting): the deadline and SIGKILL below still hold
      }
    }
    child.stdin.end();
    if (!(await this.#exitWithin(deadline - Date.now()))) {
      this.#log(`chat-sidecar client: no exit within ${timeoutMs} ms of shutdown, sending SIGKILL`);
      child.kill("SIGKILL");
      if (!(await this.#exitWithin(KILL_WAIT_MS))) {
        this.#finish({ code: null, signal: null, error: "the process did not exit after SIGKILL" });
      }
    }
    return this.exited;
  }

  async #exitWithin(ms: number): Promise<boolean> {
    if (this.state === "exited") return true;
    let timer: NodeJS.Timeout | null = null;
    const timedOut = new Promise<false>((resolve) => {
      timer = setTimeout(() => resolve(false), Math.max(0, ms));
    });
    const done = await Promise.race([this.exited.then(() => true as const), timedOut]);
    if (timer !== null) clearTimeout(timer);
    return done;
  }

  #write(message: unknown): boolean {
    const stdin = this.#child?.stdin;
    if (!stdin || stdin.destroyed || stdin.writableEnded) return false;
    stdin.write(JSON.stringify(message) + "\n");
    return true;
  }

  #cancel(id: number, error: SidecarError): void {
    const pending = this.#settle(id);
    if (!pending) return;
    if (this.state !== "exited") {
      this.#write({ jsonrpc: "2.0", method: "$/cancelRequest", params: { id } });
    }
    pending.reject(error);
  }

  #settle(id: number): Pending | undefined {
    const pending = this.#pending.get(id);
    if (!pending) return undefined;
    this.#pending.delete(id);
    pending.cleanup();
    return pending;
  }

  #onStdout(chunk: string): void {
    this.#stdout += chunk;
    let start = 0;
    for (;;) {
      const end = this.#stdout.indexOf("\n", start);
      if (end < 0) break;
      const line = this.#stdout.slice(start, end);
      start = end + 1;
      this.#onLine(line);
    }
    this.#stdout = this.#stdout.slice(start);
    if (this.#stdout.length > this.#maxLine) {
      this.#protocolError(this.#stdout, `a line longer than ${this.#maxLine} characters was dropped`);
      this.#stdout = "";
    }
  }

  #onLine(raw: string): void {
    const line = raw.endsWith("\r") ? raw.slice(0, -1) : raw;
    if (line.trim() === "") return;
    let message: unknown;
    try {
      message = JSON.parse(line);
    } catch (error) {
      this.#protocolError(line, `not JSON (${describe(error)})`);
      return;
    }
    if (Array.isArray(message)) {
      if (message.length === 0) this.#protocolError(line, "an empty batch");
      for (const item of message) this.#onMessage(item, line);
    } else {
      this.#onMessage(message, line);
    }
  }

  #onMessage(message: unknown, line: string): void {
    if (typeof message !== "object" || message === null || Array.isArray(message)) {
      this.#protocolError(line, "not a JSON-RPC object");
      return;
    }
    const msg = message as { jsonrpc?: unknown; id?: unknown; method?: unknown; params?: unknown; result?: unknown; error?: unknown };
    if (msg.jsonrpc !== "2.0") {
      this.#protocolError(line, "jsonrpc is not \"2.0\"");
      return;
    }
    if (typeof msg.method === "string") {
      if (msg.id !== undefined && msg.id !== null) {
        // the contract has no requests from the sidecar; answer as a JSON-RPC peer must
        this.#write({ jsonrpc: "2.0", id: msg.id, error: { code: ErrorCode.METHOD_NOT_FOUND, message: `the client does not serve ${msg.method}` } });
        return;
      }
      this.#onNotification(msg.method, msg.params, line);
      return;
    }
    if (typeof msg.id !== "number") {
      const detail = typeof msg.error === "object" && msg.error !== null ? `: ${JSON.stringify(msg.error).slice(0, 500)}` : "";
      this.#protocolError(line, msg.id === null ? `an error without a request id${detail}` : "a response to an id this client never used");
      return;
    }
    const pending = this.#settle(msg.id);
    if (!pending) {
      // a late answer to a call that timed out or was aborted is expected; any other id is not
      if (!Number.isInteger(msg.id) || msg.id < 1 || msg.id >= this.#nextId) {
        this.#protocolError(line, "a response to an id this client never sent");
      }
      return;
    }
    if (msg.error !== undefined) {
      const error = msg.error as { code?: unknown; message?: unknown; data?: unknown };
      if (typeof error !== "object" || error === null || typeof error.code !== "number" || typeof error.message !== "string") {
        pending.reject(new SidecarError(ErrorCode.INTERNAL_ERROR, `malformed error answer to ${pending.method}`, error));
        return;
      }
      pending.reject(new SidecarError(error.code as ErrorCode, error.message, error.data));
      return;
    }
    if (!("result" in msg)) {
      pending.reject(new SidecarError(ErrorCode.INTERNAL_ERROR, `answer to ${pending.method} has neither result nor error`));
      return;
    }
    pending.resolve(msg.result);
  }

  #onNotification(method: string, params: unknown, line: string): void {
    if (method === "chat:stream") {
      const event = params as ChatStreamEvent | null;
      if (typeof event !== "object" || event === null || typeof event.messageId !== "string" || typeof event.type !== "string") {
        this.#protocolError(line, "a chat:stream event without messageId or type");
        return;
      }
      this.#streams.route(event);
    }
    this.#emit(method, params);
  }

  #onStderr(chunk: string): void {
    this.#stderrTail = (this.#stderrTail + chunk).slice(-STDERR_TAIL);
    this.#stderr += chunk;
    let start = 0;
    for (;;) {
      const end = this.#stderr.indexOf("\n", start);
      if (end < 0) break;
      this.#log(this.#stderr.slice(start, end).replace(/\r$/, ""));
      start = end + 1;
    }
    this.#stderr = this.#stderr.slice(start);
    if (this.#stderr.length > 65_536) {
      this.#log(this.#stderr);
      this.#stderr = "";
    }
  }

  #protocolError(line: string, reason: string): void {
    const shown = line.length > 1000 ? `${line.slice(0, 1000)}…` : line;
    this.#log(`chat-sidecar client: skipped a stdout line (${reason}): ${shown.slice(0, 200)}`);
    this.#emit("protocol-error", { line: shown, reason } satisfies ProtocolErrorInfo);
  }

  #log(line: string): void {
    try {
      this.#options.onLog?.(line);
    } catch {
      // a failing logger must not stop the reader
    }
  }

  #exitError(): SidecarError {
    const exit = this.#exitInfo;
    const how = exit === null ? "" : ` (${exit.error ?? (exit.signal !== null ? `signal ${exit.signal}` : `code ${exit.code}`)})`;
    return new SidecarError(ClientErrorCode.PROCESS_EXITED, `the sidecar exited${how}`, exit);
  }

  #finish(end: { code: number | null; signal: string | null; error?: string }): void {
    if (this.state === "exited") return;
    this.state = "exited";
    if (this.#stdout.trim() !== "") this.#onLine(this.#stdout); // a last line without newline
    this.#stdout = "";
    if (this.#stderr !== "") this.#log(this.#stderr);
    this.#stderr = "";
    const exit: SidecarExit = {
      code: end.code,
      signal: end.signal,
      expected: this.#expected,
      ...(end.error !== undefined ? { error: end.error } : {}),
      stderrTail: this.#stderrTail,
    };
    this.#exitInfo = exit;
    const how = end.error ?? (end.signal !== null ? `signal ${end.signal}` : `code ${end.code}`);
    const failure = new SidecarError(
      ClientErrorCode.PROCESS_EXITED,
      `the sidecar ${end.error !== undefined ? "could not run" : "exited"} (${how})${exit.expected ? "" : " before answering"}`,
      exit,
    );
    for (const id of [...this.#pending.keys()]) this.#settle(id)?.reject(failure);
    this.#streams.failAll(failure);
    this.#onExit(exit);
    this.#resolveExit(exit);
    this.#emit("exit", exit);
  }
}

function cancelled(message: string): SidecarError {
  return new SidecarError(ErrorCode.REQUEST_CANCELLED, message);
}

function describe(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

function failedIterator(error: SidecarError): AsyncIterableIterator<ChatStreamEvent> {
  async function* fail(): AsyncGenerator<ChatStreamEvent, void, undefined> {
    throw error;
  }
  return fail();
}
