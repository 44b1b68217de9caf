"""Triton's trace extension: settings, timestamps, the trace file."""
