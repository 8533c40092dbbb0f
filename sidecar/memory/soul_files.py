"""SoulFiles: the Soul.md files on disk (global and per assistant), read with a cache.

A file is read at most MAX_SOUL_FILE_BYTES and cached by (path, mtime, size), so a request
re-reads it only when it changed. Blocking: call from a worker thread. Used by the Soul
service (memory/soul.py) and the request builder (pipeline/builder.py).
"""

from __future__ import annotations

import threading
from pathlib import Path

__all__ = ["SoulFiles", "MAX_SOUL_FILE_BYTES"]

MAX_SOUL_FILE_BYTES = 64 * 1024
"""What is read of a Soul.md file (a longer file is cut there)."""


class SoulFiles:
    """Reads Soul.md files, cached by (path, mtime, size). Blocking: call from a worker thread."""

    def __init__(self, data_dir: Path) -> None:
        self._data_dir = data_dir
        self._cache: dict[Path, tuple[float, int, str | None]] = {}
        self._lock = threading.Lock()

    def path_for(self, assistant_id: str) -> Path:
        return self._data_dir / "assistants" / _safe(assistant_id) / "Soul.md"

    def read_global(self) -> str | None:
        text = self._read(self._data_dir / "Soul.md")
        return text.strip() if text is not None and text.strip() else None

    def read_own(self, assistant_id: str) -> str | None:
        text = self._read(self.path_for(assistant_id))
        return text.strip() if text is not None and text.strip() else None

    def read(self, assistant_id: str) -> str | None:
        for path in (self.path_for(assistant_id), self._data_dir / "Soul.md"):
            text = self._read(path)
            if text is not None and text.strip():
                return text.strip()
        return None

    def _read(self, path: Path) -> str | None:
        try:
            st = path.stat()
        except OSError:
            return None
        key = (st.st_mtime, st.st_size)
        with self._lock:
            hit = self._cache.get(path)
        if hit is not None and hit[:2] == key:
            return hit[2]
        try:
            with path.open("rb") as fh:
                text: str | None = fh.read(MAX_SOUL_FILE_BYTES).decode("utf-8", errors="replace")
        except OSError:
            text = None
        with self._lock:
            self._cache[path] = (key[0], key[1], text)
        return text


def _safe(assistant_id: str) -> str:
    name = "".join(c if c.isalnum() or c in "-_." else "_" for c in assistant_id)[:120]
    return name.strip(".") or "_"
