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

/**
 * Codes the client itself gives a call that got no answer from the sidecar. They lie
 * outside JSON-RPC's reserved range (-32768..-32000), so they never clash with ErrorCode.
 */
export const ClientErrorCode = Object.freeze({
  /** No answer within the call's timeout; `$/cancelRequest` was sent. */
  TIMEOUT: -33001,
  /** The sidecar process exited (or could not be started) before it answered. */
  PROCESS_EXITED: -33002,
  /** The client is closed, closing or restarting: the call was not sent. */
  NOT_RUNNING: -33003,
} as const);
export type ClientErrorCode = (typeof ClientErrorCode)[keyof typeof ClientErrorCode];

/** A JSON-RPC error from the sidecar (an ErrorCode) or a client-side failure (a ClientErrorCode). */
export class SidecarError extends Error {
  override readonly name = "SidecarError";
  readonly code: ErrorCode | ClientErrorCode;
  /** The error's `data` (e.g. `{expected, got}` of a protocol version mismatch). */
  readonly data: unknown;

  constructor(code: ErrorCode | ClientErrorCode, message: string, data?: unknown) {
    super(message);
    this.code = code;
    this.data = data;
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
