"""The freedesktop Secret Service (GNOME Keyring, KWallet, KeePassXC...) over ``jeepney``.

The Linux keychain of the secrets key: what ``keyring``'s SecretService backend did through
``secretstorage``, without either (secretstorage imports ``cryptography``), and entry for
entry the same, so a key stored by keyring is found and one stored here is found by keyring:

- the collection is the ``default`` alias (``/org/freedesktop/secrets/aliases/default``);
  writing into a service that has none creates it (label ``Default``, alias ``default``);
- an entry is found by the attributes ``{"service": S, "username": U}`` (the first match),
  and written with those plus ``"application": "Python keyring library"``, the label
  ``Password for 'U' on 'S'``, content type ``text/plain``, replacing a match;
- the session algorithm is ``plain``, which every service implements: the secret crosses
  the user's own session bus unencrypted, as any process of the user could read it anyway.

Locked collections and items are unlocked with ``Unlock``; when the service needs the user
for that (a prompt object), the prompt is run: the service shows its own dialog, and the
answer is awaited up to ``PROMPT_SECONDS`` (the start waits for the key meanwhile). A
dismissed or unanswered prompt is ``SecretServiceLocked``: no keychain for this lookup.

Every failure is ``SecretServiceError`` (no session bus, no service on it, a D-Bus error, a
reply of an unexpected shape, a timeout); its message is a fixed phrase or a D-Bus error
name, never a secret. Must stay true: blocking, one connection per ``SecretService``
(closed by ``close``), every call bounded by ``CALL_SECONDS``.
"""

from __future__ import annotations

import os
from typing import Any

BUS_NAME = "org.freedesktop.secrets"
SERVICE_PATH = "/org/freedesktop/secrets"
DEFAULT_COLLECTION = "/org/freedesktop/secrets/aliases/default"
PREFIX = "org.freedesktop.Secret."
APPLICATION = "Python keyring library"
"""keyring's SecretService ``appid``: the ``application`` attribute of an entry it writes."""
CALL_SECONDS = 25.0
"""A D-Bus call's limit (libdbus's default; activating the service can take seconds)."""
PROMPT_SECONDS = 120.0
"""How long the user has to answer an unlock prompt before it is dismissed."""

_MISSING = {
    "org.freedesktop.DBus.Error.UnknownMethod",
    "org.freedesktop.DBus.Error.UnknownObject",
    "org.freedesktop.Secret.Error.NoSuchObject",
}
"""D-Bus errors that mean "no such object" (the collection or the item is not there)."""


class SecretServiceError(Exception):
    """No usable Secret Service (the message names what failed, never a secret)."""


class SecretServiceLocked(SecretServiceError):
    """The collection or the item stays locked (the prompt was dismissed or not answered)."""


def entry_attributes(service: str, username: str) -> dict[str, str]:
    return {"username": username, "service": service}


def entry_label(service: str, username: str) -> str:
    return f"Password for '{username}' on '{service}'"


