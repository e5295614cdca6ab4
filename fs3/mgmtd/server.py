"""``fs3 mgmtd --config FILE``: one cluster-manager process.

Wiring only: open the KV, start the gRPC server, then run three loops until
SIGTERM/SIGINT: the lease (:class:`~fs3.mgmtd.election.Elector`), the leader's
background tick (:meth:`~fs3.mgmtd.operator.MgmtdOperator.run`) and, while
following, a heartbeat to the leader so every mgmtd appears in routing info
(clients learn all mgmtd addresses from it, as in 3FS).

The bound address is printed on stdout as ``fs3-mgmtd listening on HOST:PORT``
(so ``port = 0`` stays discoverable).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys

from fs3.config import MgmtdConfig
from fs3.errors import Code, FsError
from fs3.kv import open_database
from fs3.logs import event
from fs3.mgmtd.election import Elector
from fs3.mgmtd.operator import MgmtdOperator
from fs3.mgmtd.service import MgmtdServicer
from fs3.mgmtd.users import Users
from fs3.proto import mgmtd_pb2, mgmtd_pb2_grpc
from fs3.rpc.auth import process_signer
from fs3.rpc.server import add_servicer, bind, create_server
from fs3.service import service_main

log = logging.getLogger("fs3.mgmtd")


async def _follower_heartbeats(
    cfg: MgmtdConfig, elector: Elector, address: str, stop: asyncio.Event
) -> None:
    """While following, heartbeat the leader as a node of type MGMTD."""
    from fs3.client.mgmtd_client import MgmtdClient

    client: MgmtdClient | None = None
    client_for = ""
    interval = cfg.mgmtd.heartbeat_interval_s
    try:
        while not stop.is_set():
            leader = elector.leader_address()
            if leader and not elector.is_leader():
                if client is None or client_for != leader:
                    if client is not None:
                        await client.close()
                    client = MgmtdClient(
                        [leader],
                        cfg.cluster.id,
                        timeout_s=min(2.0, interval),
                        retry_deadline_s=min(2.0, interval),
                    )
                    client_for = leader
                try:
                    await client.heartbeat(
                        mgmtd_pb2.HeartbeatRequest(
                            node_id=cfg.node.id,
                            type=mgmtd_pb2.NODE_TYPE_MGMTD,
                            address=address,
                            hostname=cfg.node.host,
                            name=f"mgmtd-{cfg.node.id}",
                        )
                    )
                except FsError as e:
                    log.debug("heartbeat to leader %s failed: %s", leader, e)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=interval)
    finally:
        if client is not None:
            await client.close()


async def serve(cfg: MgmtdConfig, stop: asyncio.Event) -> int:
    if cfg.node.id <= 0:
        raise FsError(Code.INVALID_ARGUMENT, "[node] id must be > 0 for mgmtd")
    db = open_database(cfg.kv.url)
    server = create_server()
    elector = Elector(db, cfg.node.id, "", cfg.mgmtd)
    op = MgmtdOperator(db, cfg, elector, "")
    users = Users(db, process_signer())
    if server.auth is not None:
        server.auth.lookup = users.lookup  # user tokens are checked against the KV's records
    add_servicer(
        server, mgmtd_pb2_grpc.add_MgmtdServiceServicer_to_server, MgmtdServicer(op, users)
    )
    port = bind(server, cfg.node.host, cfg.node.port)
    address = f"{cfg.node.host}:{port}"
    elector.address = address
    op.address = address
    await server.start()
    print(f"fs3-mgmtd listening on {address}", flush=True)
    event(
        log,
        "mgmtd started",
        node=cfg.node.id,
        address=address,
        kv=db.engine,
        cluster=cfg.cluster.id,
    )
    tasks = [
        asyncio.create_task(op.run(stop), name="mgmtd-tick"),
        asyncio.create_task(_follower_heartbeats(cfg, elector, address, stop), name="mgmtd-follow"),
    ]
    elector_task = asyncio.create_task(elector.run(stop), name="mgmtd-lease")
    try:
        await stop.wait()
    finally:
        stop.set()
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.wait_for(elector_task, timeout=5.0)
        await server.stop(grace=0.5)
        db.close()
        event(log, "mgmtd stopped", node=cfg.node.id)
    return 0


def main(argv: list[str] | None = None) -> int:
    return service_main(
        list(sys.argv[1:] if argv is None else argv), "fs3 mgmtd", MgmtdConfig, serve
    )


if __name__ == "__main__":
    sys.exit(main())
