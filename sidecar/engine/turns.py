"""TurnWriter: the synchronous database side of send / regenerate / editResend.

Each method is split in two so a request costs two worker-thread hops, not one per
query: ``check_*`` validates everything (session, mode, input, target message) and
decodes attachments, touching no rows and no files, so bad input never disturbs a
running generation and a send refused later (busy, deleted session, no ACP) leaves
nothing behind; ``write`` then stores the new messages once the engine has stopped the
session's running job: the attachment files first, then the rows that own them in one
transaction, and the files are removed again if that transaction fails. Both take the
Store and run inside ``AsyncStore.run`` (a send on an idle session makes both in one hop).
"""

from __future__ import annotations

from typing import Any

import msgspec

from protocol.chat import EditResendParams, RegenerateOptions, RegenerateParams, SendParams, UserInput
from protocol.providers import ReasoningLevel
from protocol.types import FilePart, ImagePart, MessageV2, SessionV2, TextPart
from sidecar.errors import EngineError, InvalidParams, NotFound
from sidecar.store.attachments import AttachmentStore, PreparedInput
from sidecar.store.messages import ACTIVE_LEAF
from sidecar.store.store import Store


class Turn(msgspec.Struct, kw_only=True):
    """What a checked request will store: a user message (or not) and a reply under it."""

    session: SessionV2
    user_input: PreparedInput | None = None
    """Content of the new user message (attachments not on disk yet); None for regenerate."""
    parent_id: str | None
    """Parent of the new user message (send/edit) or of the new reply (regenerate)."""
    provider_id: str
    model_id: str
    temperature: float | None = None
    reasoning: ReasoningLevel | None = None
    tools: bool = True


class TurnWriter:
    def __init__(self, attachments: AttachmentStore) -> None:
        self._attachments = attachments

    # -- checks (no rows written) -------------------------------------------------------

    def check_send(self, store: Store, params: SendParams) -> Turn:
        session = store.sessions.get(params.session_id)
        options = params.options
        if options is not None and session.mode == "acp" and _overrides(options):
            raise InvalidParams(
                "invalid params: per-send options are for direct-mode sessions (an ACP agent "
                "chooses its own model and tools) - at `$.options`"
            )
        _check_options(options)
        stored = self._attachments.prepare_input(params.input)
        return Turn(
            session=session,
            user_input=stored,
            parent_id=session.active_leaf_id,
            provider_id=(options.provider_id if options else None) or session.provider_id,
            model_id=(options.model_id if options else None) or session.model_id,
            temperature=options.temperature if options else None,
            reasoning=options.reasoning if options else None,
            tools=options.tools is not False if options else True,
        )

    def check_regenerate(self, store: Store, params: RegenerateParams) -> Turn:
        session = store.sessions.get(params.session_id)
        target = self._regenerate_target(store, session, params.message_id)
        if target.parent_id is None:
            raise EngineError("this assistant message has no user message to answer")
        options = params.options
        if options is not None and session.mode == "acp" and (options.reasoning is not None or options.tools is not None):
            raise InvalidParams(
                "invalid params: reasoning and tools options are for direct-mode sessions - at `$.options`"
            )
        _check_options(options)
        return Turn(
            session=session,
            parent_id=target.parent_id,
            provider_id=(options.provider_id if options else None) or session.provider_id,
            model_id=(options.model_id if options else None) or session.model_id,
            temperature=options.temperature if options else None,
            reasoning=options.reasoning if options else None,
            tools=options.tools is not False if options else True,
        )

    def check_edit(self, store: Store, params: EditResendParams) -> Turn:
        session = store.sessions.get(params.session_id)
        original = _message_of(store, session.id, params.message_id, "messageId")
        if original.role != "user":
            raise InvalidParams("invalid params: messageId must be a user message - at `$.messageId`")
        # the original's images and files stay; only the text is replaced
        kept = [p for p in original.parts or [] if isinstance(p, (ImagePart, FilePart))]
        content: str | list[Any] = params.new_content
        if kept:
            content = [TextPart(text=params.new_content), *kept]
        return Turn(
            session=session,
            user_input=self._attachments.prepare_input(UserInput(content=content)),
            parent_id=original.parent_id,
            provider_id=session.provider_id,
            model_id=session.model_id,
        )

    # -- writes ---------------------------------------------------------------------------

    def write(self, store: Store, turn: Turn, *, after_active_leaf: bool) -> tuple[MessageV2 | None, MessageV2]:
        """Store the turn's user message (if any) and a pending reply; both become active.

        ``after_active_leaf``: a send continues the branch as it is *now* (a stopped job may
        have just finished its reply), so it re-reads the active leaf instead of trusting the
        one seen at check time.
        """
        user = None
        parent = turn.parent_id
        stored = self._attachments.write(turn.user_input) if turn.user_input is not None else None
        try:
            with store.transaction():  # both messages or neither (and the files they own)
                if stored is not None:
                    user = store.messages.append(
                        turn.session.id,
                        role="user",
                        parent_id=ACTIVE_LEAF if after_active_leaf else parent,
                        content_type=stored.content_type,
                        text_content=stored.text_content,
                        parts=stored.parts,
                    )
                    parent = user.id
                reply = store.messages.append(
                    turn.session.id,
                    role="assistant",
                    parent_id=parent,
                    status="pending",
                    model_id=turn.model_id or None,
                )
        except BaseException:
            if stored is not None:
                self._attachments.discard(stored)
            raise
        return user, reply

    # -- internals ------------------------------------------------------------------------

    # both modes store their turns the same way; ChatEngine picks the driver (and checks
    # what ACP needs, e.g. session/fork for a new branch) by session.mode

    def _regenerate_target(self, store: Store, session: SessionV2, message_id: str | None) -> MessageV2:
        if message_id is not None:
            target = _message_of(store, session.id, message_id, "messageId")
            if target.role != "assistant":
                raise InvalidParams(
                    "invalid params: messageId must be an assistant message - at `$.messageId`"
                )
            return target
        for message in reversed(store.messages.path(session.id)):
            if message.role == "assistant":
                return message
        raise EngineError("there is no assistant reply to regenerate in this session")


def _overrides(options: RegenerateOptions) -> bool:
    return any(getattr(options, f) is not None for f in options.__struct_fields__)


def _check_options(options: RegenerateOptions | None) -> None:
    if options is None:
        return
    if options.temperature is not None and not 0 <= options.temperature <= 2:
        raise InvalidParams("invalid params: temperature must be between 0 and 2 - at `$.options.temperature`")


def _message_of(store: Store, session_id: str, message_id: str, field: str) -> MessageV2:
    try:
        message = store.messages.get(message_id)
    except NotFound:
        raise NotFound(f"{field}: no message {message_id!r}") from None
    if message.session_id != session_id:
        raise NotFound(f"{field}: message {message_id!r} is not in session {session_id!r}")
    return message
