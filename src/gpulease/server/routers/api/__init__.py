"""The REST API under /api/v1, and the runner protocol under /runner/v1."""
