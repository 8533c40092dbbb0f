"""sidecar.sync: the Qiming (nuwax) server: its client, the account, and two-way sync.

Layout (each module says what it owns):
    wire.py     the server's JSON shapes (envelope, ConversationDto, ChatMessageDto,
                AgentOutputDto...) as lenient msgspec Structs, ISO dates -> ms
    errors.py   QimingError and its kinds (network, http, malformed, envelope,
                auth_required, not_found, not_configured)
    client.py   QimingClient: requests, the envelope, retries, the chat SSE reader
    account.py  ServerAccount: server:configure / status / logout, the account state
    mapping.py  server messages -> MessageV2 (roles, thinking, files, statuses)
    run.py      RunContext: one run's result, progress and database thread
    adapter.py  ConversationSyncAdapter: pull, push, conflicts, deletions
    service.py  SyncService: the server:* / sync:* methods, one run at a time, periodic sync
Storage: sidecar/store/sync.py (tables of migration ``m_qiming_sync``; the token sealed
at rest like every stored secret, sidecar/store/secrets.py), reached through the store
gateway as ``store.run(lambda s: s.sync...)``.
"""
