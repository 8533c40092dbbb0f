"""The environment of every child process: a short allow-list of ours, plus what the user
configured for that child. The one rule (workspace commands, MCP stdio servers, ACP
agent engines all call ``child_env``).

What a child inherits of the sidecar's own environment, by name, when set:
- POSIX: ``PATH`` (to find programs), ``HOME``, ``USER``, ``LOGNAME``, ``SHELL`` (who and
  where the user is: git, npm, ssh config...), ``TERM``, ``TMPDIR`` (macOS gives each
  user their own), ``TZ``, the locale (``LANG``, ``LANGUAGE``, every ``LC_*`` category) and
  the XDG base directories a user may have moved (``XDG_CONFIG_HOME``, ``XDG_CACHE_HOME``,
  ``XDG_DATA_HOME``, ``XDG_STATE_HOME``);
- Windows (names there are case-insensitive; Python keeps them upper-case): ``PATH``,
  ``PATHEXT``, ``SYSTEMROOT``, ``SYSTEMDRIVE``, ``WINDIR``, ``COMSPEC`` (without these
  ``cmd`` and most programs do not start), ``TEMP``, ``TMP``, the profile folders
  (``USERPROFILE``, ``APPDATA``, ``LOCALAPPDATA``, ``PROGRAMDATA``, ``PUBLIC``,
  ``HOMEDRIVE``, ``HOMEPATH``), ``USERNAME``, ``COMPUTERNAME``, the program folders
  (``PROGRAMFILES``, ``PROGRAMFILES(X86)``, ``PROGRAMW6432``, ``COMMONPROGRAMFILES``,
  ``COMMONPROGRAMFILES(X86)``) and the machine's ``OS``, ``PROCESSOR_ARCHITECTURE``,
  ``NUMBER_OF_PROCESSORS``.
Nothing else: not the provider keys the host hands the sidecar (``CHAT_KEY_OPENAI`` in the
README's setup), not ``CHAT_SIDECAR_*``, not any ``*_KEY`` / ``*_TOKEN`` / ``*_SECRET`` a
developer's shell exports, and not the sockets that act for the user (``SSH_AUTH_SOCK``,
``XDG_RUNTIME_DIR``, ``DBUS_SESSION_BUS_ADDRESS``: the ssh agent, the keyring).

Then the child's configured ``env`` (an MCP server's, an ACP engine's) is laid over it and
may override any of these (a ``PATH`` of its own). That is the only way a secret reaches a
child: the user put it in that child's configuration. A workspace command has no
configuration: it gets the allow-list alone.

A child cannot read ours around the allow-list either: on Linux ``hide_from_children``
(called by the process's start before anything is spawned) makes the sidecar not dumpable
(``prctl(PR_SET_DUMPABLE, 0)``), so ``/proc/<sidecar pid>/environ`` (the keys the host
handed us), ``mem`` and ``fd`` belong to root and a child of the same user, or a debugger,
cannot open them; no core file is written either. Elsewhere a process of the same user can
read another's memory (SECURITY.md lists it as a residual risk).

Must stay true: no name in the allow-lists may look like it holds a secret
(``sidecar.secrets.names.is_secret_name``); env values are never logged.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from sidecar.supervision import linux_prctl

__all__ = ["child_env", "hide_from_children", "INHERITED", "INHERITED_POSIX", "INHERITED_WINDOWS"]

_LOCALE = (
    "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "LC_COLLATE", "LC_MESSAGES", "LC_MONETARY", "LC_NUMERIC",
    "LC_TIME", "LC_ADDRESS", "LC_IDENTIFICATION", "LC_MEASUREMENT", "LC_NAME", "LC_PAPER", "LC_TELEPHONE",
)
INHERITED_POSIX = (
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "TERM", "TMPDIR", "TZ", *_LOCALE,
    "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME",
)
INHERITED_WINDOWS = (
    "PATH", "PATHEXT", "SYSTEMROOT", "SYSTEMDRIVE", "WINDIR", "COMSPEC", "TEMP", "TMP",
    "USERPROFILE", "APPDATA", "LOCALAPPDATA", "PROGRAMDATA", "PUBLIC", "HOMEDRIVE", "HOMEPATH",
    "USERNAME", "COMPUTERNAME", "PROGRAMFILES", "PROGRAMFILES(X86)", "PROGRAMW6432",
    "COMMONPROGRAMFILES", "COMMONPROGRAMFILES(X86)", "OS", "PROCESSOR_ARCHITECTURE", "NUMBER_OF_PROCESSORS",
)
INHERITED = INHERITED_WINDOWS if sys.platform == "win32" else INHERITED_POSIX
"""The names this platform's children inherit of ours."""


def child_env(configured: Mapping[str, str] | None = None) -> dict[str, str]:
    """The whole environment of a child: the allow-listed names of ours that are set, then
    ``configured`` (the child's own settings) over them."""
    env = {name: os.environ[name] for name in INHERITED if name in os.environ}
    if configured:
        env.update(configured)
    return env


_PR_SET_DUMPABLE = 4


def hide_from_children() -> bool:
    """Linux: make this process not dumpable (see the module's docstring). Whether it is now."""
    return linux_prctl(_PR_SET_DUMPABLE, 0)
