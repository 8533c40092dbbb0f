"""TitleGenerator: names a session after its first exchange with a short model call.

A side task: it never blocks or fails a reply. It only runs while the session still has
its default title and the reply is the first of the session, and it re-reads the session
before writing so a title the user set in the meantime is never overwritten.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import anyio

from protocol.sessions import SessionUpdates
from protocol.settings import ChatSettings
from protocol.types import SessionV2, TextPart, Usage
from sidecar.engine.lifecycle import ReplyJob
from sidecar.errors import EngineError, ProviderError, SidecarError
from sidecar.pipeline.calls import ModelResolver
from sidecar.providers.types import ChatRequest, GenerationParams, RequestMessage, TextDelta, UsageUpdate
from sidecar.store.async_store import AsyncStore
from sidecar.store.store import Store

log = logging.getLogger(__name__)

UsageSink = Callable[[str, str, Usage], Awaitable[None]]

DEFAULT_TITLES = ("", "New Chat")
TITLE_TIMEOUT_S = 30.0
MAX_TITLE_CHARS = 80
_PROMPT = (
    "You name chat conversations. Reply with a concise title of at most eight words, in the "
    "language of the conversation, without quotes or trailing punctuation."
)


class TitleGenerator:
    def __init__(self, *, store: AsyncStore, providers: ModelResolver, settings: Callable[[], ChatSettings]) -> None:
        self._store = store
        self._providers = providers
        self._settings = settings

    async def wants_title(self, session: SessionV2, job: ReplyJob) -> bool:
        if not self._settings().generate_titles or session.title not in DEFAULT_TITLES:
            return False
        path = await self._store.run(lambda s: s.messages.path(session.id, job.message_id))
        return len(path) == 2 and path[0].role == "user"

    async def generate(self, session: SessionV2, job: ReplyJob) -> SessionV2 | None:
        try:
            with anyio.fail_after(TITLE_TIMEOUT_S):
                return await self._generate(session, job)
        except (SidecarError, TimeoutError) as exc:
            log.info("no title for session %s: %s", session.id, exc)
        except Exception:
            log.exception("title generation for session %s failed", session.id)
        return None

    async def _generate(self, session: SessionV2, job: ReplyJob) -> SessionV2 | None:
        path = await self._store.run(lambda s: s.messages.path(session.id, job.message_id))
        user_text = (path[0].text_content or "")[:1000]
        reply_text = (path[-1].text_content or "")[:1000]
        chosen = self._settings().title_model
        provider_id = chosen.provider_id if chosen else job.provider_id
        model_id = chosen.model_id if chosen else job.model_id
        resolved = await self._providers.resolve(provider_id, model_id)
        request = ChatRequest(
            model=resolved.model,
            messages=[
                RequestMessage(role="system", parts=[TextPart(text=_PROMPT)]),
                RequestMessage(
                    role="user",
                    parts=[TextPart(text=f"User: {user_text}\n\nAssistant: {reply_text}")],
                ),
            ],
            params=GenerationParams(max_tokens=64),
            stream=False,
        )
        parts = await resolved.provider.generate(request)
        title = clean_title("".join(p.text for p in parts if isinstance(p, TextDelta)))
        if not title:
            return None

        def write(s: Store) -> SessionV2 | None:
            # read and write in one transaction: a title the user sets meanwhile is never overwritten
            with s.transaction():
                if s.sessions.get(session.id).title not in DEFAULT_TITLES:
                    return None  # the user named it meanwhile
                return s.sessions.update(session.id, SessionUpdates(title=title))

        return await self._store.run(write)


    async def title_now(self, session: SessionV2, on_usage: UsageSink | None = None) -> SessionV2:
        """``chat:session:title``: name the session again from its active branch (its first
        user message and latest reply), replacing whatever title it has. SidecarError when
        there is nothing to name it from or the model fails; ``on_usage(provider_id,
        model_id, usage)`` is given the call's usage (a side call's cost)."""
        path = await self._store.run(lambda s: s.messages.path(session.id))
        user = next((m for m in path if m.role == "user" and m.text_content), None)
        reply = next((m for m in reversed(path) if m.role == "assistant" and m.text_content), None)
        if user is None:
            raise EngineError("the session has no message to name it after")
        chosen = self._settings().title_model
        provider_id = chosen.provider_id if chosen else session.provider_id
        resolved = await self._providers.resolve(provider_id, chosen.model_id if chosen else session.model_id)
        excerpt = f"User: {(user.text_content or '')[:1000]}"
        if reply is not None:
            excerpt += f"\n\nAssistant: {(reply.text_content or '')[:1000]}"
        request = ChatRequest(
            model=resolved.model,
            messages=[
                RequestMessage(role="system", parts=[TextPart(text=_PROMPT)]),
                RequestMessage(role="user", parts=[TextPart(text=excerpt)]),
            ],
            params=GenerationParams(max_tokens=64),
            stream=False,
        )
        try:
            with anyio.fail_after(TITLE_TIMEOUT_S):
                parts = await resolved.provider.generate(request)
        except TimeoutError:
            raise ProviderError(f"the model {resolved.model.id} gave no title within {TITLE_TIMEOUT_S:g}s") from None
        usage = next((p.usage for p in reversed(parts) if isinstance(p, UsageUpdate)), None)
        if on_usage is not None and usage is not None:
            await on_usage(provider_id, resolved.model.id, usage)
        title = clean_title("".join(p.text for p in parts if isinstance(p, TextDelta)))
        if not title:
            raise ProviderError(f"the model {resolved.model.id} gave no usable title")
        return await self._store.run(lambda s: s.sessions.update(session.id, SessionUpdates(title=title)))


def clean_title(raw: str) -> str:
    line = next((ln.strip() for ln in raw.strip().splitlines() if ln.strip()), "")
    if line.lower().startswith("title:"):
        line = line[6:].strip()
    line = line.strip("\"'“”‘’「」《》`*# ").rstrip("。.!！?？")
    return line[:MAX_TITLE_CHARS].strip()
