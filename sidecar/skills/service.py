"""SkillService: the ``skill:*`` methods and the automatic skill proposals.

Owns: validation (a SKILL.md breaking the manifest rules is INVALID_PARAMS naming
``content`` or the front matter field; a skill name that exists is BAD_STATE; a read-only
skill cannot be written: BAD_STATE; an unknown one NOT_FOUND), the disk work in worker
threads (library.py, archive.py), and the proposals: ``skill:propose`` (the host asks, for a
completed reply with at least one tool call) and, with ``autoPropose``, the same in the
background after every completed reply with at least ``minToolCalls`` tool calls (the
ChatEngine's completed-reply hook; in this service's task group, cancelled on exit; at most
one proposal per reply). A proposal is a row and ``skill_proposed``; ``skill:accept`` writes
the skill (its content checked again, optionally edited), ``skill:reject`` drops it.
"""

from __future__ import annotations

import base64
import binascii
import logging
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import msgspec

from protocol.common import EmptyParams, IdParams, NameParams, SuccessResult
from protocol.errors import ErrorCode
from protocol.skills import (
    SkillAcceptParams,
    SkillCreateParams,
    SkillDetail,
    SkillExportResult,
    SkillImportParams,
    SkillInfo,
    SkillProposal,
    SkillProposalListParams,
    SkillProposeParams,
    SkillProposeResult,
    SkillSettings,
    SkillSettingsUpdate,
    SkillUpdateParams,
)
from protocol.types import MessageV2
from sidecar.errors import InvalidParams, NotFound, SidecarError
from sidecar.providers.calls import ModelResolver, UsageSink
from sidecar.skills.archive import ArchiveRefused, SkillExists, pack, unpack
from sidecar.skills.library import Found, SkillLibrary
from sidecar.skills.manifest import Manifest, ManifestError, parse_manifest
from sidecar.skills.proposer import SkillProposer, tool_calls_of
from sidecar.store.async_store import AsyncStore
from sidecar.notify import Notifier
from protocol.notifications import SKILL_PROPOSED

if TYPE_CHECKING:
    from sidecar.engine.chat import ChatEngine

__all__ = ["SkillService", "SETTINGS_KEY", "open_skills"]

log = logging.getLogger(__name__)

SETTINGS_KEY = "skills.settings"
_settings = msgspec.json.Decoder(SkillSettings)


def _bad_state(message: str, **data: Any) -> SidecarError:
    return SidecarError(message, code=ErrorCode.BAD_STATE, data=data or None)


def _invalid(exc: ManifestError) -> InvalidParams:
    field = "content" if exc.field == "content" else f"content.{exc.field}"
    return InvalidParams(f"invalid params: {exc.message} - at `$.{field}`")


