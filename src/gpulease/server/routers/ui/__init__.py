"""The web console: server-rendered pages."""
