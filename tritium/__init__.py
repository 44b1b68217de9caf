"""tritium: a Triton-compatible inference server built around a ZeroMQ broker."""

__version__ = "0.1.0"
