"""Prometheus metrics of the storage service (``fs3_storage_*``).

Labels carry the target id so a node with several targets (or several nodes in
one test process) report separately.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

_LAT_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)

OPS = Counter("fs3_storage_ops_total", "Storage operations", ["target", "op", "result"])
BYTES = Counter("fs3_storage_bytes_total", "Payload bytes read/written", ["target", "op"])
LATENCY = Histogram(
    "fs3_storage_op_seconds", "Storage operation latency", ["op"], buckets=_LAT_BUCKETS
)
FORWARD_RETRIES = Counter(
    "fs3_storage_forward_retries_total", "Forwarding attempts that failed", ["target"]
)
CHECKSUM_ERRORS = Counter(
    "fs3_storage_checksum_errors_total", "Checksum mismatches found", ["target", "where"]
)
SYNC_CHUNKS = Counter("fs3_storage_sync_chunks_total", "Chunks sent by resync", ["target", "kind"])
SYNC_REMAINING = Gauge(
    "fs3_storage_sync_remaining_chunks", "Chunks left in the running resync", ["chain"]
)
SYNC_RUNS = Counter("fs3_storage_sync_runs_total", "Resync runs", ["chain", "result"])
USED_BYTES = Gauge("fs3_storage_used_bytes", "Bytes held by a target's chunks", ["target"])
