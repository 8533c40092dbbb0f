/**
 * Compile-time checks of the generated types and client (never run): each
 * `@ts-expect-error` line must fail to compile, every other line must compile. tsc reports
 * an unused `@ts-expect-error`, so a type that became too loose fails the build.
 */

import {
  ClientErrorCode,
  createSidecar,
  ErrorCode,
  fromIpcError,
  isFinalEvent,
  SidecarError,
  type SidecarClient,
} from "../../../protocol/generated/client.js";
import type {
  AuditDecision,
  ChatStreamEvent,
  FinalEvent,
  JsonRpcFailure,
  McpServerInfo,
  MessageV2,
  SessionV2,
  ServerMessage,
  ToolAuditEntry,
  ToolInfo,
  ToolSource,
  UnknownStreamEvent,
  UserInput,
} from "../../../protocol/generated/protocol.js";

declare const client: SidecarClient;
declare const session: SessionV2;
declare const message: MessageV2;

export async function checks(): Promise<void> {
  // always-sent fields are required: no `| undefined` to strip
  const title: string = session.title;
  const tags: string[] = session.tags;
  const pinned: boolean = session.isPinned;
  const status: MessageV2["status"] = message.status;
  void [title, tags, pinned, status];

  // ErrorCode is a runtime object and a union type
  const code: ErrorCode = ErrorCode.NOT_FOUND;
  const notACode: ErrorCode = 5;
  void [code, notACode];

  // params of no-argument methods: nothing, or an empty object
  await client.call("provider:list");
  await client.call("provider:list", {});
  await client.call("provider:list", 42);
  await client.call("settings:get", { extra: true });

  // required params
  await client.call("chat:send");
  await client.call("chat:send", { sessionId: "s" });
  const sent = await client.call("chat:send", { sessionId: "s", input: { content: "hi" } }, { timeoutMs: 5000 });
  const messageId: string = sent.messageId;

  // every field with a default may be left out of a filter
  const listed = await client.call("chat:session:list");
  const total: number = listed.total;
  void total;

  // input parts are not stored parts
  const ok: UserInput = { content: [{ type: "text", text: "a" }, { type: "image", mimeType: "image/png", base64: "AA==" }] };
  const bad: UserInput = { content: [{ type: "tool_use", id: "1", name: "x", input: {} }] };
  void [ok, bad];

  // literal unions
  await client.call("chat:tool:approve", { sessionId: "s", toolCallId: "t", decision: "maybe" });
  const tools: ToolInfo[] = await client.call("tool:list");
  const source: ToolSource | undefined = tools[0]?.source;
  const wrongSource: ToolSource = "plugin";
  const decision: AuditDecision = "remember:auto";
  const audit: ToolAuditEntry[] = await client.call("tool:audit:list", { limit: 10, offset: 0 });
  const actor: "user" | "policy" | "system" | "compat" | undefined = audit[0]?.actor;
  void [source, wrongSource, decision, actor];
  const mcp: McpServerInfo[] = await client.call("mcp:server:list");
  void mcp;

  // typed notifications and the per-message stream
  const off = client.on("chat:stream", (event) => {
    if (event.type === "text_delta") {
      const text: string = event.text;
      void text;
    }
    if (event.type === "error") {
      const errorCode: ErrorCode | null | undefined = event.code;
      void errorCode;
    }
  });
  off();
  client.on("chat:session:updated", (updated) => {
    const id: string = updated.id;
    void id;
  });
  client.on("exit", (exit) => {
    const expected: boolean = exit.expected;
    void expected;
  });
  client.on("chat:nope", () => undefined);

  let last: FinalEvent | null = null;
  for await (const event of client.stream(messageId)) {
    const seq: number = event.seq;
    void seq;
    if (isFinalEvent(event)) last = event;
  }
  void last;

  // errors keep code and data; the IPC codec gives them back
  try {
    await client.call("chat:session:get", { id: "missing" });
  } catch (error) {
    const decoded = fromIpcError(error);
    if (decoded?.code === ErrorCode.NOT_FOUND) {
      const data: unknown = decoded.data;
      void data;
    }
  }
  const failure: SidecarError = new SidecarError(ErrorCode.BAD_STATE, "x", { expected: 1, got: 2 });
  void failure;

  // error data typed per code, after error.is(code)
  try {
    await client.call("provider:list");
  } catch (error) {
    if (error instanceof SidecarError && error.is(ErrorCode.PROVIDER_ERROR)) {
      const retryable: boolean | undefined = error.data?.retryable;
      const status: number | null | undefined = error.data?.status;
      void [retryable, status];
    }
    if (error instanceof SidecarError && error.is(ClientErrorCode.TIMEOUT)) {
      const timeoutMs: number = error.data.timeoutMs;
      void timeoutMs;
    }
    if (error instanceof SidecarError && error.is(ClientErrorCode.STREAM_UNAVAILABLE)) {
      const reason: "ended" | "truncated" = error.data.reason;
      void reason;
    }
    if (error instanceof SidecarError) {
      const kind: string = error.data.kind;
      void kind;
    }
  }

  // baseUrl: required for the HTTP provider types, not for acp-engine
  await client.call("provider:upsert", { name: "Local", type: "openai-compat" });
  await client.call("provider:upsert", { name: "Local", type: "ollama", baseUrl: "http://127.0.0.1:11434" });
  await client.call("provider:upsert", { name: "Agent", type: "acp-engine", engine: { command: "agent" } });

  // defaults are sent: a model's flags are never missing
  const providers = await client.call("provider:list");
  const supportsTools: boolean | undefined = providers[0]?.models[0]?.supportsTools;
  void supportsTools;

  // an event type this copy does not know: the default branch compiles without a cast
  for await (const event of client.stream(messageId)) {
    switch (event.type) {
      case "text_delta":
        break;
      case "stream_start": {
        const parent: string | null = event.parentId;
        void parent;
        break;
      }
      default: {
        const other: UnknownStreamEvent = event;
        void other.type;
      }
    }
  }

  // envelope types
  const line: ServerMessage = { jsonrpc: "2.0", method: "chat:stream", params: {} as ChatStreamEvent };
  const error: JsonRpcFailure = { jsonrpc: "2.0", id: null, error: { code: ErrorCode.PARSE_ERROR, message: "x" } };
  void [line, error];

  const second = await createSidecar({ command: "/opt/app/chat-sidecar", dataDir: "/tmp/x", logLevel: "INFO" });
  await second.restart({ env: { CHAT_KEY_OPENAI: "k" } });
  await second.close({ timeoutMs: 1000 });
}
