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
export declare const ClientErrorCode: Readonly<{
    /** No answer within the call's timeout; `$/cancelRequest` was sent. */
    readonly TIMEOUT: -33001;
    /** The sidecar process exited (or could not be started) before it answered. */
    readonly PROCESS_EXITED: -33002;
    /** The client is closed, closing or restarting: the call was not sent. */
    readonly NOT_RUNNING: -33003;
}>;
export type ClientErrorCode = (typeof ClientErrorCode)[keyof typeof ClientErrorCode];
/** A JSON-RPC error from the sidecar (an ErrorCode) or a client-side failure (a ClientErrorCode). */
export declare class SidecarError extends Error {
    readonly name = "SidecarError";
    readonly code: ErrorCode | ClientErrorCode;
    /** The error's `data` (e.g. `{expected, got}` of a protocol version mismatch). */
    readonly data: unknown;
    constructor(code: ErrorCode | ClientErrorCode, message: string, data?: unknown);
    toJSON(): {
        name: string;
        code: number;
        message: string;
        data: unknown;
    };
}
export declare function isSidecarError(error: unknown): error is SidecarError;
/** The marker `toIpcError` writes before the JSON of the error. */
export declare const IPC_ERROR_MARKER = "[chat-sidecar-error]";
/**
 * An Error to throw from an `ipcMain.handle` handler: its message carries code, message
 * and data, which is all Electron passes on. Anything that is not a SidecarError becomes
 * one with code INTERNAL_ERROR and the error's message.
 */
export declare function toIpcError(error: unknown): Error;
/**
 * The SidecarError inside an error that came through `ipcRenderer.invoke` (or any error
 * whose message holds `toIpcError`'s encoding); null if there is none.
 */
export declare function fromIpcError(error: unknown): SidecarError | null;
/**
 * Wrap an `ipcMain.handle` handler so whatever it throws reaches the renderer as a
 * decodable SidecarError: `ipcMain.handle("chat:send", ipcHandler(async (_e, p) => ...))`.
 */
export declare function ipcHandler<A extends unknown[], R>(handler: (...args: A) => R | Promise<R>): (...args: A) => Promise<R>;
