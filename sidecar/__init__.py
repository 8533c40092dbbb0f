"""chat-sidecar: the local chat engine process (see DESIGN.md for the map)."""

__version__ = "0.1.0"
SERVER_NAME = "chat-sidecar"
