"""The input transformers, in the seed's order (seed 000 section 4).

``TRANSFORMER_ORDER`` names them; ``default_transformers()`` builds one instance of each in
that order (after UserRegex, which applies the assistant's user-input regex rules the way
the seed applies them to the input before anything else); ``run_transformers`` feeds each
enabled one the previous one's output and records which changed the request.

| order | transformer | module |
| --- | --- | --- |
| 1 | TimeReminder | time_reminder.py |
| 2 | PromptInjection (modes, lorebook) | prompt_injection.py |
| 3 | Placeholder | placeholder.py |
| 4 | DocumentAsPrompt | document.py |
| 5 | Ocr | ocr.py |
| 6 | Template | template.py |
| 7 | WorkspaceReminder | workspace.py |
| 8 | KnowledgeRetrieval | knowledge.py |
| 9 | MemoryRetrieval | retrieval.py |
"""

from __future__ import annotations

from collections.abc import Sequence

from sidecar.pipeline.transformers.base import Draft, InputTransformer, TransformContext
from sidecar.pipeline.transformers.document import DocumentAsPromptTransformer
from sidecar.pipeline.transformers.ocr import OcrTransformer
from sidecar.pipeline.transformers.placeholder import PlaceholderTransformer
from sidecar.pipeline.transformers.prompt_injection import PromptInjectionTransformer
from sidecar.pipeline.transformers.regex import UserRegexTransformer
from sidecar.pipeline.transformers.knowledge import KnowledgeRetrievalTransformer
from sidecar.pipeline.transformers.retrieval import MemoryRetrievalTransformer
from sidecar.pipeline.transformers.template import TemplateTransformer
from sidecar.pipeline.transformers.time_reminder import TimeReminderTransformer
from sidecar.pipeline.transformers.workspace import WorkspaceReminderTransformer

__all__ = ["TRANSFORMER_ORDER", "default_transformers", "run_transformers", "Draft", "TransformContext"]

TRANSFORMER_ORDER = (
    "TimeReminder",
    "PromptInjection",
    "Placeholder",
    "DocumentAsPrompt",
    "Ocr",
    "Template",
    "WorkspaceReminder",
    "KnowledgeRetrieval",
    "MemoryRetrieval",
)


def default_transformers() -> list[InputTransformer]:
    return [
        UserRegexTransformer(),
        TimeReminderTransformer(),
        PromptInjectionTransformer(),
        PlaceholderTransformer(),
        DocumentAsPromptTransformer(),
        OcrTransformer(),
        TemplateTransformer(),
        WorkspaceReminderTransformer(),
        KnowledgeRetrievalTransformer(),
        MemoryRetrievalTransformer(),
    ]


async def run_transformers(
    drafts: list[Draft], ctx: TransformContext, transformers: Sequence[InputTransformer]
) -> list[Draft]:
    for transformer in transformers:
        if not transformer.enabled(ctx):
            continue
        result = await transformer.transform(drafts, ctx)
        if result is not drafts and result != drafts:
            ctx.applied.append(transformer.name)
        drafts = result
    return drafts
