"""Assistant profiles and a session's context window: the types of ``assistant:*`` and
``chat:context:*`` (seed 000 sections 1, 2, 4, 7; seed 004 section 4.3).

An AssistantProfile holds what seed 000 attaches to an "assistant": its system prompt and
whether a session's own prompt may override it, regex rules, enabled tools, knowledge bases,
memory, prompt injections (modes and lorebook), the input-transformer options and the
context-window options. Sessions reference a profile (``chat:context:update``); a session
without one uses the default profile.
"""

from __future__ import annotations

from typing import Literal

import msgspec
from msgspec import UNSET, UnsetType

from protocol.limits import Id, Int64, Title
from protocol.kb import EmbeddingModelRef
from protocol.providers import DefaultModel
from protocol.types import Struct
from protocol.common import EmptyParams, SuccessResult
from protocol.common import MethodSpec

__all__ = [
    "TruncationStrategy",
    "RegexScope",
    "InjectionPosition",
    "InjectionRole",
    "RegexRule",
    "PromptInjection",
    "LorebookEntry",
    "EncoderMode",
    "MemorySettings",
    "OcrOptions",
    "TemplateOptions",
    "TransformerOptions",
    "ContextOptions",
    "AssistantProfile",
    "AssistantUpsertParams",
    "AssistantIdParams",
    "RollingSummaryInfo",
    "ContextBudgetInfo",
    "SessionContextInfo",
    "ContextGetParams",
    "ContextUpdateParams",
    "ContextCompactParams",
    "ContextCompactResult",
]

TruncationStrategy = Literal["sliding-window", "summarize-old", "smart-select"]
"""How the request copy is cut to the context threshold (seed 004 section 4.3):
``summarize-old`` (default): rolling summary of the old prefix + recent window (seed 000 §2);
``sliding-window``: the most recent messages that fit the threshold, no model call;
``smart-select``: the first exchange, the recent window, and the older whole turns that share
the most words with the latest user message, in their original order, no model call."""

RegexScope = Literal["user", "assistant", "both"]
InjectionPosition = Literal["before_system", "after_system", "top_of_chat", "bottom_of_chat", "at_depth"]
"""Where an injection goes: before/after the system prompt text, as the first/last message of
the chat, or ``depth`` messages above the end of the chat."""
InjectionRole = Literal["system", "user", "assistant"]


class RegexRule(Struct, kw_only=True):
    """A find/replace rule. ``user`` rules rewrite the text parts of user messages in the
    request copy (images and files untouched); ``assistant`` rules rewrite the text parts of
    a finished assistant reply before it is stored (seed 000 sections 1 and 7)."""

    pattern: str
    """Python ``re`` syntax."""
    replacement: str = ""
    """``\\1`` / ``\\g<name>`` refer to groups."""
    scope: RegexScope = "user"
    name: str = ""
    ignore_case: bool = False
    multiline: bool = False
    enabled: bool = True


class PromptInjection(Struct, kw_only=True):
    """A "mode": text injected into every request while it is enabled."""

    content: str
    name: str = ""
    position: InjectionPosition = "after_system"
    depth: Int64 = 0
    """For ``at_depth``: how many messages above the end (0 = after the last message)."""
    role: InjectionRole = "system"
    """Role of the injected message for the chat positions (system text for the system positions)."""
    enabled: bool = True


class LorebookEntry(Struct, kw_only=True):
    """Text injected when one of its keywords appears in the recent messages."""

    keywords: list[str]
    content: str
    name: str = ""
    position: InjectionPosition = "after_system"
    depth: Int64 = 0
    role: InjectionRole = "system"
    case_sensitive: bool = False
    scan_depth: Int64 = 4
    """How many of the last messages are searched for a keyword (1..1000)."""
    constant: bool = False
    """Always injected, keywords or not."""
    enabled: bool = True


EncoderMode = Literal["off", "propose", "auto"]
"""What the MemoryEncoder does after a completed reply: nothing; propose what it would
remember (``memory_proposed``); or remember it."""


class MemorySettings(Struct, kw_only=True):
    """Long-term memory of an assistant (sidecar/memory; README "Memory")."""

    enabled: bool = False
    """Its memories (own scope and ``global``) reach its requests, and the memory tools
    (memory_search, memory_save, memory_update, memory_forget) come first among its tools."""
    rag: bool = False
    """Retrieve at most six relevant memories per request (MemoryRetrieval, hybrid search);
    off = the basic memory text (these ``entries``, then the scope's memories, newest and
    most used first, within ``budgetTokens``) goes into the system prompt."""
    entries: list[str] = []
    """Fixed lines of the profile, always first in the basic memory text."""
    encoder: EncoderMode = "off"
    encoder_model: DefaultModel | None = None
    """The model of the encoder's side call; default: the session's model."""
    embedding_model: EmbeddingModelRef | None = None
    """Embeds this assistant's memories (and the global ones) for the vector leg of memory
    retrieval; none: lexical retrieval only."""
    save_scope: Literal["assistant", "global"] = "assistant"
    """Where memory_save and the encoder put new memories by default."""
    budget_tokens: Int64 = 1024
    """Tokens the basic memory text may take (64..32768)."""


