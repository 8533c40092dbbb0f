"""``storage:*``: the files the sidecar keeps in the data dir.

``storage:gc`` finishes the removals that deletes left pending (a crash in the middle of a
delete) and removes orphans: entries of ``attachments/``, ``tool_outputs/`` and ``acp/`` in
the data dir that no stored row owns any more. The same pass runs in the background at
every start.
"""

from __future__ import annotations

from protocol.common import MethodSpec
from protocol.limits import Int64
from protocol.common import ProgressToken
from protocol.types import Struct

__all__ = ["StorageGcParams", "StorageGcResult"]


class StorageGcParams(Struct, kw_only=True):
    progress_token: ProgressToken | None = None
    """When given, ``sidecar:progress`` notifications with this token report the pass
    (``begin``, ``report`` per batch of files looked at, ``end``)."""
    grace_ms: Int64 | None = None
    """Orphans modified more recently than this are kept (default 600000: a file is
    written shortly before the row that owns it is stored). 0 removes every orphan."""


class StorageGcResult(Struct, omit_defaults=False, kw_only=True):
    files: Int64
    """Files removed (a removed directory counts the files in it)."""
    bytes: Int64
    """Bytes they held."""
    pending: Int64 = 0
    """Of those, the files of earlier deletes whose removal had not finished."""


METHODS: dict[str, MethodSpec] = {
    "storage:gc": MethodSpec(
        StorageGcParams, StorageGcResult,
        "Finish pending file removals and remove orphaned files of the data dir; what it freed.",
    ),
}
"""The methods of this domain (see ``protocol.methods``)."""
