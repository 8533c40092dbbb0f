"""A private D-Bus session bus and a fake freedesktop Secret Service on it (``jeepney``).

``private_session_bus(tmp)`` starts ``dbus-daemon`` (its own config: a socket under
``tmp``, no service directories, so nothing is activated) and yields its address;
``FakeSecretService(address)`` owns ``org.freedesktop.secrets`` there and answers, in a
thread, what a Secret Service client calls: OpenSession (``plain`` only, as a service
that refuses the DH algorithm), Unlock (a prompt for a locked object: accepted or
dismissed as the test says, or never answered), CreateCollection, ReadAlias, a
collection's SearchItems and CreateItem (replace), an item's GetSecret, and the
properties Label, Locked, Attributes, Items. Collections and items are plain objects the
test reads and edits (``items``, ``lock``).

Must stay true: every wait is bounded, the thread and the daemon end when the context
exits, and the bus is this test's alone (nothing of the developer's session).
"""

from __future__ import annotations

import shutil
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from jeepney import DBusAddress, HeaderFields, MessageType, new_error, new_method_return, new_signal
from jeepney.bus_messages import message_bus
from jeepney.io.blocking import Proxy, open_dbus_connection

DBUS_DAEMON = shutil.which("dbus-daemon")
ROOT_PATH = "/org/freedesktop/secrets"
ALIAS_DEFAULT = ROOT_PATH + "/aliases/default"
PREFIX = "org.freedesktop.Secret."
UNKNOWN_OBJECT = "org.freedesktop.DBus.Error.UnknownObject"
CONFIG = """<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>session</type>
  <listen>unix:dir={dir}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow send_destination="*" eavesdrop="true"/>
    <allow eavesdrop="true"/>
    <allow own="*"/>
  </policy>
</busconfig>
"""


@contextmanager
def private_session_bus(tmp: Path) -> Iterator[str]:
    """A dbus-daemon of this test's own; yields its address (DBUS_SESSION_BUS_ADDRESS)."""
    assert DBUS_DAEMON is not None
    tmp.mkdir(parents=True, exist_ok=True)
    config = tmp / "bus.conf"
    config.write_text(CONFIG.format(dir=tmp))
    log = tmp / "dbus-daemon.log"
    with log.open("wb") as stderr:
        proc = subprocess.Popen([DBUS_DAEMON, f"--config-file={config}", "--nofork", "--print-address"],
                                stdout=subprocess.PIPE, stderr=stderr, text=True)
    try:
        assert proc.stdout is not None
        with proc.stdout:
            address = proc.stdout.readline().strip()  # printed once it listens
        if not address:
            raise RuntimeError(f"dbus-daemon did not start: {log.read_text(errors='replace')}")
        yield address
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@dataclass
class Item:
    path: str
    label: str
    attributes: dict[str, str]
    secret: bytes
    content_type: str = "text/plain"
    locked: bool = False


@dataclass
class Collection:
    path: str
    label: str
    locked: bool = False
    items: list[Item] = field(default_factory=list)


PromptAnswer = Literal["accept", "dismiss", "never"]


