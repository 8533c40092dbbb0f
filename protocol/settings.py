"""``settings:*``: engine settings (titles, streaming cadence, default generation params).
"""

from __future__ import annotations

from msgspec import UNSET, UnsetType

from protocol.limits import Int64
from protocol.providers import DefaultModel, ReasoningLevel
from protocol.types import Struct
from protocol.common import EmptyParams
from protocol.common import MethodSpec

__all__ = [
    "ChatSettings",
    "ChatSettingsUpdate",
]


class ChatSettings(Struct, omit_defaults=False, kw_only=True):
    """Engine settings (``settings:get`` / ``settings:update``)."""

    generate_titles: bool = True
    """After the first exchange, name the session with a short model call."""
    title_model: DefaultModel | None = None
    """Model for titles; default: the session's own model, and for an ACP session (its agent
    engine cannot be asked on the side) the default provider and model
    (``provider:setDefault``) when that is a direct provider."""
    generate_suggestions: bool = False
    """After a completed reply, propose up to 3 short follow-up questions with a side call
    (in the language of the conversation): stored as the reply's ``suggestions`` and sent as
    ``chat:suggestions``. A new send, regenerate, edit or abort on the session cancels it."""
    suggestion_model: DefaultModel | None = None
    """Model for suggestions; default: the session's own model."""
    summary_every: Int64 = 0
    """Write the session's ``summary`` with a side call after every N exchanges of the active
    branch (0 = never automatically; ``chat:session:summarize`` works either way). A summary
    the user wrote is never replaced automatically."""
    summary_model: DefaultModel | None = None
    """Model for session summaries; default: the session's own model."""
    delta_coalesce_ms: Int64 = 40
    """Text/thinking deltas after the first are merged for this long (0 = every delta)."""
    persist_interval_ms: Int64 = 250
    """Partial content of a streaming reply is written at least this often."""
    max_tokens: Int64 | None = None
    """The output limit of a reply (at most the model's ``maxOutputTokens``); None: the
    model's ``maxOutputTokens``, else a quarter of its context window (at most 4,096), else
    the provider's own default."""
    reasoning: ReasoningLevel | None = None
    temperature: float | None = None
    top_p: float | None = None


class ChatSettingsUpdate(Struct, forbid_unknown_fields=True, kw_only=True):
    """Fields of ChatSettings to change; unknown fields are invalid params. A field left
    out keeps its value; ``null`` resets it to its default (``maxTokens: null``: the context
    budget's reserved output, from the model's maximum output or its context window)."""

    generate_titles: bool | None | UnsetType = UNSET
    title_model: DefaultModel | None | UnsetType = UNSET
    generate_suggestions: bool | None | UnsetType = UNSET
    suggestion_model: DefaultModel | None | UnsetType = UNSET
    summary_every: Int64 | None | UnsetType = UNSET
    summary_model: DefaultModel | None | UnsetType = UNSET
    delta_coalesce_ms: Int64 | None | UnsetType = UNSET
    persist_interval_ms: Int64 | None | UnsetType = UNSET
    max_tokens: Int64 | None | UnsetType = UNSET
    reasoning: ReasoningLevel | None | UnsetType = UNSET
    temperature: float | None | UnsetType = UNSET
    top_p: float | None | UnsetType = UNSET


METHODS: dict[str, MethodSpec] = {
    "settings:get": MethodSpec(EmptyParams, ChatSettings, "Engine settings."),
    "settings:update": MethodSpec(ChatSettingsUpdate, ChatSettings, "Change engine settings."),
}
"""The methods of this domain (see ``protocol.methods``)."""
