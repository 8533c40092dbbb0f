/**
 * SidecarError and its passage through Electron's `ipcMain.handle`.
 *
 * Safe in every Electron process (main, preload, renderer): no Node imports.
 *
 * Electron keeps only the `message` of an error thrown in an `ipcMain.handle` handler; the
 * renderer's `ipcRenderer.invoke` rejects with `Error invoking remote method '<channel>':
 * Error: <message>`. So `toIpcError` writes code, message and data into the message as
 * `[chat-sidecar-error]{"code":...,"message":...,"data":...}`, and `fromIpcError`, in
 * the preload or the renderer, finds that marker and rebuilds the SidecarError.
 */

import { ErrorCode } from "./protocol.js";
import type { FinalEvent } from "./protocol.js";

/**
 * Codes the client itself gives a call that got no answer from the sidecar. They lie
 * outside JSON-RPC's reserved range (-32768..-32000), so they never clash with ErrorCode.
 */
export const ClientErrorCode = Object.freeze({
  /** No answer within the call's timeout; `$/cancelRequest` was sent. */
  TIMEOUT: -33001,
  /** The sidecar process exited (or could not be started) before it answered. */
  PROCESS_EXITED: -33002,
  /** The client is closed, closing or restarting (or not started): the call was not sent. */
  NOT_RUNNING: -33003,
  /**
   * `stream(messageId)`: the reply ended before, or more of its events came than are kept,
   * so they cannot be replayed; read the message with `chat:messages:get`.
   */
  STREAM_UNAVAILABLE: -33004,
} as const);
export type ClientErrorCode = (typeof ClientErrorCode)[keyof typeof ClientErrorCode];

/** Every code a SidecarError can have. */
export type AnyErrorCode = ErrorCode | ClientErrorCode;

/** `kind` of an LLM provider's failure (PROVIDER_ERROR from a chat or embedding call). */
export type ProviderErrorKind =
  | "connect" | "timeout" | "http" | "in_stream" | "malformed" | "truncated" | "disconnect" | "stall" | "bad_request";
/** `kind` of a failed call to the Qiming server (PROVIDER_ERROR; BAD_STATE for not_configured). */
export type ServerErrorKind =
  | "network" | "timeout" | "http" | "malformed" | "envelope" | "auth_required" | "not_found" | "not_configured" | "chat_failed";

/** PROVIDER_ERROR of an LLM provider call. */
export interface ProviderCallErrorData {
  kind: ProviderErrorKind;
  /** The HTTP status when the provider answered one (kind "http"). */
  status: number | null;
  /** Whether the same request could succeed later (429, 5xx, network trouble). */
  retryable: boolean;
}
/** PROVIDER_ERROR (or BAD_STATE, kind "not_configured") of a call to the Qiming server. */
export interface ServerErrorData {
  kind: ServerErrorKind;
  status: number | null;
  /** The server's envelope code (e.g. "4010"), when it sent one. */
  code: string | null;
  retryable: boolean;
}
/** PROVIDER_ERROR of an ACP agent engine that answered a request with an error. */
export interface AgentErrorData {
  kind: "agent";
  status: null;
  retryable: false;
  /** The `data` of the agent's own JSON-RPC error, as it sent it. */
  agentData: unknown;
}
/** BAD_STATE of `sidecar:initialize` (and of `createSidecar`): the two protocol versions. */
export interface VersionMismatchData {
  expected: number;
  got: number;
}
/** NOT_FOUND: the id that was not found, under its field name (one of these). */
export interface NotFoundData {
  sessionId?: string;
  messageId?: string;
  assistantId?: string;
  kbId?: string;
  documentId?: string;
  memoryId?: string;
  proposalId?: string;
  /** A Soul.md version. */
  version?: number;
}
/** BAD_STATE of a memory or proposal in the wrong state for the request. */
export interface StateConflictData {
  memoryId?: string;
  proposalId?: string;
  status?: string;
}
/** FEATURE_UNAVAILABLE: the optional part of the bundle the request needs (docs/bundle.md). */
export interface FeatureUnavailableData {
  part: "vectors" | "html";
  /** The module that part brings. */
  module: string;
}
/** TIMEOUT: the call that got no answer. */
export interface TimeoutData {
  method: string;
  timeoutMs: number;
}
/** PROCESS_EXITED: how the process ended (the client's SidecarExit). */
export interface ExitData {
  code: number | null;
  signal: string | null;
  expected: boolean;
  error?: string;
  stderrTail: string;
}
/** STREAM_UNAVAILABLE: which message, and how it ended when the client saw it. */
export interface StreamUnavailableData {
  messageId: string;
  /** The message's session (read the stored message with `chat:messages:get`). */
  sessionId: string;
  /** Its final event, when this client saw it; null when it ended before this process started. */
  final: FinalEvent | null;
  /** "ended": the reply ended before stream() was called; "truncated": more events came than are kept. */
  reason: "ended" | "truncated";
}

