"""The client's own Python cost per meta call: ``MetaClient.call`` against the bare stub.

A real native server (``MetaServicer`` over a ``MetaOperator`` on the memory KV) runs
on a thread of this process; the main thread times sequential ``GetAttr`` calls of the
root inode three ways, interleaved in rounds:

* ``stub``: the generated stub on the pool's native channel (what every path pays anyway);
* ``meta``: :meth:`fs3.client.meta_client.MetaClient.call` (server choice, retries,
  deadline) on the same pool, with a routing that lists the server as a META node;
* ``base``: the same through another ``meta_client.py`` (``--base FILE``, e.g.
  ``git show REV:fs3/client/meta_client.py > /tmp/base_meta_client.py``), loaded as a
  module of its own so both versions run in the same process, same minutes.

Times are the main thread's CPU (``time.thread_time``), so the server thread's work
is not in them; the MetaClient overhead is ``meta - stub``. ``--profile`` also counts
the Python function calls per RPC with cProfile (deterministic, unlike the times).

    PYTHONPATH=. python benchmarks/meta_client_cost.py --calls 3000 --rounds 5 \
        --base /tmp/base_meta_client.py --profile
"""

from __future__ import annotations

import argparse
import cProfile
import importlib.util
import pstats
import sys
import time
from pathlib import Path
from statistics import median
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from rpc import serve_meta_thread  # noqa: E402  (benchmarks/rpc.py)

from fs3.client.retry import RetryPolicy  # noqa: E402
from fs3.proto import common_pb2, meta_pb2, meta_pb2_grpc, mgmtd_pb2  # noqa: E402
from fs3.routing import Routing  # noqa: E402
from fs3.rpc.channel import ChannelPool  # noqa: E402
from fs3.rpc.loop import run  # noqa: E402


def load_module(path: str, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


async def measure(args: argparse.Namespace, port: int) -> None:
    from fs3.client import meta_client

    address = f"127.0.0.1:{port}"
    info = mgmtd_pb2.RoutingInfo(version=3)
    info.nodes.add(
        node_id=2,
        type=mgmtd_pb2.NODE_TYPE_META,
        address=address,
        status=mgmtd_pb2.NODE_STATUS_ONLINE,
    )
    routing = Routing(info)

    async def refresh() -> None:
        return None

    pool = ChannelPool("native")
    policy = RetryPolicy()
    req = meta_pb2.GetAttrRequest(user=common_pb2.UserInfo(uid=0, gid=0), inode=1)
    stub = meta_pb2_grpc.MetaServiceStub(pool.get(address))

    async def stub_calls(n: int) -> None:
        for _ in range(n):
            await stub.GetAttr(req, timeout=policy.rpc_timeout_s)

    def meta_calls_of(cls: Any) -> Any:
        client = cls(lambda: routing, refresh, pool, policy)

        async def calls(n: int) -> None:
            for _ in range(n):
                await client.call("GetAttr", req)

        return calls

    variants: dict[str, Any] = {"stub": stub_calls, "meta": meta_calls_of(meta_client.MetaClient)}
    if args.base:
        base = load_module(args.base, "base_meta_client")
        variants["base"] = meta_calls_of(base.MetaClient)

    for fn in variants.values():  # warm up: connection, caches
        await fn(500)

    us: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(args.rounds):
        for name, fn in variants.items():
            t0 = time.thread_time()
            await fn(args.calls)
            us[name].append((time.thread_time() - t0) / args.calls * 1e6)

    print(f"client thread CPU µs per GetAttr, median of {args.rounds} rounds of {args.calls}:")
    for name, vals in us.items():
        extra = ""
        if name != "stub":
            extra = f"   overhead over stub {median(vals) - median(us['stub']):.1f}"
        print(f"  {name:5} {median(vals):6.1f}  {[round(v, 1) for v in vals]}{extra}")

    if args.profile:
        n = 1000
        print(f"Python function calls per GetAttr (cProfile, {n} calls, main thread):")
        for name, fn in variants.items():
            prof = cProfile.Profile()
            prof.enable()
            await fn(n)
            prof.disable()
            st = pstats.Stats(prof)
            print(f"  {name:5} {st.total_calls / n:6.1f}")  # type: ignore[attr-defined]
    await pool.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=3000, help="sequential calls per round")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (median)")
    ap.add_argument("--base", default="", help="another meta_client.py to compare with")
    ap.add_argument("--profile", action="store_true", help="count Python calls per RPC")
    args = ap.parse_args()
    port = int(serve_meta_thread()["port"])
    run(measure(args, port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