class OcrOptions(Struct, kw_only=True):
    enabled: bool = False
    model: DefaultModel | None = None
    """A vision-capable model; default: the session's model."""
    prompt: str = "Transcribe all text in this image exactly. Reply with the text only."


class TemplateOptions(Struct, kw_only=True):
    enabled: bool = False
    template: str = "{{ message }}"
    """A sandboxed Jinja template applied to the text of each user message. Variables:
    message, role, date, time, datetime, weekday, model_id, user, assistant, index."""


class TransformerOptions(Struct, kw_only=True):
    """Switches and settings of the input transformers (seed 000 section 4)."""

    time_reminder: bool = False
    placeholders: bool = True
    document_as_prompt: bool = True
    ocr: OcrOptions = msgspec.field(default_factory=OcrOptions)
    template: TemplateOptions = msgspec.field(default_factory=TemplateOptions)
    workspace_reminder: bool = True
    knowledge_retrieval: bool = True
    memory_retrieval: bool = True
    user_name: str = ""
    """What ``{user}`` / ``{{user}}`` placeholders become."""


class ContextOptions(Struct, kw_only=True):
    compress_threshold: Int64 = 32000
    """Estimated tokens above which the old prefix is summarized (or cut); 0 or negative is
    the legacy "disabled" value and means the default 32,000."""
    truncation_strategy: TruncationStrategy = "summarize-old"
    summary_model: DefaultModel | None = None
    """Model that writes rolling summaries; default: the session's model."""
    use_soul: bool = True
    """Put the assistant's Soul.md (``assistant:soul:*``; else the global one) into the
    system prompt (seed 004 section 4.1)."""
    evolve_soul: bool = False
    """Offer the ``soul_update`` tool (with ``useSoul``): the assistant proposes an edit of
    its own Soul.md, which the user approves seeing the diff (policy ``ask`` by default)."""


class AssistantProfile(Struct, omit_defaults=False, kw_only=True):
    id: str
    name: str
    system_prompt: str = ""
    allow_session_prompt: bool = True
    """A session's own system prompt replaces this one when set."""
    regex_rules: list[RegexRule] = []
    enabled_tools: list[str] | None = None
    """The tools this assistant's replies are offered, by name (``get_current_time``,
    ``web_search``, ``workspace_read_file``, ``mcp__files__read``...) or ``mcp:<server>`` for
    every tool of an MCP server; ``read_tool_output`` and ``get_session_capabilities`` come
    with any of them. ``[]``: none of them. None: every tool the tool settings offer. The
    feature tools are not named here: the memory tools come with ``memory.enabled``,
    ``soul_update`` with ``context.evolveSoul``, ``knowledge_search`` with
    ``knowledgeBaseIds`` (``tool:list`` shows why each tool is offered). An unknown name, or
    a feature tool's, is invalid params listing the valid names."""
    knowledge_base_ids: list[str] = []
    memory: MemorySettings = msgspec.field(default_factory=MemorySettings)
    modes: list[PromptInjection] = []
    lorebook: list[LorebookEntry] = []
    transformers: TransformerOptions = msgspec.field(default_factory=TransformerOptions)
    context: ContextOptions = msgspec.field(default_factory=ContextOptions)
    is_default: bool = False
    created_at: Int64 = 0
    updated_at: Int64 = 0


class AssistantUpsertParams(Struct, forbid_unknown_fields=True, kw_only=True):
    """``assistant:upsert``: create (no id / unknown id) or replace a profile whole."""

    id: Id | None = None
    name: Title
    system_prompt: str = ""
    allow_session_prompt: bool = True
    regex_rules: list[RegexRule] = []
    enabled_tools: list[str] | None = None
    """See AssistantProfile.enabledTools (omitted or null: every tool; ``[]``: none besides
    the feature tools)."""
    knowledge_base_ids: list[str] = []
    memory: MemorySettings = msgspec.field(default_factory=MemorySettings)
    modes: list[PromptInjection] = []
    lorebook: list[LorebookEntry] = []
    transformers: TransformerOptions = msgspec.field(default_factory=TransformerOptions)
    context: ContextOptions = msgspec.field(default_factory=ContextOptions)


class AssistantIdParams(Struct, kw_only=True):
    id: Id


class RollingSummaryInfo(Struct, omit_defaults=False, kw_only=True):
    """A session's stored RollingContextSummary (seed 000 section 2)."""

    text: str
    covered_count: Int64
    """How many messages of the branch (from the root) the summary stands for."""
    last_covered_id: str
    tokens: Int64
    valid: bool
    """Its covered ids are still the prefix of the active branch."""
    updated_at: Int64


