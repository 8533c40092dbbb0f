"""The names of the folders the store keeps in the data dir.

A leaf (no imports): opening the store narrows these folders' modes (sidecar/store/store.py)
before any repository is built, and the file records and the janitor (files.py,
janitor.py) own what is in them.
"""

from __future__ import annotations

__all__ = ["MANAGED_DIRS"]

MANAGED_DIRS = ("attachments", "tool_outputs", "acp")
"""The folders of the data dir whose entries the sidecar writes (and may remove)."""
