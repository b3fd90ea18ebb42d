"""Datasets: pushes (uploads), versions, quotas, garbage collection, keys and mounts."""