/**
 * The `data` of an error with code `C`; `undefined` where an error of that code carries
 * none (e.g. an INVALID_PARAMS, whose message names the field).
 */
export type ErrorData<C extends AnyErrorCode> = C extends typeof ErrorCode.PROVIDER_ERROR
  ? ProviderCallErrorData | ServerErrorData | AgentErrorData | undefined
  : C extends typeof ErrorCode.NOT_FOUND
    ? NotFoundData | undefined
    : C extends typeof ErrorCode.BAD_STATE
      ? VersionMismatchData | StateConflictData | ServerErrorData | undefined
      : C extends typeof ErrorCode.METHOD_NOT_FOUND
        ? string | undefined
        : C extends typeof ErrorCode.FEATURE_UNAVAILABLE
          ? FeatureUnavailableData
        : C extends typeof ClientErrorCode.TIMEOUT
          ? TimeoutData
          : C extends typeof ClientErrorCode.PROCESS_EXITED
            ? ExitData | null
            : C extends typeof ClientErrorCode.STREAM_UNAVAILABLE
              ? StreamUnavailableData
              : unknown;

/**
 * A JSON-RPC error from the sidecar (an ErrorCode) or a client-side failure (a
 * ClientErrorCode). `error.is(ErrorCode.PROVIDER_ERROR)` narrows `data` to that code's
 * shape (ErrorData); `data` of an unnarrowed error is `unknown`.
 */
export class SidecarError<C extends AnyErrorCode = AnyErrorCode> extends Error {
  override readonly name = "SidecarError";
  readonly code: C;
  /** The error's `data`: see ErrorData for its shape per code. */
  readonly data: ErrorData<C>;

  constructor(code: C, message: string, data?: ErrorData<C>) {
    super(message);
    this.code = code;
    this.data = data as ErrorData<C>;
  }

  /** True when the error has code `code` (and then `data` has that code's shape). */
  is<K extends AnyErrorCode>(code: K): this is SidecarError<K> {
    return (this.code as AnyErrorCode) === code;
  }

  toJSON(): { name: string; code: number; message: string; data: unknown } {
    return { name: this.name, code: this.code, message: this.message, data: this.data };
  }
}

export function isSidecarError(error: unknown): error is SidecarError {
  return error instanceof SidecarError;
}

/** The marker `toIpcError` writes before the JSON of the error. */
export const IPC_ERROR_MARKER = "[chat-sidecar-error]";

/**
 * An Error to throw from an `ipcMain.handle` handler: its message carries code, message
 * and data, which is all Electron passes on. Anything that is not a SidecarError becomes
 * one with code INTERNAL_ERROR and the error's message.
 */
export function toIpcError(error: unknown): Error {
  const sidecar =
    error instanceof SidecarError
      ? error
      : new SidecarError(ErrorCode.INTERNAL_ERROR, error instanceof Error ? error.message : String(error));
  let payload: string;
  try {
    payload = JSON.stringify({ code: sidecar.code, message: sidecar.message, data: sidecar.data ?? null });
  } catch {
    // data that JSON cannot hold (a cycle, a BigInt) is dropped, never the error itself
    payload = JSON.stringify({ code: sidecar.code, message: sidecar.message, data: null });
  }
  return new Error(IPC_ERROR_MARKER + payload);
}

/**
 * The SidecarError inside an error that came through `ipcRenderer.invoke` (or any error
 * whose message holds `toIpcError`'s encoding); null if there is none.
 */
export function fromIpcError(error: unknown): SidecarError | null {
  if (error instanceof SidecarError) return error;
  const message = error instanceof Error ? error.message : typeof error === "string" ? error : null;
  if (message === null) return null;
  const at = message.indexOf(IPC_ERROR_MARKER);
  if (at < 0) return null;
  try {
    const parsed: unknown = JSON.parse(message.slice(at + IPC_ERROR_MARKER.length));
    if (typeof parsed !== "object" || parsed === null) return null;
    const fields = parsed as { code?: unknown; message?: unknown; data?: unknown };
    if (typeof fields.code !== "number" || typeof fields.message !== "string") return null;
    return new SidecarError(fields.code as ErrorCode | ClientErrorCode, fields.message, fields.data ?? undefined);
  } catch {
    return null;
  }
}

/**
 * Wrap an `ipcMain.handle` handler so whatever it throws reaches the renderer as a
 * decodable SidecarError: `ipcMain.handle("chat:send", ipcHandler(async (_e, p) => ...))`.
 */
export function ipcHandler<A extends unknown[], R>(
  handler: (...args: A) => R | Promise<R>,
): (...args: A) => Promise<R> {
  return async (...args: A): Promise<R> => {
    try {
      return await handler(...args);
    } catch (error) {
      throw toIpcError(error);
    }
  };
}
