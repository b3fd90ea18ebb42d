"""Backends decide where a runner process starts and with which GPUs; nothing more."""
