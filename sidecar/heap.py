"""The garbage collector's view of the start-up: frozen once the services are open.

The cyclic collector's oldest generation holds everything the start-up made (modules,
classes, functions, the services' tables: hundreds of thousands of objects), and every full
collection walks all of them: 150 ms with the event loop stopped, while replies stream and a
read waits behind it. ``freeze_startup`` moves them into the permanent generation
(``gc.freeze``), so later collections walk only what the process made since. Before that,
the process's entry keeps the collector off until the first answers are written
(sidecar/__main__.py): what it makes until then lives on, and a collection finds nothing.

Must stay true: called by the process's own server once the services are open
(sidecar/server.py; a server run inside another process, as in tests, leaves its host's
heap alone); nothing is collected by it (no pause of its own), so garbage the start-up left
in reference cycles is kept for the life of the process, a fixed amount.
"""

from __future__ import annotations

import gc

__all__ = ["freeze_startup"]


def freeze_startup() -> int:
    """Freeze what is tracked now; returns how many objects are frozen."""
    gc.freeze()
    return gc.get_freeze_count()
