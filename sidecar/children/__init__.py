"""Child processes: the one rule for what a child inherits, and the one way to run one.

Every program the sidecar starts goes through here: workspace commands
(``command.run_command``), MCP stdio servers and ACP agent engines (``stdio.spawn_child``).
A leaf package: it imports nothing of the layers that use it (acp, tools), only the
shared ``sidecar.rpc.framing``, ``sidecar.supervision`` and ``sidecar.errors``.

    env.py      child_env: the environment allow-list (documented there)
    groups.py   process groups: the spawn flag, signalling and killing a child's group
    stdio.py    ChildSpec / ChildProcess / spawn_child: a long-lived child speaking
                JSON-RPC on its stdin/stdout (stderr drained, bounded stop, always reaped)
    command.py  run_command: one shell command, output captured, its group killed at the end
    lines.py    JsonLines: the filter stage for a JSON-RPC child's stdout
"""
