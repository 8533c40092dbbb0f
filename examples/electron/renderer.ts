/**
 * Renderer side: typed calls through `window.chat`, errors decoded with `fromIpcError`,
 * a reply rendered from its chat:stream events, and a resync when a `seq` is missing.
 * Bundled for the renderer (Vite, esbuild): it imports the browser-safe parts of the
 * generated package only (errors.js, protocol.js), never client.js.
 */

import { ClientErrorCode, fromIpcError } from "../../protocol/generated/errors.js";
import { ErrorCode, isFinalEvent } from "../../protocol/generated/protocol.js";
import type { ChatStreamEvent, MessageV2, SessionV2, UnknownStreamEvent } from "../../protocol/generated/protocol.js";
import type { ChatApi } from "./chat-api.js";

const chat: ChatApi = window.chat;

interface Reply {
  text: string;
  lastSeq: number;
  done: boolean;
}

const replies = new Map<string, Reply>();

export async function openSession(title: string): Promise<SessionV2> {
  const session = await chat.call("chat:session:create", { title });
  await chat.watch(session.id);
  return session;
}

export async function send(sessionId: string, text: string): Promise<string | null> {
  try {
    const { messageId } = await chat.call("chat:send", { sessionId, input: { content: text } });
    replies.set(messageId, replies.get(messageId) ?? { text: "", lastSeq: 0, done: false });
    return messageId;
  } catch (raw) {
    const error = fromIpcError(raw);
    if (error?.code === ErrorCode.NOT_FOUND) show(`That chat no longer exists.`);
    else if (error?.code === ErrorCode.BAD_STATE) show(`Cannot send now: ${error.message}`);
    else if (error?.code === ClientErrorCode.NOT_RUNNING) show("The chat engine is restarting; try again.");
    else show(`Sending failed: ${error?.message ?? String(raw)}`);
    return null;
  }
}

async function resync(sessionId: string, messageId: string): Promise<void> {
  const messages: MessageV2[] = await chat.call("chat:messages:get", { sessionId });
  const message = messages.find((m) => m.id === messageId);
  if (message) {
    replies.set(messageId, { text: message.textContent ?? "", lastSeq: message.seq ?? 0, done: message.status !== "streaming" });
  }
}

function onEvent(event: ChatStreamEvent): void {
  const reply = replies.get(event.messageId) ?? { text: "", lastSeq: 0, done: false };
  replies.set(event.messageId, reply);
  if (event.seq <= reply.lastSeq) return; // already part of a resync
  if (event.seq !== reply.lastSeq + 1) {
    void resync(event.sessionId, event.messageId); // a gap: the stored partial content is exact
    return;
  }
  reply.lastSeq = event.seq;
  switch (event.type) {
    case "text_delta":
      reply.text += event.text;
      break;
    case "content_replaced": // the stored text differs from the streamed one: show what is stored
      reply.text = event.text;
      break;
    case "tool_approval_required":
      show(`${event.toolCall.name} wants to run; choices: ${event.decisions.join(", ")}`);
      break;
    case "error":
      show(`The reply failed (${event.code ?? "no code"}): ${event.error}`);
      break;
    default: {
      // the other known types, and types a newer sidecar adds: what every event has
      const other: UnknownStreamEvent = event;
      void other.type;
    }
  }
  if (isFinalEvent(event)) reply.done = true;
}

function show(text: string): void {
  const line = document.createElement("p");
  line.textContent = text;
  document.body.append(line);
}

chat.onStream(onEvent);
chat.onStatus((status) => {
  if (!status.running) show(status.detail ?? "The chat engine stopped.");
});
