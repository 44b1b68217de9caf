"""``tritium perf``: a bounded load generator for any server that speaks Triton's HTTP protocol."""
