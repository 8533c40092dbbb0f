declare const logFile: { write(text: string): void };
import * as path from "node:path";
import { app, ipcMain, type WebContents } from "electron";
import { createSidecar, ipcHandler, METHOD_NAMES, SidecarError, ErrorCode } from "../../../protocol/generated/client.js";
import type { MethodName } from "../../../protocol/generated/protocol.js";

// Packaged: the bundle in the app's resources (see "Shipping it"). Never "chat-sidecar" on PATH.
const launcher = path.join(process.resourcesPath, "chat-sidecar",
  process.platform === "win32" ? "chat-sidecar.exe" : "chat-sidecar");
const sidecar = await createSidecar({
  command: app.isPackaged ? launcher : "/path/to/repo/.venv/bin/python",
  args: app.isPackaged ? [] : ["-m", "sidecar"],
  dataDir: path.join(app.getPath("userData"), "chat"),   // chat.db, attachments/
  timeoutMs: 30_000,                                      // per call; override per call
  onLog: (line) => logFile.write(line + "\n"),            // the sidecar's stderr, line by line
  clientInfo: { name: "desktop", version: app.getVersion() },
});   // rejects with a SidecarError if it cannot start or speaks another protocol version

// One channel for every method, checked against the contract; errors keep code/message/data.
const allowed = new Set(METHOD_NAMES.filter((m) => m !== "sidecar:initialize" && m !== "sidecar:shutdown"));
ipcMain.handle("sidecar:call", ipcHandler(async (event, method: unknown, params: unknown) => {
  if (typeof method !== "string" || !allowed.has(method as never))
    throw new SidecarError(ErrorCode.METHOD_NOT_FOUND, `no method ${String(method)}`);
  if (method === "chat:send") watch((params as { sessionId: string }).sessionId, event.sender);
  return sidecar.call(method as MethodName, params as never);  // the sidecar validates params
}));

// Each session's events go to the windows that show it, not to every window.
const watchers = new Map<string, Set<WebContents>>();
function watch(sessionId: string, contents: WebContents) { /* add; drop on contents "destroyed" */ }
sidecar.on("chat:stream", (event) => {
  for (const contents of watchers.get(event.sessionId) ?? []) contents.send("chat:stream", event);
});
sidecar.on("chat:session:updated", (session) => { /* to every window: titles, counters */ });
sidecar.on("exit", (exit) => { if (!exit.expected) void sidecar.restart(); /* with a backoff */ });

// The quit sequence: stores running replies as aborted, then exits.
let closed = false;
app.on("before-quit", (event) => {
  if (closed) return;
  event.preventDefault();
  void sidecar.close({ timeoutMs: 5_000 }).finally(() => { closed = true; app.quit(); });
});