class SecretService:
    """A connection to the session bus's Secret Service: ``get_password``/``set_password``."""

    def __init__(self, connection: Any) -> None:
        self._connection = connection
        self._session: str | None = None

    @classmethod
    def connect(cls) -> SecretService:
        address = os.environ.get("DBUS_SESSION_BUS_ADDRESS")
        if not address:
            raise SecretServiceError("no session bus (DBUS_SESSION_BUS_ADDRESS is unset)")
        try:
            from jeepney.io.blocking import open_dbus_connection

            return cls(open_dbus_connection(bus="SESSION"))
        except ImportError as exc:
            raise SecretServiceError("jeepney is not installed") from exc
        except (OSError, ValueError, RuntimeError, KeyError) as exc:
            raise SecretServiceError(f"cannot connect to the session bus ({type(exc).__name__})") from exc

    def close(self) -> None:
        self._connection.close()

    def __enter__(self) -> SecretService:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- entries ---------------------------------------------------------------------

    def get_password(self, service: str, username: str) -> str | None:
        """The first matching entry's secret in the default collection, or None."""
        try:
            return self._get(service, username)
        except (TypeError, ValueError, IndexError, KeyError) as exc:  # a reply of another shape
            raise SecretServiceError(f"the Secret Service answered an unexpected reply ({type(exc).__name__})") from None

    def set_password(self, service: str, username: str, password: str) -> None:
        """Write (or replace) the entry in the default collection, created when missing."""
        try:
            self._set(service, username, password)
        except (TypeError, ValueError, IndexError, KeyError) as exc:
            raise SecretServiceError(f"the Secret Service answered an unexpected reply ({type(exc).__name__})") from None

    def _get(self, service: str, username: str) -> str | None:
        collection = DEFAULT_COLLECTION
        if not self._exists(collection):
            return None
        self._ensure_unlocked(collection, "Collection")
        (found,) = self._call(collection, "Collection", "SearchItems", "a{ss}", entry_attributes(service, username))
        if not found:
            return None
        item = str(found[0])
        self._ensure_unlocked(item, "Item")
        (secret,) = self._call(item, "Item", "GetSecret", "o", self._open_session())
        return bytes(secret[2]).decode("utf-8")

    def _set(self, service: str, username: str, password: str) -> None:
        collection = DEFAULT_COLLECTION if self._exists(DEFAULT_COLLECTION) else self._create_default_collection()
        self._ensure_unlocked(collection, "Collection")
        attributes = dict(entry_attributes(service, username), application=APPLICATION)
        properties = {
            PREFIX + "Item.Label": ("s", entry_label(service, username)),
            PREFIX + "Item.Attributes": ("a{ss}", attributes),
        }
        secret = (self._open_session(), b"", password.encode("utf-8"), "text/plain")
        item, prompt = self._call(collection, "Collection", "CreateItem", "a{sv}(oayays)b", properties, secret, True)
        if item == "/":
            self._prompt(prompt)

    # -- steps -----------------------------------------------------------------------

    def _exists(self, path: str) -> bool:
        try:
            self._property(path, "Collection", "Label")
        except _Missing:
            return False
        return True

    def _create_default_collection(self) -> str:
        properties = {PREFIX + "Collection.Label": ("s", "Default")}
        path, prompt = self._call(SERVICE_PATH, "Service", "CreateCollection", "a{sv}s", properties, "default")
        if path == "/":
            signature, path = self._prompt(prompt)
            if signature != "o":
                raise SecretServiceError("the new collection's prompt answered an unexpected result")
        return str(path)

    def _ensure_unlocked(self, path: str, interface: str) -> None:
        if not self._property(path, interface, "Locked"):
            return
        _unlocked, prompt = self._call(SERVICE_PATH, "Service", "Unlock", "ao", [path])
        if prompt != "/":
            self._prompt(prompt)
        if self._property(path, interface, "Locked"):
            raise SecretServiceLocked("the keychain stays locked")

    def _open_session(self) -> str:
        if self._session is None:
            _output, session = self._call(SERVICE_PATH, "Service", "OpenSession", "sv", "plain", ("s", ""))
            self._session = str(session)
        return self._session

    def _prompt(self, path: str) -> tuple[str, Any]:
        """Run a prompt (the service asks the user) and wait for its ``Completed`` signal:
        its result, or SecretServiceLocked when dismissed or not answered in time."""
        from jeepney import MatchRule, message_bus

        rule = MatchRule(type="signal", interface=PREFIX + "Prompt", member="Completed", path=path)
        self._send(message_bus.AddMatch(rule))  # the signal may be broadcast, not sent to us
        with self._connection.filter(rule) as completed:
            self._call(path, "Prompt", "Prompt", "s", "")
            try:
                signal = self._connection.recv_until_filtered(completed, timeout=PROMPT_SECONDS)
            except TimeoutError:
                self._call(path, "Prompt", "Dismiss", "")
                raise SecretServiceLocked("the keychain's prompt was not answered in time") from None
            except (OSError, ValueError, EOFError) as exc:
                raise SecretServiceError(f"the session bus failed ({type(exc).__name__})") from None
        dismissed, result = signal.body
        if dismissed:
            raise SecretServiceLocked("the keychain's prompt was dismissed")
        return result  # type: ignore[no-any-return]

    # -- D-Bus -----------------------------------------------------------------------

    def _call(self, path: str, interface: str, method: str, signature: str | None = None, *body: Any) -> Any:
        from jeepney import DBusAddress, new_method_call

        address = DBusAddress(path, bus_name=BUS_NAME, interface=PREFIX + interface)
        return self._send(new_method_call(address, method, signature, body))

    def _property(self, path: str, interface: str, name: str) -> Any:
        from jeepney import DBusAddress, Properties

        (_signature, value), = self._send(Properties(DBusAddress(path, bus_name=BUS_NAME, interface=PREFIX + interface)).get(name))
        return value

    def _send(self, message: Any) -> Any:
        from jeepney.wrappers import DBusErrorResponse, unwrap_msg

        try:
            return unwrap_msg(self._connection.send_and_get_reply(message, timeout=CALL_SECONDS))
        except DBusErrorResponse as exc:
            if exc.name in _MISSING:
                raise _Missing(str(exc.name)) from None
            raise SecretServiceError(f"the Secret Service answered {exc.name}") from None
        except (OSError, ValueError, EOFError) as exc:  # TimeoutError is an OSError
            raise SecretServiceError(f"the session bus failed ({type(exc).__name__})") from None


class _Missing(SecretServiceError):
    """The object is not there (a missing collection or item)."""
