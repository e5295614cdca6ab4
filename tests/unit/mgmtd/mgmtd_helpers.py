"""Helpers for mgmtd unit tests: operators over a shared memory KV with a fake clock."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fs3.clock import FakeClock
from fs3.config import MgmtdConfig, MgmtdSection
from fs3.errors import Code, FsError
from fs3.kv import Database, Transaction
from fs3.kv.memory import MemoryDatabase
from fs3.mgmtd.election import Elector
from fs3.mgmtd.operator import MgmtdOperator
from fs3.proto import mgmtd_pb2 as pb

CLUSTER = "unit"

TIMINGS = dict(
    lease_length_s=10.0,
    lease_renew_interval_s=2.0,
    lease_safety_margin_s=3.0,
    heartbeat_interval_s=1.0,
    heartbeat_timeout_s=5.0,
    check_interval_s=0.5,
)


class SwitchableDatabase(Database):
    """A memory KV that can be made unavailable (every transaction fails at once)."""

    engine = "switchable"

    def __init__(self) -> None:
        super().__init__()
        self.inner = MemoryDatabase()
        self.down = False

    def create_transaction(self) -> Transaction:
        if self.down:
            raise FsError(Code.KV_UNAVAILABLE, "kv is down (test)", retryable=False)
        return self.inner.create_transaction()


@dataclass
class Mgmtd:
    op: MgmtdOperator
    elector: Elector
    address: str


def make_mgmtd(db: Database, clock: FakeClock, node_id: int = 1, **overrides: Any) -> Mgmtd:
    cfg = MgmtdConfig()
    cfg.node.id = node_id
    cfg.cluster.id = CLUSTER
    cfg.mgmtd = MgmtdSection(**{**TIMINGS, **overrides})
    cfg.mgmtd.validate()
    address = f"127.0.0.1:{9000 + node_id}"
    elector = Elector(db, node_id, address, cfg.mgmtd, clock=clock)
    op = MgmtdOperator(db, cfg, elector, address, clock=clock)
    return Mgmtd(op, elector, address)


def storage_register(
    node: int, targets: int = 2, state: int = pb.LOCAL_STATE_ONLINE
) -> pb.RegisterNodeRequest:
    """storage-i with targets i*100+1.. (ids and numbering of the local cluster)."""
    return pb.RegisterNodeRequest(
        cluster_id=CLUSTER,
        node_id=10000 + node,
        type=pb.NODE_TYPE_STORAGE,
        address=f"127.0.0.1:{20000 + node}",
        name=f"storage-{node}",
        targets=[
            pb.LocalTargetReport(
                target_id=node * 100 + j, local_state=state, capacity_bytes=1 << 30
            )
            for j in range(1, targets + 1)
        ],
    )


class Heartbeater:
    """Sends heartbeats for storage nodes with strictly increasing versions."""

    def __init__(self) -> None:
        self.hb = 0

    def request(
        self,
        node: int,
        states: dict[int, int],
        chain_versions: dict[int, int] | None = None,
        used: int = 0,
    ) -> pb.HeartbeatRequest:
        self.hb += 1
        return pb.HeartbeatRequest(
            cluster_id=CLUSTER,
            node_id=10000 + node,
            type=pb.NODE_TYPE_STORAGE,
            address=f"127.0.0.1:{20000 + node}",
            hb_version=self.hb,
            targets=[
                pb.LocalTargetReport(
                    target_id=tid,
                    local_state=st,
                    chain_version=(chain_versions or {}).get(tid, 0),
                    used_bytes=used,
                )
                for tid, st in states.items()
            ],
        )
