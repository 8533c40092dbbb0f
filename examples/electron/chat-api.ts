/**
 * What the preload exposes to the renderer as `window.chat`, shared by main, preload and
 * renderer. The renderer reaches the sidecar through one IPC channel (`sidecar:call`,
 * method + params, checked against an allow-list in the main process) instead of one
 * channel per method, so a new method of the contract needs no new IPC code.
 */

import type {
  ChatStreamEvent,
  MethodName,
  MethodParams,
  MethodResult,
  SessionV2,
} from "../../protocol/generated/protocol.js";

export const CHANNELS = {
  /** invoke(method, params) -> result; rejects with an error `fromIpcError` decodes. */
  call: "sidecar:call",
  /** invoke(sessionId): this window receives the session's chat:stream events. */
  watch: "sidecar:watch",
  unwatch: "sidecar:unwatch",
  /** main -> renderer */
  stream: "chat:stream",
  sessionUpdated: "chat:session:updated",
  status: "sidecar:status",
} as const;

/** The methods a renderer may call: all of the contract but the process's own lifecycle. */
export type RendererMethod = Exclude<MethodName, "sidecar:initialize" | "sidecar:shutdown">;

export type RendererCallArgs<M extends RendererMethod> = {} extends MethodParams<M>
  ? [params?: MethodParams<M>]
  : [params: MethodParams<M>];

/** Sent on `sidecar:status` when the process stops, restarts or gives up. */
export interface SidecarStatus {
  running: boolean;
  detail?: string;
}

export interface ChatApi {
  call<M extends RendererMethod>(method: M, ...args: RendererCallArgs<M>): Promise<MethodResult<M>>;
  watch(sessionId: string): Promise<void>;
  unwatch(sessionId: string): Promise<void>;
  onStream(listener: (event: ChatStreamEvent) => void): () => void;
  onSessionUpdated(listener: (session: SessionV2) => void): () => void;
  onStatus(listener: (status: SidecarStatus) => void): () => void;
}

declare global {
  interface Window {
    chat: ChatApi;
  }
}
