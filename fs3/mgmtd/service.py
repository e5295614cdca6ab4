"""gRPC adapter of mgmtd: every handler forwards to :class:`MgmtdOperator`.

Thin on purpose (3FS ``MgmtdService``): no logic here, no grpc imports; errors
are ``FsError``s that ``fs3.rpc.server.guard_servicer`` turns into statuses.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fs3.mgmtd.operator import MgmtdOperator
from fs3.mgmtd.users import Users
from fs3.proto import common_pb2, mgmtd_pb2, mgmtd_pb2_grpc


class MgmtdServicer(mgmtd_pb2_grpc.MgmtdServiceServicer):
    def __init__(self, operator: MgmtdOperator, users: Users | None = None) -> None:
        self.op = operator
        self.users = users or Users(operator.db, None)

    async def GetLeader(
        self, request: mgmtd_pb2.GetLeaderRequest, context: Any
    ) -> mgmtd_pb2.GetLeaderResponse:
        return self.op.get_leader()

    async def RegisterNode(
        self, request: mgmtd_pb2.RegisterNodeRequest, context: Any
    ) -> mgmtd_pb2.RegisterNodeResponse:
        return await self.op.register_node(request)

    async def Heartbeat(
        self, request: mgmtd_pb2.HeartbeatRequest, context: Any
    ) -> mgmtd_pb2.HeartbeatResponse:
        return await self.op.heartbeat(request)

    async def GetRoutingInfo(
        self, request: mgmtd_pb2.GetRoutingInfoRequest, context: Any
    ) -> mgmtd_pb2.GetRoutingInfoResponse:
        return self.op.get_routing(request.known_version)

    async def WatchRoutingInfo(
        self, request: mgmtd_pb2.WatchRoutingInfoRequest, context: Any
    ) -> AsyncIterator[mgmtd_pb2.RoutingInfo]:
        async for info in self.op.watch_routing(request.known_version):
            yield info

    async def CreateChainTable(
        self, request: mgmtd_pb2.CreateChainTableRequest, context: Any
    ) -> mgmtd_pb2.CreateChainTableResponse:
        return await self.op.create_chain_table(request)

    async def SetTargetState(
        self, request: mgmtd_pb2.SetTargetStateRequest, context: Any
    ) -> mgmtd_pb2.SetTargetStateResponse:
        return await self.op.set_target_state(request)

    async def ReportTargetError(
        self, request: mgmtd_pb2.ReportTargetErrorRequest, context: Any
    ) -> common_pb2.Empty:
        await self.op.report_target_error(request)
        return common_pb2.Empty()

    async def AddUser(
        self, request: mgmtd_pb2.AddUserRequest, context: Any
    ) -> mgmtd_pb2.UserTokenResponse:
        return await self.users.add(request)

    async def RemoveUser(
        self, request: mgmtd_pb2.RemoveUserRequest, context: Any
    ) -> common_pb2.Empty:
        await self.users.remove(request.name)
        return common_pb2.Empty()

    async def ListUsers(
        self, request: mgmtd_pb2.ListUsersRequest, context: Any
    ) -> mgmtd_pb2.ListUsersResponse:
        return await self.users.list()

    async def UserToken(
        self, request: mgmtd_pb2.UserTokenRequest, context: Any
    ) -> mgmtd_pb2.UserTokenResponse:
        return await self.users.token(request)

    async def GetUser(
        self, request: mgmtd_pb2.GetUserRequest, context: Any
    ) -> mgmtd_pb2.GetUserResponse:
        rec = await self.users.lookup(request.name)
        if rec is None:
            return mgmtd_pb2.GetUserResponse(found=False)
        return mgmtd_pb2.GetUserResponse(found=True, user=rec)
