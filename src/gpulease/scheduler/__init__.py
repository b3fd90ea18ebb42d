"""Scheduling policy as pure functions: cluster and queue in, decisions out. No DB, no clock."""
