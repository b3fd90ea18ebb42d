"""The per-instance runner: builds the environment, runs commands, ships logs to the server."""
