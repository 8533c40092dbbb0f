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
import type { ChatStreamEvent, ClientInfo, InitializeResult, MethodName, MethodParams, MethodResult, Notifications, ServerNotificationName } from "./protocol.js";
export { ClientErrorCode, IPC_ERROR_MARKER, SidecarError, fromIpcError, ipcHandler, isSidecarError, toIpcError } from "./errors.js";
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
    /** Extra environment variables, on top of this process's environment. */
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
     * Events of messages that no `stream()` has asked for yet are kept for the most recent
     * `messages` messages, at most `events` each (default 16 and 5000), so `stream(id)`
     * called after `chat:send` answered still sees the first events.
     */
    streamBuffer?: {
        messages: number;
        events: number;
    };
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
export type CallArgs<M extends MethodName> = {} extends MethodParams<M> ? [params?: MethodParams<M>, options?: CallOptions] : [params: MethodParams<M>, options?: CallOptions];
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
export type SidecarEvents = {
    [N in ServerNotificationName]: Notifications[N]["params"];
} & {
    exit: SidecarExit;
    "protocol-error": ProtocolErrorInfo;
};
export type SidecarEventName = keyof SidecarEvents;
export interface StreamOptions {
    /** Aborting ends the iteration with a REQUEST_CANCELLED SidecarError (the reply goes on). */
    signal?: AbortSignal;
}
/** Spawn the sidecar, complete the handshake, and return the client. */
export declare function createSidecar(options: SidecarOptions): Promise<SidecarClient>;
export declare class SidecarClient {
    #private;
    constructor(options: SidecarOptions);
    /** The handshake's answer (server info, capabilities, data dir) of the running process. */
    get info(): InitializeResult | null;
    /** The process id while it runs. */
    get pid(): number | undefined;
    /** True between a completed handshake and the exit. */
    get running(): boolean;
    /** How the last process ended (null while it runs or before the first exit). */
    get lastExit(): SidecarExit | null;
    /** Spawn the process and complete the handshake (createSidecar does this). */
    start(): Promise<InitializeResult>;
    /** Send a request; resolves with its result or rejects with a SidecarError. */
    call<M extends MethodName>(method: M, ...args: CallArgs<M>): Promise<MethodResult<M>>;
    /** Listen to a notification, the exit or unreadable lines; returns the function that stops listening. */
    on<E extends SidecarEventName>(event: E, listener: (payload: SidecarEvents[E]) => void): () => void;
    /**
     * The events of one message, in order, ending after its final event (stream_end, error
     * or aborted), which is yielded too. Throws PROCESS_EXITED if the sidecar exits first.
     */
    stream(messageId: string, options?: StreamOptions): AsyncIterableIterator<ChatStreamEvent>;
    /**
     * The quit sequence: `sidecar:shutdown` (running replies are stored as aborted), close
     * stdin, wait up to `timeoutMs` (default `shutdownTimeoutMs`) for the exit, then SIGKILL.
     */
    close(options?: {
        timeoutMs?: number;
    }): Promise<SidecarExit>;
    /**
     * Close the running process (if any) and start a new one, with `changes` applied to the
     * options (e.g. a new `env`); listeners stay registered.
     */
    restart(changes?: Partial<SidecarOptions>): Promise<InitializeResult>;
    /** Resolves when the current process has exited (at once if none runs). */
    waitForExit(): Promise<SidecarExit>;
}
