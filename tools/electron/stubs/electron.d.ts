// The part of Electron's API the examples use, with Electron's own signatures (its
// electron.d.ts declares these the same way, `any` included), so the examples compile
// without downloading Electron. An app compiles them against the real `electron` package.

declare module "electron" {
  import type { EventEmitter } from "node:events";

  interface Event {
    preventDefault(): void;
    readonly defaultPrevented: boolean;
  }

  interface WebContents extends EventEmitter {
    readonly id: number;
    send(channel: string, ...args: any[]): void;
    isDestroyed(): boolean;
    once(event: "destroyed", listener: () => void): this;
  }

  interface IpcMainInvokeEvent extends Event {
    readonly sender: WebContents;
  }

  interface IpcMain {
    handle(channel: string, listener: (event: IpcMainInvokeEvent, ...args: any[]) => Promise<any> | any): void;
    removeHandler(channel: string): void;
  }

  interface IpcRendererEvent extends Event {
    readonly sender: IpcRenderer;
  }

  interface IpcRenderer {
    invoke(channel: string, ...args: any[]): Promise<any>;
    on(channel: string, listener: (event: IpcRendererEvent, ...args: any[]) => void): this;
    removeListener(channel: string, listener: (...args: any[]) => void): this;
  }

  interface ContextBridge {
    exposeInMainWorld(apiKey: string, api: any): void;
  }

  interface SafeStorage {
    isEncryptionAvailable(): boolean;
    encryptString(plainText: string): Buffer;
    decryptString(encrypted: Buffer): string;
  }

  interface App {
    readonly isPackaged: boolean;
    getPath(
      name:
        | "home" | "appData" | "userData" | "sessionData" | "temp" | "exe" | "module" | "desktop"
        | "documents" | "downloads" | "music" | "pictures" | "videos" | "recent" | "logs" | "crashDumps",
    ): string;
    getAppPath(): string;
    getVersion(): string;
    whenReady(): Promise<void>;
    quit(): void;
    exit(exitCode?: number): void;
    on(event: "before-quit", listener: (event: Event) => void): this;
    on(event: "window-all-closed", listener: () => void): this;
  }

  interface WebPreferences {
    preload?: string;
    contextIsolation?: boolean;
    sandbox?: boolean;
    nodeIntegration?: boolean;
  }

  interface BrowserWindowConstructorOptions {
    width?: number;
    height?: number;
    webPreferences?: WebPreferences;
  }

  class BrowserWindow {
    constructor(options?: BrowserWindowConstructorOptions);
    static getAllWindows(): BrowserWindow[];
    readonly webContents: WebContents;
    loadFile(filePath: string): Promise<void>;
    isDestroyed(): boolean;
  }

  const app: App;
  const ipcMain: IpcMain;
  const ipcRenderer: IpcRenderer;
  const contextBridge: ContextBridge;
  const safeStorage: SafeStorage;
}

declare namespace NodeJS {
  interface Process {
    /** Electron: the path of the app's resources folder (where a packaged app ships the bundle). */
    readonly resourcesPath: string;
  }
}
