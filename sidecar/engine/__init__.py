"""sidecar.engine: the ChatEngine side of the process (sessions, messages, generation).

Services here take typed protocol params, call the store and the pipeline, and publish
events through ``notify``; ``sidecar/server.py`` binds method names to them.

Replies: ``lifecycle/`` (ReplyLifecycle) owns everything a reply has; a turn driver
produces its content: ``generation.py`` (the direct-mode step loop, with ``tool_loop.py``
for its tool calls) and ``acp_turn.py`` (an ACP agent's turn). ``chat.py`` runs one job per
session and picks the driver by the session's mode.
"""
