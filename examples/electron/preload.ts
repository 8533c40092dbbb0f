/**
 * The preload: a thin bridge from `window.chat` to the main process. It decodes nothing:
 * contextBridge copies an Error's message only, so the renderer itself calls
 * `fromIpcError` on a rejection. Sandboxed preloads must be CommonJS: bundle this file
 * (electron-vite, esbuild) as an app does for its preload.
 */

import { contextBridge, ipcRenderer, type IpcRendererEvent } from "electron";

import type { ChatStreamEvent, SessionV2 } from "../../protocol/generated/protocol.js";
import { CHANNELS, type ChatApi, type SidecarStatus } from "./chat-api.js";

function subscribe<T>(channel: string, listener: (payload: T) => void): () => void {
  const wrapped = (_event: IpcRendererEvent, payload: T): void => listener(payload);
  ipcRenderer.on(channel, wrapped);
  return () => {
    ipcRenderer.removeListener(channel, wrapped);
  };
}

const api: ChatApi = {
  call: (method, ...args) => ipcRenderer.invoke(CHANNELS.call, method, args[0]),
  watch: (sessionId) => ipcRenderer.invoke(CHANNELS.watch, sessionId),
  unwatch: (sessionId) => ipcRenderer.invoke(CHANNELS.unwatch, sessionId),
  onStream: (listener) => subscribe<ChatStreamEvent>(CHANNELS.stream, listener),
  onSessionUpdated: (listener) => subscribe<SessionV2>(CHANNELS.sessionUpdated, listener),
  onStatus: (listener) => subscribe<SidecarStatus>(CHANNELS.status, listener),
};

contextBridge.exposeInMainWorld("chat", api);
