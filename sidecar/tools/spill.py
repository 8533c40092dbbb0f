"""Large tool outputs (seed 000 section 8): over 32 KiB of text goes to a file.

A result whose UTF-8 text exceeds SPILL_BYTES is written whole to
``tool_outputs/<session tag>-<tool call id>.txt`` under the session's workspace (when it
has one, so the workspace tools can read it) or else under the data dir; the message
keeps a 4 KiB preview (cut on a character boundary) and an instruction naming the file
and the tool that reads it.

Names (``spill_name``): the session tag is a hash of the session id, so a session's
files can only ever be named from that session: ``read_tool_output`` computes the name
from its own session and the id the model gives, and no id reaches another session's
output (providers that number their calls ``call_0``, ``call_1``... give two sessions the
same ids: each keeps its own file). The tool call id is untrusted: anything outside
``[A-Za-z0-9_-]`` (or an id too long) is replaced by a hash of the id. Files an older
version wrote carry no tag (``legacy_spill_name``); ``read_tool_output`` opens one only
when the store records its session as the file's only owner.

In the data dir the file is the user's alone (0600, sidecar/datadir.py). In a workspace
the model controls the files, so the spill path is checked with the project's
confinement rule (``sidecar/confine.py`` through the workspace's ``resolve_in``: a
symlinked ``tool_outputs`` folder or file name leading out is refused), the file gets the
umask's mode like the user's other files there, and it is opened without following a
symlink at its name, when writing and when reading.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from sidecar import datadir
from sidecar.confine import open_nofollow
from sidecar.tools.workspace import resolve_in

__all__ = ["SPILL_BYTES", "PREVIEW_BYTES", "OUTPUT_DIR", "spill_name", "legacy_spill_name", "maybe_spill",
           "spill", "spill_dir", "spill_path", "open_spill"]

SPILL_BYTES = 32 * 1024
PREVIEW_BYTES = 4 * 1024
OUTPUT_DIR = "tool_outputs"
_SAFE = re.compile(r"^[A-Za-z0-9_-]{1,100}$")
_TAG_CHARS = 16


def legacy_spill_name(tool_call_id: str) -> str:
    """The name an older version gave the spill of ``tool_call_id`` (no session tag)."""
    if _SAFE.match(tool_call_id):
        return f"{tool_call_id}.txt"
    return "call-" + hashlib.sha256(tool_call_id.encode("utf-8", "replace")).hexdigest()[:32] + ".txt"


def spill_name(session_id: str, tool_call_id: str) -> str:
    """The file name of the spill of ``tool_call_id`` in session ``session_id``."""
    tag = hashlib.sha256(session_id.encode("utf-8", "replace")).hexdigest()[:_TAG_CHARS]
    return f"{tag}-{legacy_spill_name(tool_call_id)}"


def spill_dir(workspace: Path | None, data_dir: Path) -> Path:
    return (workspace if workspace is not None else data_dir) / OUTPUT_DIR


def spill_path(workspace: Path | None, data_dir: Path, name: str) -> Path:
    """The spill file ``name``; in a workspace, ToolError unless it stays inside it."""
    if workspace is None:
        return spill_dir(None, data_dir) / name
    resolve_in(workspace, f"{OUTPUT_DIR}/{name}")
    return spill_dir(workspace, data_dir) / name


def open_spill(path: Path, *, write: bool, private: bool = False) -> int:
    """A file descriptor on ``path``; OSError (ELOOP) when its last component is a symlink.
    ``private``: a data-dir file, created 0600."""
    if write and private:
        return datadir.open_private(path)
    return open_nofollow(path, write=write)


def preview(data: bytes, limit: int = PREVIEW_BYTES) -> str:
    return data[:limit].decode("utf-8", errors="ignore")  # drops a split last character


def maybe_spill(text: str, session_id: str, tool_call_id: str, workspace: Path | None, data_dir: Path) -> str:
    """``text`` itself when small, else the preview + instruction (file written). Blocking.

    Raises OSError when the file cannot be written, ToolError when it would leave the workspace."""
    return spill(text, session_id, tool_call_id, workspace, data_dir)[0]


def spill(
    text: str, session_id: str, tool_call_id: str, workspace: Path | None, data_dir: Path
) -> tuple[str, Path | None]:
    """``maybe_spill``, and the file it wrote (None when the text was small enough): the
    file belongs to the reply (its owner is recorded, so it goes with the session)."""
    data = text.encode("utf-8", errors="replace")
    if len(data) <= SPILL_BYTES:
        return text, None
    name = spill_name(session_id, tool_call_id)
    path = spill_path(workspace, data_dir, name)  # checked before mkdir: nothing is created outside
    if workspace is None:
        datadir.make_dirs(path.parent)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
    path = spill_path(workspace, data_dir, name)
    with os.fdopen(open_spill(path, write=True, private=workspace is None), "wb") as f:
        f.write(data)
    if workspace is not None:
        how = (
            f"Read it with workspace_read_file(path=\"{OUTPUT_DIR}/{name}\", offset=...) "
            "in slices."
        )
    else:
        how = f"Read it with read_tool_output(tool_call_id=\"{tool_call_id}\", offset=...) in slices."
    return (
        f"{preview(data)}\n\n[output truncated: {len(data)} bytes in total, the first "
        f"{PREVIEW_BYTES} shown. The whole output is saved as {OUTPUT_DIR}/{name}. {how}]"
    ), path
