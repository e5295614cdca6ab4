"""fs3.storage: the storage service (chunk engine, CRAQ chain replication, resync).

Modules (3FS's adapter → operator → store layering):

- ``server``: ``fs3 storage --config FILE``; :class:`~fs3.storage.server.StorageNode` wiring,
  mgmtd registration/heartbeats/routing.
- ``service``: the thin gRPC servicer (``proto/storage.proto``).
- ``operator``: reads, queries, batch truncate/remove, resync receiver, repair.
- ``craq``: the write path (head serialisation, forwarding, commit on the way back,
  exactly-once channels).
- ``resync``: the predecessor side of recovering a SYNCING successor.
- ``target``: targets, chunk locks, local-state rules.
- ``chunk_engine``: ``ChunkEngine`` ABC and ``FileChunkEngine`` (COW files + SQLite metadata).
- ``metrics``: ``fs3_storage_*`` Prometheus metrics.
"""
