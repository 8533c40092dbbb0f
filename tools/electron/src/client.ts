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

import { Connection, cancelled } from "./connection.js";
import { ClientErrorCode, SidecarError } from "./errors.js";
import { ErrorCode, isFinalEvent } from "./protocol.js";
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
import { unavailable, type StreamSubscriber } from "./streams.js";

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

const DEFAULT_SHUTDOWN_MS = 5_000;

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

function failedIterator(error: SidecarError): AsyncIterableIterator<ChatStreamEvent> {
  async function* fail(): AsyncGenerator<ChatStreamEvent, void, undefined> {
    throw error;
  }
  return fail();
}
