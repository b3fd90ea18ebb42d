"""Dataset storage: blob stores (local files, S3), chunking and encryption at rest."""