class FakeSecretService:
    """The service, answering in a thread from ``start()`` to ``stop()`` (a context manager)."""

    def __init__(self, address: str, *, default_collection: bool = True, prompt: PromptAnswer = "accept") -> None:
        self.address = address
        self.prompt = prompt
        """How an unlock prompt ends: the user accepts, dismisses, or never answers."""
        self.collections: dict[str, Collection] = {}
        self.aliases: dict[str, str] = {}
        self.calls: list[str] = []
        """The member of every call answered, in order."""
        self._prompts: dict[str, list[str]] = {}
        self._sessions: set[str] = set()
        self._counter = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._conn: Any = None
        if default_collection:
            self.add_collection("login", "Login", alias="default")

    # -- state the tests set and read ------------------------------------------------

    def add_collection(self, name: str, label: str, *, alias: str | None = None, locked: bool = False) -> Collection:
        collection = Collection(f"{ROOT_PATH}/collection/{name}", label, locked)
        self.collections[collection.path] = collection
        if alias is not None:
            self.aliases[alias] = collection.path
        return collection

    @property
    def default(self) -> Collection:
        return self.collections[self.aliases["default"]]

    def add_item(self, collection: Collection, label: str, attributes: dict[str, str], secret: bytes,
                 *, locked: bool = False) -> Item:
        self._counter += 1
        item = Item(f"{collection.path}/{self._counter}", label, dict(attributes), secret, locked=locked)
        collection.items.append(item)
        return item

    # -- the thread -----------------------------------------------------------------

    def __enter__(self) -> FakeSecretService:
        self._conn = open_dbus_connection(self.address)
        reply = Proxy(message_bus, self._conn, timeout=5).RequestName("org.freedesktop.secrets", 4)
        assert reply == (1,), reply  # primary owner
        self._thread = threading.Thread(target=self._serve, name="fake-secret-service", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._conn.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                msg = self._conn.receive(timeout=0.05)
            except TimeoutError:
                continue
            except OSError:
                return
            if msg.header.message_type is not MessageType.method_call:
                continue
            fields = msg.header.fields
            self.calls.append(str(fields.get(HeaderFields.member)))
            try:
                after = self._answer(msg, fields[HeaderFields.path], fields.get(HeaderFields.member))
            except _Error as exc:
                self._conn.send(new_error(msg, exc.name, "s", (exc.name,)))
                continue
            if after is not None:
                after()

    def _reply(self, msg: Any, signature: str | None, *body: Any) -> None:
        self._conn.send(new_method_return(msg, signature, body))

    def _answer(self, msg: Any, path: str, member: str) -> Any:
        body = msg.body
        if member == "Get":
            interface, prop = body
            self._reply(msg, "v", self._get_property(self._resolve(path), interface, prop))
        elif path == ROOT_PATH:
            return self._service(msg, member, body)
        elif path.startswith(ROOT_PATH + "/prompt/"):
            return self._prompt(msg, path, member)
        else:
            target = self._resolve(path)
            if isinstance(target, Collection):
                self._collection(msg, target, member, body)
            else:
                self._item(msg, target, member, body)
        return None

    def _service(self, msg: Any, member: str, body: Any) -> Any:
        if member == "OpenSession":
            algorithm, _input = body
            if algorithm != "plain":
                raise _Error("org.freedesktop.DBus.Error.NotSupported")
            self._counter += 1
            session = f"{ROOT_PATH}/session/s{self._counter}"
            self._sessions.add(session)
            self._reply(msg, "vo", ("s", ""), session)
        elif member == "Unlock":
            (paths,) = body
            locked = [p for p in paths if self._resolve(p).locked]
            if not locked:
                self._reply(msg, "aoo", list(paths), "/")
                return None
            self._counter += 1
            prompt = f"{ROOT_PATH}/prompt/p{self._counter}"
            self._prompts[prompt] = locked
            self._reply(msg, "aoo", [p for p in paths if p not in locked], prompt)
        elif member == "CreateCollection":
            properties, alias = body
            label = properties.get(PREFIX + "Collection.Label", ("s", ""))[1]
            collection = self.add_collection(f"c{self._counter + 1}", label, alias=alias or None)
            self._reply(msg, "oo", collection.path, "/")
        elif member == "ReadAlias":
            (alias,) = body
            self._reply(msg, "o", self.aliases.get(alias, "/"))
        else:
            raise _Error("org.freedesktop.DBus.Error.UnknownMethod")
        return None

    def _prompt(self, msg: Any, path: str, member: str) -> Any:
        paths = self._prompts.get(path)
        if paths is None:
            raise _Error(UNKNOWN_OBJECT)
        self._reply(msg, None)
        if member == "Prompt" and self.prompt == "never":
            return None
        dismissed = member == "Dismiss" or self.prompt == "dismiss"

        def complete() -> None:
            if not dismissed:
                for p in paths:
                    self._resolve(p).locked = False
            del self._prompts[path]
            # broadcast, as a service that does not address the signal (the client must match it)
            signal = new_signal(DBusAddress(path, interface=PREFIX + "Prompt"), "Completed", "bv",
                                (dismissed, ("ao", [] if dismissed else paths)))
            self._conn.send(signal)

        return complete

    def _collection(self, msg: Any, collection: Collection, member: str, body: Any) -> None:
        if member == "SearchItems":
            (wanted,) = body
            found = [i.path for i in collection.items if all(i.attributes.get(k) == v for k, v in wanted.items())]
            self._reply(msg, "ao", found)
        elif member == "CreateItem":
            properties, (session, _params, value, content_type), replace = body
            if collection.locked:
                raise _Error("org.freedesktop.Secret.Error.IsLocked")
            if session not in self._sessions:
                raise _Error("org.freedesktop.Secret.Error.NoSession")
            attributes = dict(properties[PREFIX + "Item.Attributes"][1])
            label = properties[PREFIX + "Item.Label"][1]
            same = next((i for i in collection.items if i.attributes == attributes), None) if replace else None
            if same is not None:
                same.label, same.secret, same.content_type = label, bytes(value), content_type
                item = same
            else:
                item = self.add_item(collection, label, attributes, bytes(value))
                item.content_type = content_type
            self._reply(msg, "oo", item.path, "/")
        else:
            raise _Error("org.freedesktop.DBus.Error.UnknownMethod")

    def _item(self, msg: Any, item: Item, member: str, body: Any) -> None:
        if member != "GetSecret":
            raise _Error("org.freedesktop.DBus.Error.UnknownMethod")
        (session,) = body
        if item.locked:
            raise _Error("org.freedesktop.Secret.Error.IsLocked")
        if session not in self._sessions:
            raise _Error("org.freedesktop.Secret.Error.NoSession")
        self._reply(msg, "(oayays)", (session, b"", item.secret, item.content_type))

    def _resolve(self, path: str) -> Collection | Item:
        if path.startswith(ROOT_PATH + "/aliases/"):
            path = self.aliases.get(path.rpartition("/")[2], "")
        if path in self.collections:
            return self.collections[path]
        for collection in self.collections.values():
            for item in collection.items:
                if item.path == path:
                    return item
        raise _Error(UNKNOWN_OBJECT)

    @staticmethod
    def _get_property(target: Collection | Item, interface: str, prop: str) -> tuple[str, Any]:
        if prop == "Label":
            return ("s", target.label)
        if prop == "Locked":
            return ("b", target.locked)
        if prop == "Attributes" and isinstance(target, Item):
            return ("a{ss}", target.attributes)
        if prop == "Items" and isinstance(target, Collection):
            return ("ao", [i.path for i in target.items])
        raise _Error("org.freedesktop.DBus.Error.InvalidArgs")


class _Error(Exception):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name
