"""ACP engines: agent subprocesses spoken to over the Agent Client Protocol (client.py owns one
connection, engines.py the running agents, mapping.py their events as ours, fs.py their file
requests confined to a session's working directory). Imported by the engine, never below it."""
