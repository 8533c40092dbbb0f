/**
 * One spawned sidecar process (the client's Connection): its pipes, the pending calls,
 * the per-message event streams (streams.ts) and the exit.
 *
 * Node only (child_process). What must stay true: every call settles (result, error,
 * timeout, abort, or PROCESS_EXITED at the exit); a stdout line that is not JSON-RPC is
 * reported and skipped; `close()` always ends the process (shutdown, stdin closed, a bounded
 * wait, SIGKILL). SidecarClient (client.ts) is the public face of it.
 */

import { spawn, type ChildProcessWithoutNullStreams } from "node:child_process";

import type { CallOptions, ProtocolErrorInfo, SidecarExit, SidecarOptions } from "./client.js";
import { ClientErrorCode, SidecarError } from "./errors.js";
import { ErrorCode, PROTOCOL_VERSION } from "./protocol.js";
import type { ChatStreamEvent, InitializeResult } from "./protocol.js";
import { MessageStreams, type StreamSubscriber } from "./streams.js";

export const DEFAULT_TIMEOUT_MS = 30_000;
const KILL_WAIT_MS = 5_000;
const EXIT_FLUSH_MS = 2_000;
const STDERR_TAIL = 8_192;
const DEFAULT_MAX_LINE = 256 * 1024 * 1024;

export type State = "starting" | "running" | "closing" | "exited";

interface Pending {
  method: string;
  resolve(result: unknown): void;
  reject(error: SidecarError): void;
  cleanup(): void;
}

/** One spawned process: its pipes, pending calls, stream subscribers and exit. */
export class Connection {
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

export function cancelled(message: string): SidecarError {
  return new SidecarError(ErrorCode.REQUEST_CANCELLED, message);
}

export function describe(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
