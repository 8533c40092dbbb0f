/**
 * An Electron main process that runs chat-sidecar through the generated client
 * (protocol/generated, copied into the app or installed with
 * `npm install <path>/protocol/generated`).
 *
 * - the sidecar comes from the bundle in the app's resources when packaged
 *   (`python3 dev.py bundle`), from the repository's .venv in development;
 * - one IPC channel, `sidecar:call`, checked against the contract's method list; errors reach
 *   the renderer through `ipcHandler`/`fromIpcError` with their code and data;
 * - chat:stream events go to the windows that watch the session, not to every window;
 * - API keys are kept encrypted with safeStorage and handed to the sidecar in its
 *   environment (providers refer to them with `apiKeyEnv`), so chat.db never holds them;
 * - an unexpected exit restarts the sidecar with a backoff; quitting runs the quit sequence.
 *
 * Compiled in CI with `tsc --strict --isolatedModules --verbatimModuleSyntax` against a stub
 * of Electron's types (tools/electron/stubs/electron.d.ts).
 */

import { createWriteStream, existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import * as path from "node:path";
import { fileURLToPath } from "node:url";

import { app, BrowserWindow, ipcMain, safeStorage, type IpcMainInvokeEvent, type WebContents } from "electron";

import {
  createSidecar,
  ErrorCode,
  ipcHandler,
  METHOD_NAMES,
  SidecarError,
  type SidecarClient,
  type SidecarExit,
} from "../../protocol/generated/client.js";
import { CHANNELS, type RendererMethod, type SidecarStatus } from "./chat-api.js";

const here = path.dirname(fileURLToPath(import.meta.url));
const RENDERER_METHODS: ReadonlySet<string> = new Set(
  METHOD_NAMES.filter((name) => name !== "sidecar:initialize" && name !== "sidecar:shutdown"),
);
/** Methods that start a reply: the calling window watches the session from then on. */
const STARTS_A_REPLY: ReadonlySet<string> = new Set(["chat:send", "chat:regenerate", "chat:editResend", "chat:tool:approve"]);
const RESTARTS = { max: 5, withinMs: 60_000, firstDelayMs: 1_000 };

let sidecar: SidecarClient | null = null;
let quitting = false;
let closed = false;
const restartTimes: number[] = [];
const watchers = new Map<string, Set<WebContents>>();
const hooked = new WeakSet<WebContents>();

// ---- where things are -----------------------------------------------------------------

function sidecarCommand(): { command: string; args: string[] } {
  if (app.isPackaged) {
    // extraResources: { from: "<repo>/dist/chat-sidecar", to: "chat-sidecar" }
    const launcher = process.platform === "win32" ? "chat-sidecar.exe" : "chat-sidecar";
    return { command: path.join(process.resourcesPath, "chat-sidecar", launcher), args: [] };
  }
  const repo = process.env["CHAT_SIDECAR_REPO"] ?? path.resolve(app.getAppPath(), "..", "chat-sidecar");
  const python =
    process.platform === "win32"
      ? path.join(repo, ".venv", "Scripts", "python.exe")
      : path.join(repo, ".venv", "bin", "python");
  return { command: python, args: ["-m", "sidecar"] };
}

function openLog(): (line: string) => void {
  const dir = app.getPath("logs");
  mkdirSync(dir, { recursive: true });
  const stream = createWriteStream(path.join(dir, "chat-sidecar.log"), { flags: "a" });
  return (line) => {
    stream.write(line + "\n");
  };
}

// ---- secrets: encrypted by the OS (safeStorage), passed in the environment ------------

const KEYS_FILE = (): string => path.join(app.getPath("userData"), "provider-keys.bin");

/** {ENV_NAME: key} for the providers whose `apiKeyEnv` is ENV_NAME. */
function providerKeyEnv(): Record<string, string> {
  if (!existsSync(KEYS_FILE()) || !safeStorage.isEncryptionAvailable()) return {};
  try {
    const parsed: unknown = JSON.parse(safeStorage.decryptString(readFileSync(KEYS_FILE())));
    if (typeof parsed !== "object" || parsed === null) return {};
    const env: Record<string, string> = {};
    for (const [name, value] of Object.entries(parsed)) {
      if (/^CHAT_KEY_[A-Z0-9_]+$/.test(name) && typeof value === "string") env[name] = value;
    }
    return env;
  } catch {
    return {};
  }
}

/** Store a key and restart the sidecar with it in its environment. */
export async function saveProviderKey(envName: string, key: string): Promise<void> {
  if (!/^CHAT_KEY_[A-Z0-9_]+$/.test(envName)) throw new Error(`not a key variable name: ${envName}`);
  if (!safeStorage.isEncryptionAvailable()) throw new Error("no OS encryption available for API keys");
  const keys = { ...providerKeyEnv(), [envName]: key };
  writeFileSync(KEYS_FILE(), safeStorage.encryptString(JSON.stringify(keys)), { mode: 0o600 });
  await requireSidecar().restart({ env: keys });
}

/** A provider whose key comes from the environment (never stored in chat.db). */
export async function addOpenAi(): Promise<void> {
  const client = requireSidecar();
  const provider = await client.call("provider:upsert", {
    name: "OpenAI",
    type: "openai-compat",
    baseUrl: "https://api.openai.com/v1",
    apiKeyEnv: "CHAT_KEY_OPENAI",
    models: [{ id: "gpt-4o-mini", contextWindow: 128_000, supportsImages: true, inputPrice: 0.15, outputPrice: 0.6 }],
  });
  await client.call("provider:setDefault", { providerId: provider.id, modelId: "gpt-4o-mini" });
}

// ---- the sidecar ----------------------------------------------------------------------

function requireSidecar(): SidecarClient {
  if (!sidecar) throw new SidecarError(ErrorCode.BAD_STATE, "the chat engine is not started");
  return sidecar;
}

async function startSidecar(): Promise<SidecarClient> {
  const { command, args } = sidecarCommand();
  const client = await createSidecar({
    command,
    args,
    dataDir: path.join(app.getPath("userData"), "chat"),
    env: providerKeyEnv(),
    timeoutMs: 30_000,
    onLog: openLog(),
    clientInfo: { name: "desktop", version: "1.0.0" },
  });
  client.on("chat:stream", (event) => {
    for (const contents of watchers.get(event.sessionId) ?? []) {
      if (!contents.isDestroyed()) contents.send(CHANNELS.stream, event);
    }
  });
  client.on("chat:session:updated", (session) => broadcast(CHANNELS.sessionUpdated, session));
  client.on("exit", (exit) => onExit(client, exit));
  return client;
}

function onExit(client: SidecarClient, exit: SidecarExit): void {
  if (exit.expected || quitting) return;
  const now = Date.now();
  restartTimes.push(now);
  while (restartTimes.length > 0 && (restartTimes[0] ?? now) < now - RESTARTS.withinMs) restartTimes.shift();
  if (restartTimes.length > RESTARTS.max) {
    status({ running: false, detail: `the chat engine keeps stopping (${exit.code ?? exit.signal}); see chat-sidecar.log` });
    return;
  }
  status({ running: false, detail: "the chat engine stopped; restarting" });
  const delay = RESTARTS.firstDelayMs * 2 ** (restartTimes.length - 1);
  setTimeout(() => {
    client.restart().then(
      () => status({ running: true }),
      (error: unknown) => status({ running: false, detail: `restart failed: ${String(error)}` }),
    );
  }, delay);
}

function status(value: SidecarStatus): void {
  broadcast(CHANNELS.status, value);
}

function broadcast(channel: string, payload: unknown): void {
  for (const window of BrowserWindow.getAllWindows()) {
    if (!window.isDestroyed()) window.webContents.send(channel, payload);
  }
}

// ---- which window gets which session's events -----------------------------------------

function watch(sessionId: string, contents: WebContents): void {
  let set = watchers.get(sessionId);
  if (!set) {
    set = new Set();
    watchers.set(sessionId, set);
  }
  set.add(contents);
  if (!hooked.has(contents)) {
    hooked.add(contents);
    contents.once("destroyed", () => {
      for (const [id, members] of watchers) {
        members.delete(contents);
        if (members.size === 0) watchers.delete(id);
      }
    });
  }
}

function unwatch(sessionId: string, contents: WebContents): void {
  const set = watchers.get(sessionId);
  set?.delete(contents);
  if (set && set.size === 0) watchers.delete(sessionId);
}

function sessionIdOf(params: unknown): string | null {
  if (typeof params !== "object" || params === null) return null;
  const id = (params as { sessionId?: unknown }).sessionId;
  return typeof id === "string" ? id : null;
}

// ---- IPC --------------------------------------------------------------------------------

ipcMain.handle(
  CHANNELS.call,
  ipcHandler(async (event: IpcMainInvokeEvent, method: unknown, params: unknown) => {
    if (typeof method !== "string" || !RENDERER_METHODS.has(method)) {
      throw new SidecarError(ErrorCode.METHOD_NOT_FOUND, `not a method the renderer may call: ${String(method)}`);
    }
    if (params !== undefined && (typeof params !== "object" || params === null || Array.isArray(params))) {
      throw new SidecarError(ErrorCode.INVALID_PARAMS, "invalid params: params must be an object");
    }
    const sessionId = sessionIdOf(params);
    if (sessionId !== null && STARTS_A_REPLY.has(method)) watch(sessionId, event.sender);
    // the sidecar checks every field and answers -32602 naming the one that is wrong
    return requireSidecar().call(method as RendererMethod, params as never);
  }),
);

ipcMain.handle(
  CHANNELS.watch,
  ipcHandler((event: IpcMainInvokeEvent, sessionId: unknown) => {
    if (typeof sessionId !== "string") throw new SidecarError(ErrorCode.INVALID_PARAMS, "sessionId must be a string");
    watch(sessionId, event.sender);
  }),
);

ipcMain.handle(
  CHANNELS.unwatch,
  ipcHandler((event: IpcMainInvokeEvent, sessionId: unknown) => {
    if (typeof sessionId === "string") unwatch(sessionId, event.sender);
  }),
);

// ---- app lifetime -----------------------------------------------------------------------

app.on("before-quit", (event) => {
  if (closed || sidecar === null) return;
  event.preventDefault(); // quit again once the sidecar has stored its state and exited
  if (quitting) return;
  quitting = true;
  void sidecar.close({ timeoutMs: 5_000 }).finally(() => {
    closed = true;
    app.quit();
  });
});

app.on("window-all-closed", () => {
  if (process.platform !== "darwin") app.quit();
});

async function main(): Promise<void> {
  await app.whenReady();
  const window = new BrowserWindow({
    width: 1100,
    height: 760,
    webPreferences: { preload: path.join(here, "preload.cjs"), contextIsolation: true, sandbox: true },
  });
  await window.loadFile(path.join(here, "index.html"));
  try {
    sidecar = await startSidecar();
    status({ running: true });
  } catch (error) {
    // e.g. a protocol version mismatch: code BAD_STATE, data {expected, got}
    const detail = error instanceof SidecarError ? `${error.message} (${error.code})` : String(error);
    status({ running: false, detail: `the chat engine did not start: ${detail}` });
  }
}

void main();
