"""fs3.meta: the stateless metadata service (POSIX semantics as KV transactions).

Layers, as 3FS's meta: ``service`` (gRPC adapter) → ``operator`` (validation,
idempotency, one transaction per request) → ``ops/*`` (the POSIX logic) →
``store`` (typed records) → ``schema`` (key layout). ``layout`` places new
files on chains, ``alloc`` hands out inode numbers, ``fsck`` checks the
namespace invariants, ``server`` is ``fs3 meta``.
"""
