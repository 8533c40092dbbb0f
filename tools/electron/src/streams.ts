/**
 * The `chat:stream` events of one connection, per message: what `stream(messageId)` reads.
 *
 * Node or not: no imports but the contract's types. What must stay true:
 * - every subscriber of a message gets every event of it, in order, from its first: the
 *   events of the most recent `messages` messages are kept (at most `events` each) whether
 *   or not someone listens, and a new subscriber first gets the kept ones, then the live
 *   ones, in the same synchronous step (no gap, no duplicate);
 * - a subscription that can never be served fails with a typed error instead of waiting:
 *   the message ended before it and its events are no longer all kept
 *   (ClientErrorCode.STREAM_UNAVAILABLE, `data` says which message and how it ended), or
 *   the client knows nothing of the message (the caller then checks the stored message,
 *   see `SidecarClient.stream`);
 * - what is known of a message (its session, its final event) is kept for the most recent
 *   `known` messages, so memory stays bounded however long the process runs.
 */

import { ClientErrorCode, SidecarError, type StreamUnavailableData } from "./errors.js";
import { isFinalEvent } from "./protocol.js";
import type { ChatStreamEvent, FinalEvent } from "./protocol.js";

export interface StreamSubscriber {
  push(event: ChatStreamEvent): void;
  fail(error: unknown): void;
}

interface Kept {
  events: ChatStreamEvent[];
  /** More events came than were kept: a late subscriber cannot get them all. */
  truncated: boolean;
}

interface Known {
  sessionId: string;
  final: FinalEvent | null;
  /** An event of it came (not only a send result naming it). */
  seen: boolean;
}

/** What `subscribe` found out about the message. */
export type SubscribeOutcome = "live" | "unknown";

export class MessageStreams {
  readonly #subscribers = new Map<string, Set<StreamSubscriber>>();
  readonly #kept = new Map<string, Kept>();
  readonly #known = new Map<string, Known>();
  readonly #keptMessages: number;
  readonly #keptEvents: number;
  readonly #knownMessages: number;

  constructor(options: { messages: number; events: number; known?: number }) {
    this.#keptMessages = Math.max(0, options.messages);
    this.#keptEvents = Math.max(0, options.events);
    this.#knownMessages = Math.max(this.#keptMessages, options.known ?? 4096);
  }

  /** The session of a message this connection saw an event or a send result of. */
  sessionOf(messageId: string): string | undefined {
    return this.#known.get(messageId)?.sessionId;
  }

  /** Remember the session of a message before its first event (e.g. from chat:send's answer). */
  note(messageId: string, sessionId: string): void {
    if (!this.#known.has(messageId)) this.#remember(messageId, { sessionId, final: null, seen: false });
  }

  /** One event from the sidecar: kept, then given to every subscriber of its message. */
  route(event: ChatStreamEvent): void {
    const known = this.#known.get(event.messageId);
    const final = isFinalEvent(event) ? event : (known?.final ?? null);
    this.#remember(event.messageId, { sessionId: event.sessionId, final, seen: true });
    this.#keep(event);
    const subscribers = this.#subscribers.get(event.messageId);
    if (!subscribers) return;
    for (const subscriber of [...subscribers]) subscriber.push(event);
    if (isFinalEvent(event)) this.#subscribers.delete(event.messageId);
  }

  /**
   * Subscribe to a message: the kept events first, then the live ones. Fails the
   * subscriber at once when the message is known to have ended and its events are not all
   * kept; "unknown" when no event (and no send result) of it was seen on this connection.
   */
  subscribe(messageId: string, subscriber: StreamSubscriber): { outcome: SubscribeOutcome; unsubscribe: () => void } {
    const unsubscribe = (): void => {
      const current = this.#subscribers.get(messageId);
      current?.delete(subscriber);
      if (current && current.size === 0) this.#subscribers.delete(messageId);
    };
    const kept = this.#kept.get(messageId);
    const known = this.#known.get(messageId);
    if (kept && !kept.truncated) {
      for (const event of kept.events) subscriber.push(event);
      if (known?.final) return { outcome: "live", unsubscribe };
    } else if (known?.seen) {
      // events of it came and are not all kept (evicted, or more than `events`)
      subscriber.fail(unavailable(messageId, known.sessionId, known.final, known.final && !kept ? "ended" : "truncated"));
      return { outcome: "live", unsubscribe };
    }
    let set = this.#subscribers.get(messageId);
    if (!set) {
      set = new Set();
      this.#subscribers.set(messageId, set);
    }
    set.add(subscriber);
    return { outcome: known ? "live" : "unknown", unsubscribe };
  }

  /** The process exited: every subscriber fails with `error`, and nothing is kept. */
  failAll(error: unknown): void {
    for (const set of this.#subscribers.values()) for (const subscriber of set) subscriber.fail(error);
    this.#subscribers.clear();
    this.#kept.clear();
    this.#known.clear();
  }

  #keep(event: ChatStreamEvent): void {
    if (this.#keptMessages === 0) return;
    let kept = this.#kept.get(event.messageId);
    if (!kept) {
      kept = { events: [], truncated: false };
      this.#kept.set(event.messageId, kept);
      while (this.#kept.size > this.#keptMessages) this.#kept.delete(this.#kept.keys().next().value as string);
    }
    if (kept.events.length < this.#keptEvents) kept.events.push(event);
    else kept.truncated = true;
  }

  #remember(messageId: string, known: Known): void {
    this.#known.delete(messageId); // re-inserted: the most recent last
    this.#known.set(messageId, known);
    while (this.#known.size > this.#knownMessages) this.#known.delete(this.#known.keys().next().value as string);
  }
}

/** STREAM_UNAVAILABLE for a message whose events cannot be replayed. */
export function unavailable(
  messageId: string,
  sessionId: string,
  final: FinalEvent | null,
  reason: StreamUnavailableData["reason"],
): SidecarError {
  const why =
    reason === "ended"
      ? "its reply ended before stream() was called and its events are no longer kept"
      : "more of its events came before stream() was called than streamBuffer.events keeps";
  const data: StreamUnavailableData = { messageId, sessionId, final, reason };
  return new SidecarError(
    ClientErrorCode.STREAM_UNAVAILABLE,
    `cannot stream message ${messageId}: ${why}; read it with chat:messages:get`,
    data,
  );
}
