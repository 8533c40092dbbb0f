"""sidecar.engine: the ChatEngine side of the process (sessions, messages, generation).

Services here take typed protocol params, call the store and the pipeline, and publish
events through ``notify``; ``sidecar/server.py`` binds method names to them.
"""
