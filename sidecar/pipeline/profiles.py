"""ProfileResolver: the assistant profile and truncation strategy in effect for a session.

A session uses the profile it chose (``session_context.assistant_id``) if that profile still
exists, else the default profile; its truncation strategy is its own choice, else the
profile's ``context.truncationStrategy``. Blocking (two small reads): worker thread.
"""

from __future__ import annotations

from typing import cast

import msgspec

from protocol.context import AssistantProfile, TruncationStrategy
from sidecar.store.assistants import AssistantRepo
from sidecar.store.context import ContextRepo

__all__ = ["ProfileResolver", "SessionProfile", "STRATEGIES"]

STRATEGIES = ("sliding-window", "summarize-old", "smart-select")


class SessionProfile(msgspec.Struct, kw_only=True):
    assistant: AssistantProfile
    strategy: TruncationStrategy
    session_assistant_id: str | None = None
    session_strategy: TruncationStrategy | None = None


class ProfileResolver:
    def __init__(self, assistants: AssistantRepo, context: ContextRepo) -> None:
        self.assistants = assistants
        self.context = context

    def for_session(self, session_id: str) -> SessionProfile:
        assistant_id, strategy = self.context.get_session_settings(session_id)
        profile = self.assistants.resolve(assistant_id)
        own = cast(TruncationStrategy, strategy) if strategy in STRATEGIES else None
        return SessionProfile(
            assistant=profile,
            strategy=own or profile.context.truncation_strategy,
            session_assistant_id=assistant_id,
            session_strategy=own,
        )
