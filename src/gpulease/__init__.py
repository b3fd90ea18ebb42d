"""gpulease: self-hosted GPU leasing. Rent GPUs by the second, train, pay for what you use."""

__version__ = "0.1.0"
