"""The names of the notifications the sidecar sends, without their types.

The handshake lists them (``InitializeResult.notifications``) from the first answer of a
cold start, which must not import the domains ``protocol/notifications.py`` needs.
tests/test_rpc_server.py holds this equal to the server->client names of the table.
"""

SERVER_NOTIFICATIONS: tuple[str, ...] = (
    "channel:reply", "chat:session:updated", "chat:stream", "chat:suggestions", "memory_consolidation_proposed",
    "memory_proposed", "server:status:updated", "sidecar:progress", "skill_proposed", "task_finished", "task_fired",
)
