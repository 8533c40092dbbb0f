"""The notification table: every notification the sidecar sends, one Notification each.

A Notification carries its method name and its params type (the type argument), so a
sender names one of these objects and mypy checks the payload it sends with it
(``sidecar/notify.py``). ``protocol.methods.NOTIFICATIONS`` is built from ``SENT`` (plus
the client's ``$/cancelRequest``): the generated schema and TypeScript come from here.
A new notification is declared here and added to ``CORE`` or ``DOMAINS``.
"""

from __future__ import annotations

from typing import Any

from protocol.channels import ChannelReplyParams
from protocol.chat import SuggestionsParams
from protocol.common import Notification, ProgressParams
from protocol.events import ChatStreamEvent
from protocol.memory import MemoryProposal
from protocol.memory_upkeep import MemoryMerge
from protocol.skills import SkillProposal
from protocol.sync import ServerStatus
from protocol.tasks import TaskRun
from protocol.types import SessionV2

__all__ = [
    "CHAT_STREAM",
    "SESSION_UPDATED",
    "CHANNEL_REPLY",
    "SUGGESTIONS",
    "PROGRESS",
    "SERVER_STATUS_UPDATED",
    "MEMORY_PROPOSED",
    "TASK_FIRED",
    "TASK_FINISHED",
    "MEMORY_CONSOLIDATION_PROPOSED",
    "SKILL_PROPOSED",
    "CORE",
    "DOMAINS",
    "SENT",
]

CHAT_STREAM: Notification[ChatStreamEvent] = Notification(
    "chat:stream", ChatStreamEvent, "One streaming event of a reply."
)
SESSION_UPDATED: Notification[SessionV2] = Notification(
    "chat:session:updated", SessionV2, "A session changed outside a request of the renderer (title, counters)."
)
CHANNEL_REPLY: Notification[ChannelReplyParams] = Notification(
    "channel:reply", ChannelReplyParams, "Deliver chunks of a reply to an IM chat; answer with channel:ack."
)
SUGGESTIONS: Notification[SuggestionsParams] = Notification(
    "chat:suggestions", SuggestionsParams, "Follow-up questions proposed for a finished reply (stored with it)."
)
PROGRESS: Notification[ProgressParams] = Notification(
    "sidecar:progress", ProgressParams, "Progress of a long request, under the caller's progressToken."
)
SERVER_STATUS_UPDATED: Notification[ServerStatus] = Notification(
    "server:status:updated", ServerStatus, "The server account's state changed (auth required, a sync finished)."
)
MEMORY_PROPOSED: Notification[MemoryProposal] = Notification(
    "memory_proposed", MemoryProposal,
    "The MemoryEncoder (mode propose) would remember this; answer with memory:accept or memory:reject.",
)
TASK_FIRED: Notification[TaskRun] = Notification(
    "task_fired", TaskRun, "A task's run started (its session and reply ids once sent)."
)
TASK_FINISHED: Notification[TaskRun] = Notification(
    "task_finished", TaskRun, "A task's run ended (completed, error, aborted, skipped...)."
)
MEMORY_CONSOLIDATION_PROPOSED: Notification[MemoryMerge] = Notification(
    "memory_consolidation_proposed", MemoryMerge,
    "memory:consolidate (mode propose) would merge these; answer with memory:consolidation:accept or reject.",
)
SKILL_PROPOSED: Notification[SkillProposal] = Notification(
    "skill_proposed", SkillProposal, "The model proposes a skill; answer with skill:accept or skill:reject."
)

CORE: tuple[Notification[Any], ...] = (CHAT_STREAM, SESSION_UPDATED, CHANNEL_REPLY, SUGGESTIONS, PROGRESS)
"""The notifications of chat itself (the table lists them first, then the client's
``$/cancelRequest``, then the domains')."""
DOMAINS: tuple[Notification[Any], ...] = (
    SERVER_STATUS_UPDATED, MEMORY_PROPOSED, TASK_FIRED, TASK_FINISHED, MEMORY_CONSOLIDATION_PROPOSED, SKILL_PROPOSED,
)
"""The notifications of the sync, memory, task and skill domains."""
SENT: tuple[Notification[Any], ...] = CORE + DOMAINS
"""Every notification the sidecar sends, in the order of the table."""