class SkillService:
    def __init__(
        self,
        *,
        store: AsyncStore,
        data_dir: Path,
        skills_dirs: Callable[[], list[str]],
        notify: Notifier,
        providers: ModelResolver,
        usage: UsageSink | None,
    ) -> None:
        self._store = store
        self._data_dir = data_dir
        self._skills_dirs = skills_dirs
        self._notify = notify
        self._proposer = SkillProposer(providers, usage)
        self.settings = SkillSettings()
        self._tg: anyio.abc.TaskGroup | None = None
        self._proposing: set[str] = set()

    async def load(self) -> None:
        raw = await self._store.run(lambda s: s.settings.get(SETTINGS_KEY))
        if raw:
            try:
                self.settings = _settings.decode(raw)
            except (msgspec.DecodeError, msgspec.ValidationError):
                log.warning("the stored skill settings are unreadable; using the defaults")

    def start(self, task_group: anyio.abc.TaskGroup) -> None:
        self._tg = task_group

    def _library(self) -> SkillLibrary:
        return SkillLibrary(self._data_dir, self._skills_dirs())

    async def _find(self, name: str) -> Found:
        found = await anyio.to_thread.run_sync(self._library().find, name)
        if found is None:
            raise NotFound(f"no skill named {name!r}", data={"name": name})
        return found

    async def _managed(self, name: str) -> Found:
        found = await self._find(name)
        if found.info.read_only:
            raise _bad_state(f"skill {name!r} is read-only (it is in a configured skills folder: {found.folder})",
                             name=name)
        return found

    # ---- skill:* ---------------------------------------------------------------------------

    async def list_skills(self, params: EmptyParams) -> list[SkillInfo]:
        return [f.info for f in await anyio.to_thread.run_sync(self._library().scan)]

    async def get_skill(self, params: NameParams) -> SkillDetail:
        found = await self._find(params.name)
        content, files = await anyio.to_thread.run_sync(self._library().content, found)
        return SkillDetail(skill=found.info, content=content, files=files)

    async def create_skill(self, params: SkillCreateParams) -> SkillInfo:
        return await self._create(params.content)

    async def _create(self, content: str) -> SkillInfo:
        manifest = _manifest(content)
        library = self._library()

        def write() -> SkillInfo:
            if library.find(manifest.name) is not None or (library.managed / manifest.name).exists():
                raise _bad_state(f"a skill named {manifest.name!r} exists already", name=manifest.name)
            library.write(manifest.name, content, new=True)
            found = library.find(manifest.name)
            assert found is not None
            return found.info

        return await anyio.to_thread.run_sync(write)

    async def update_skill(self, params: SkillUpdateParams) -> SkillInfo:
        manifest = _manifest(params.content)
        if manifest.name != params.name:
            raise InvalidParams(f"invalid params: the front matter's name {manifest.name!r} is not the skill's "
                                f"({params.name!r}); a skill cannot be renamed - at `$.content.name`")
        found = await self._managed(params.name)
        library = self._library()

        def write() -> SkillInfo:
            library.write(found.folder.name, params.content, new=False)
            again = library.find(params.name)
            assert again is not None
            return again.info

        return await anyio.to_thread.run_sync(write)

    async def delete_skill(self, params: NameParams) -> SuccessResult:
        found = await self._managed(params.name)
        await anyio.to_thread.run_sync(self._library().remove, found)
        return SuccessResult()

    async def import_skill(self, params: SkillImportParams) -> SkillInfo:
        try:
            data = base64.b64decode(params.data, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidParams("invalid params: data is not base64 - at `$.data`") from None
        library = self._library()

        def run() -> SkillInfo:
            read_only = {f.info.name for f in library.scan() if f.info.read_only}
            try:
                manifest = unpack(data, library.managed, replace=params.replace, taken=read_only)
            except SkillExists as exc:
                raise _bad_state(str(exc), name=exc.name) from None
            except ArchiveRefused as exc:
                raise InvalidParams(f"invalid params: the archive was refused: {exc} - at `$.data`") from None
            except ManifestError as exc:
                raise InvalidParams(f"invalid params: the archive's SKILL.md: {exc.message} - at `$.data`") from None
            found = library.find(manifest.name)
            assert found is not None
            return found.info

        return await anyio.to_thread.run_sync(run)

    async def export_skill(self, params: NameParams) -> SkillExportResult:
        found = await self._find(params.name)
        try:
            data = await anyio.to_thread.run_sync(pack, found.folder, found.info.name)
        except ArchiveRefused as exc:
            raise _bad_state(str(exc), name=params.name) from None
        return SkillExportResult(name=found.info.name, data=base64.b64encode(data).decode("ascii"), bytes=len(data))

    # ---- settings ---------------------------------------------------------------------------

    async def get_settings(self, params: EmptyParams) -> SkillSettings:
        return self.settings

    async def update_settings(self, params: SkillSettingsUpdate) -> SkillSettings:
        changes = {f: getattr(params, f) for f in ("auto_propose", "min_tool_calls", "model")
                   if getattr(params, f) is not msgspec.UNSET}
        settings = msgspec.structs.replace(self.settings, **changes)
        encoded = msgspec.json.encode(settings).decode()
        await self._store.run(lambda s: s.settings.set(SETTINGS_KEY, encoded))
        self.settings = settings
        return settings

    # ---- proposals -----------------------------------------------------------------------------

    async def propose(self, params: SkillProposeParams) -> SkillProposeResult:
        session = await self._store.run(lambda s: s.sessions.get(params.session_id))
        path = await self._store.run(lambda s: s.messages.path(session.id, params.message_id))
        reply = next((m for m in reversed(path) if m.role == "assistant"), None)
        if reply is None or (params.message_id is not None and reply.id != params.message_id):
            wanted = f"reply {params.message_id!r}" if params.message_id else "assistant reply"
            raise NotFound(f"no {wanted} in session {session.id!r} - at `$.messageId`")
        if reply.status != "completed":
            raise _bad_state(f"reply {reply.id!r} is {reply.status}: only a completed reply can become a skill")
        if not tool_calls_of(reply):
            raise _bad_state(f"reply {reply.id!r} called no tool: there is no procedure to make a skill of")
        return await self._propose(session.id, path, reply, session.provider_id, session.model_id)

    async def _propose(self, session_id: str, path: list[MessageV2], reply: MessageV2, provider_id: str,
                       model_id: str) -> SkillProposeResult:
        user = next((m for m in reversed(path) if m.role == "user" and m.created_at <= reply.created_at), None)
        chosen = self.settings.model
        drafted = await self._proposer.draft(
            session_id=session_id, user=user, reply=reply,
            provider_id=chosen.provider_id if chosen else provider_id, model_id=chosen.model_id if chosen else model_id,
        )
        if drafted.manifest is None:
            return SkillProposeResult(reason=drafted.reason)
        manifest = drafted.manifest
        proposal = await self._store.run(lambda s: s.skills.add(
            session_id=session_id, message_id=reply.id, name=manifest.name, description=manifest.description,
            content=drafted.content, reason=drafted.reason[:2000]))
        await self._notify(SKILL_PROPOSED, proposal)
        log.info("skill proposal %s (%s) for reply %s", proposal.id, proposal.name, reply.id)
        return SkillProposeResult(proposal=proposal, reason=drafted.reason)

    def reply_completed(self, session_id: str, job: Any) -> None:
        """ChatEngine's completed-reply hook: with ``autoPropose``, a reply with at least
        ``minToolCalls`` tool calls is read for a proposal in the background."""
        if not self.settings.auto_propose or self._tg is None or job.message_id in self._proposing:
            return
        self._proposing.add(job.message_id)
        self._tg.start_soon(self._auto, session_id, job.message_id, job.provider_id, job.model_id)

    async def _auto(self, session_id: str, message_id: str, provider_id: str, model_id: str) -> None:
        try:
            path = await self._store.run(lambda s: s.messages.path(session_id, message_id))
            reply = path[-1] if path and path[-1].id == message_id else None
            if reply is None or len(tool_calls_of(reply)) < self.settings.min_tool_calls:
                return
            result = await self._propose(session_id, path, reply, provider_id, model_id)
            if result.proposal is None:
                log.info("no skill proposed for reply %s: %s", message_id, result.reason)
        except anyio.get_cancelled_exc_class():
            raise
        except SidecarError as exc:
            log.warning("skill proposal for reply %s failed: %s", message_id, exc.message)
        except Exception:
            log.exception("skill proposal for reply %s failed", message_id)
        finally:
            self._proposing.discard(message_id)

    async def list_proposals(self, params: SkillProposalListParams) -> list[SkillProposal]:
        return await self._store.run(lambda s: s.skills.pending(params.session_id, params.limit))

    async def accept(self, params: SkillAcceptParams) -> SkillInfo:
        proposal = await self._store.run(lambda s: s.skills.get(params.id))
        if proposal.status != "pending":
            raise _bad_state(f"skill proposal {params.id!r} was {proposal.status} already", proposalId=params.id)
        info = await self._create(params.content if params.content is not None else proposal.content)
        if not await self._store.run(lambda s: s.skills.decide(params.id, "accepted")):
            log.warning("skill proposal %s was decided while its skill was written; the skill stays", params.id)
        return info

    async def reject(self, params: IdParams) -> SuccessResult:
        proposal = await self._store.run(lambda s: s.skills.get(params.id))
        if proposal.status != "pending" or not await self._store.run(lambda s: s.skills.decide(params.id, "rejected")):
            raise _bad_state(f"skill proposal {params.id!r} was {proposal.status} already", proposalId=params.id)
        return SuccessResult()


def _manifest(content: str) -> Manifest:
    try:
        return parse_manifest(content)
    except ManifestError as exc:
        raise _invalid(exc) from None


async def open_skills(
    stack: AsyncExitStack,
    *,
    store: AsyncStore,
    data_dir: Path,
    skills_dirs: Callable[[], list[str]],
    notify: Notifier,
    providers: ModelResolver,
    usage: UsageSink | None,
    chat: ChatEngine,
) -> SkillService:
    """The App's SkillService: its proposals run in a task group entered on ``stack`` (after
    the chat engine's, so cancelled on exit before the engine closes), fed by the engine's
    completed-reply hook."""
    service = SkillService(
        store=store, data_dir=data_dir, skills_dirs=skills_dirs, notify=notify, providers=providers, usage=usage
    )
    await service.load()
    task_group = await stack.enter_async_context(anyio.create_task_group())
    stack.callback(task_group.cancel_scope.cancel)
    service.start(task_group)
    chat.on_completed.append(service.reply_completed)
    return service
