"""The HTTP process's link to the other processes: `TokenizerManager` and its sockets, receipts,
holds, the scheduler probe, the per-request log line and the metrics."""
