"""Connections the sidecar owns (opt-in per channel: ``connection.kind``), instead of the host.

Modules:
    base.py      the supervisor loop (state, backoff), Reconnect / Fatal, DeliveryError, the
                 sender protocol
    manager.py   one supervisor per connected channel, the senders, the learned bot ids
    telegram.py  Bot API, long polling (getUpdates), sending and editing
    discord.py   REST (rate-limit headers, 429) and the gateway (heartbeats, resume)
    slack.py     Web API and Socket Mode (envelope acks, disconnect)
    media.py     attachments downloaded, local files uploaded
The platform modules (and websockets) are imported only when a channel has a connection of
that kind.
"""
