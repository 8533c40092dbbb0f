"""The App: the object that holds the process's services for the lifetime of a server.

sidecar/app.py opens it (``open_app``: the store step, then the services of
sidecar/app_services.py) and documents its attributes. Each service is attached as it opens;
until then the attribute is absent and its methods answer NOT_IMPLEMENTED (sidecar/server.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from sidecar.config import Config
from sidecar.engine.events import EventHub
from sidecar.notify import Notifier, Send

__all__ = ["App"]

if TYPE_CHECKING:
    from sidecar.acp.engines import AcpEngines
    from sidecar.channels.service import ChannelService
    from sidecar.compat.service import CompatService
    from sidecar.engine.acp_turn import AcpTurnHandler
    from sidecar.engine.approvals import ApprovalService
    from sidecar.engine.assistants import AssistantService
    from sidecar.engine.chat import ChatEngine
    from sidecar.engine.context import ContextService
    from sidecar.engine.provider_probe import ProviderProbe
    from sidecar.engine.providers import ProviderService
    from sidecar.engine.secrets import SecretsService
    from sidecar.engine.sessions import SessionService
    from sidecar.engine.settings import SettingsService
    from sidecar.engine.side import SideCalls
    from sidecar.engine.storage import StorageService
    from sidecar.engine.usage import SideUsage
    from sidecar.pipeline.builder import RequestBuilder
    from sidecar.memory.service import MemoryService
    from sidecar.memory.soul import SoulService
    from sidecar.memory.upkeep import MemoryUpkeep
    from sidecar.retrieval.service import KnowledgeService
    from sidecar.skills.service import SkillService
    from sidecar.store import AsyncStore, Store
    from sidecar.store.attachments import AttachmentStore
    from sidecar.sync.service import SyncService
    from sidecar.tasks.service import TaskService
    from sidecar.tools.mcp import McpManager
    from sidecar.tools.service import ToolService


class App:
    # attached by open_app as each service opens (absent until then: its methods answer
    # NOT_IMPLEMENTED, see sidecar/server.py)
    store: AsyncStore
    secrets: SecretsService
    sessions: SessionService
    settings: SettingsService
    providers: ProviderService
    provider_probe: ProviderProbe
    attachments: AttachmentStore
    requests: RequestBuilder
    acp_engines: AcpEngines
    acp: AcpTurnHandler
    approvals: ApprovalService
    mcp: McpManager
    tools: ToolService
    chat: ChatEngine
    side: SideCalls
    assistants: AssistantService
    context: ContextService
    compat: CompatService
    channels: ChannelService
    knowledge: KnowledgeService
    sync: SyncService
    storage: StorageService
    side_usage: SideUsage
    memory: MemoryService
    souls: SoulService
    memory_upkeep: MemoryUpkeep
    skills: SkillService
    tasks: TaskService

    def __init__(self, config: Config, data_dir: Path, send: Send) -> None:
        self.config = config
        self.data_dir = data_dir
        self.events = EventHub(send)
        self.notify = Notifier(self.events.publish)
