"""Read-only questions to a running cluster: mgmtd's leader and routing, chain table creation, health probes."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from fs3 import config as fs3config
from fs3.errors import FsError
from fs3.launcher.supervise import port_accepts
from fs3.mounts import mount_state

# --------------------------------------------------------------------------- mgmtd probing


class MgmtdProbe:
    """Read-only questions to mgmtd over blocking gRPC with short timeouts.

    Deliberately not the retrying :class:`fs3.client.mgmtd_client.MgmtdClient`:
    ``status`` must answer quickly on a half-dead cluster, and the waits in ``up``
    already poll with their own deadline.
    """

    def __init__(self, addresses: Sequence[str], timeout_s: float = 2.0) -> None:
        self.addresses = list(addresses)
        self.timeout_s = timeout_s

    def _stub(self, address: str) -> tuple[Any, Any]:
        from fs3.proto import mgmtd_pb2_grpc
        from fs3.rpc.channel import sync_channel

        ch = sync_channel(address)
        return ch, mgmtd_pb2_grpc.MgmtdServiceStub(ch)

    def leader(self) -> tuple[int, str] | None:
        """(node id, address) of the mgmtd that says it is the leader, or None."""
        from fs3.proto import mgmtd_pb2
        from fs3.rpc.channel import call_sync

        for addr in self.addresses:
            ch, stub = self._stub(addr)
            try:
                r = call_sync(stub.GetLeader, mgmtd_pb2.GetLeaderRequest(), timeout=self.timeout_s)
                if r.is_leader:
                    return int(r.node_id), addr
            except FsError:
                continue
            finally:
                ch.close()
        return None

    def routing(self, leader_address: str | None = None) -> Any | None:
        """The leader's RoutingInfo (asked of ``leader_address`` if known), or None."""
        from fs3.proto import mgmtd_pb2
        from fs3.rpc.channel import call_sync

        if leader_address is None:
            lead = self.leader()
            if lead is None:
                return None
            leader_address = lead[1]
        ch, stub = self._stub(leader_address)
        try:
            r = call_sync(
                stub.GetRoutingInfo,
                mgmtd_pb2.GetRoutingInfoRequest(known_version=0),
                timeout=self.timeout_s,
            )
            return r.routing if r.has_routing else None
        except FsError:
            return None
        finally:
            ch.close()


def create_chain_table(cluster_file: str, table_id: int, replicas: int, timeout_s: float) -> Any:
    """Create chain table ``table_id`` through mgmtd's client (leader discovery and retries)."""
    import asyncio

    from fs3.client.mgmtd_client import MgmtdClient

    async def run() -> Any:
        client = MgmtdClient.from_cluster_file(cluster_file)
        try:
            return await asyncio.wait_for(
                client.create_chain_table(
                    table_id=table_id, replicas=replicas, desc="fs3 cluster up"
                ),
                timeout_s,
            )
        finally:
            await client.close()

    return asyncio.run(run())


# --------------------------------------------------------------------------- docker-compose health probe


def probe(args: argparse.Namespace) -> tuple[bool, str]:
    """One health check, for docker-compose (exit 0 = healthy); never waits long."""
    if args.mgmtd:
        from fs3.proto import mgmtd_pb2, mgmtd_pb2_grpc
        from fs3.rpc.channel import call_sync, sync_channel

        ch = sync_channel(args.mgmtd)
        try:
            r = call_sync(
                mgmtd_pb2_grpc.MgmtdServiceStub(ch).GetLeader,
                mgmtd_pb2.GetLeaderRequest(),
                timeout=3.0,
            )
            return True, f"mgmtd {args.mgmtd} answers (leader: {r.address or 'none yet'})"
        except FsError as e:
            return False, f"mgmtd {args.mgmtd} does not answer: {e.message}"
        finally:
            ch.close()
    if args.leader:
        cf = fs3config.read_cluster_file(args.leader)
        lead = MgmtdProbe(cf.mgmtd_addresses, timeout_s=2.0).leader()
        return (
            (True, f"leader is node {lead[0]} at {lead[1]}") if lead else (False, "no mgmtd leads")
        )
    if args.tcp:
        ok = port_accepts(args.tcp, 3.0)
        return ok, f"{args.tcp} {'accepts' if ok else 'refuses'} connections"
    state = mount_state(args.mount)
    return state == "mounted", f"{args.mount}: {state}"