class ContextBudgetInfo(Struct, omit_defaults=False, kw_only=True):
    """What a request of the session costs in tokens, part by part (a context meter).

    ``systemPrompt`` + ``tools`` + ``messages`` is the request's input; ``reservedOutput`` is
    kept free for the reply; with a known ``contextWindow`` their sum never exceeds it (older
    messages are left out of the request first). Counted with the model's tokenizer
    (``exact``), else cl100k as an estimate."""

    context_window: Int64 | None = None
    """The model's ``contextWindow`` (None: unknown, nothing is cut for it)."""
    reserved_output: Int64 = 0
    """The request's maxTokens, else the model's maxOutputTokens, else a quarter of the
    window (at most 4,096)."""
    system_prompt: Int64 = 0
    """The system message: session or assistant prompt, Soul.md, capability notes, basic
    memories, tool prompts, the rolling summary (and, in ``lastRequest``, what the input
    transformers added: knowledge, memories, time...)."""
    summary: Int64 = 0
    """Of ``systemPrompt``: the rolling summary."""
    tools: Int64 = 0
    """The tool schemas sent with the request."""
    messages: Int64 = 0
    """The messages sent after the system prompt (attachments by their estimates)."""
    message_count: Int64 = 0
    attachments: Int64 = 0
    """Of ``messages``: the estimates of images and files."""
    total: Int64 = 0
    """systemPrompt + tools + messages + reservedOutput."""
    available: Int64 | None = None
    """contextWindow - total (None without a window)."""
    threshold: Int64 = 0
    """The summarize threshold in effect: the smaller of compressThreshold and what fits."""
    dropped: Int64 = 0
    """Messages of the planned window left out so the request fits (a ``context_trimmed``
    notice said so)."""
    exact: bool = True
    """False: the model's own tokenizer is not known; counts are cl100k estimates."""
    model_id: str = ""


class SessionContextInfo(Struct, omit_defaults=False, kw_only=True):
    session_id: str
    assistant_id: str
    """The profile in effect (the session's, else the default)."""
    session_assistant_id: str | None = None
    """The profile the session chose, if any."""
    truncation_strategy: TruncationStrategy
    """In effect: the session's choice, else the profile's."""
    session_truncation_strategy: TruncationStrategy | None = None
    threshold: Int64
    summary: RollingSummaryInfo | None = None
    budget: ContextBudgetInfo | None = None
    """The next request of the active branch as it would be planned now (its system prompt,
    tools, summary and window; no model is called, input transformers are not run)."""
    last_request: ContextBudgetInfo | None = None
    """The last request this process built for the session (transformers included); None
    before the first one."""


class ContextGetParams(Struct, kw_only=True):
    session_id: Id


class ContextUpdateParams(Struct, forbid_unknown_fields=True, kw_only=True):
    """A field left out keeps the session's choice; ``null`` (or ``""``) inherits again."""

    session_id: Id
    assistant_id: Id | None | UnsetType = UNSET
    """null or "" goes back to the default profile."""
    truncation_strategy: TruncationStrategy | Literal[""] | None | UnsetType = UNSET
    """null or "" goes back to the profile's strategy."""


class ContextCompactParams(Struct, kw_only=True):
    """``chat:context:compact``: summarize the old part of the active branch now."""

    session_id: Id
    target_tokens: Int64 | None = None
    """Size the context should have afterwards (default: the threshold); the recent window
    keeps 55% of it."""
    instructions: str | None = None
    """Extra requirements for the summary ("keep every file name", ...)."""


class ContextCompactResult(Struct, omit_defaults=False, kw_only=True):
    compacted: bool
    """False when there was nothing to summarize (fewer than four messages, or the recent
    window already starts at the summary's end)."""
    summary: RollingSummaryInfo | None = None
    window_count: Int64
    """Messages sent verbatim after the summary."""
    tokens_before: Int64
    tokens_after: Int64


METHODS: dict[str, MethodSpec] = {
    "assistant:list": MethodSpec(EmptyParams, list[AssistantProfile], "Assistant profiles, the default marked."),
    "assistant:get": MethodSpec(AssistantIdParams, AssistantProfile, "One assistant profile."),
    "assistant:upsert": MethodSpec(
        AssistantUpsertParams, AssistantProfile, "Create or replace an assistant profile (validated)."
    ),
    "assistant:delete": MethodSpec(
        AssistantIdParams, SuccessResult, "Delete a profile (not the default; its sessions fall back to the default)."
    ),
    "assistant:setDefault": MethodSpec(
        AssistantIdParams, SuccessResult, "The profile of sessions that did not choose one."
    ),
    "chat:context:get": MethodSpec(
        ContextGetParams, SessionContextInfo, "A session's profile, truncation strategy and rolling summary."
    ),
    "chat:context:update": MethodSpec(
        ContextUpdateParams, SessionContextInfo, "Choose a session's assistant profile and truncation strategy."
    ),
    "chat:context:compact": MethodSpec(
        ContextCompactParams, ContextCompactResult,
        "Summarize the old part of the active branch now (target size, extra instructions).",
    ),
}
"""The methods of this domain (see ``protocol.methods``)."""
