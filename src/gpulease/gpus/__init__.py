"""GPUs of this host: discovery through NVML and simulated GPUs for development."""
