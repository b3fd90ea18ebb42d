"""Reconcilers move real state toward recorded intent. Each tick is safe to run twice or to
crash halfway: load, act outside any transaction, apply guarded by the state it loaded."""
