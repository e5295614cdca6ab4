from . import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class NodeType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NODE_TYPE_UNSPECIFIED: _ClassVar[NodeType]
    NODE_TYPE_MGMTD: _ClassVar[NodeType]
    NODE_TYPE_META: _ClassVar[NodeType]
    NODE_TYPE_STORAGE: _ClassVar[NodeType]
    NODE_TYPE_CLIENT: _ClassVar[NodeType]
    NODE_TYPE_FUSE: _ClassVar[NodeType]

class NodeStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NODE_STATUS_UNSPECIFIED: _ClassVar[NodeStatus]
    NODE_STATUS_ONLINE: _ClassVar[NodeStatus]
    NODE_STATUS_OFFLINE: _ClassVar[NodeStatus]
    NODE_STATUS_DISABLED: _ClassVar[NodeStatus]

class PublicTargetState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PUBLIC_STATE_UNSPECIFIED: _ClassVar[PublicTargetState]
    PUBLIC_STATE_SERVING: _ClassVar[PublicTargetState]
    PUBLIC_STATE_LASTSRV: _ClassVar[PublicTargetState]
    PUBLIC_STATE_SYNCING: _ClassVar[PublicTargetState]
    PUBLIC_STATE_WAITING: _ClassVar[PublicTargetState]
    PUBLIC_STATE_OFFLINE: _ClassVar[PublicTargetState]

class LocalTargetState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LOCAL_STATE_UNSPECIFIED: _ClassVar[LocalTargetState]
    LOCAL_STATE_UPTODATE: _ClassVar[LocalTargetState]
    LOCAL_STATE_ONLINE: _ClassVar[LocalTargetState]
    LOCAL_STATE_OFFLINE: _ClassVar[LocalTargetState]
NODE_TYPE_UNSPECIFIED: NodeType
NODE_TYPE_MGMTD: NodeType
NODE_TYPE_META: NodeType
NODE_TYPE_STORAGE: NodeType
NODE_TYPE_CLIENT: NodeType
NODE_TYPE_FUSE: NodeType
NODE_STATUS_UNSPECIFIED: NodeStatus
NODE_STATUS_ONLINE: NodeStatus
NODE_STATUS_OFFLINE: NodeStatus
NODE_STATUS_DISABLED: NodeStatus
PUBLIC_STATE_UNSPECIFIED: PublicTargetState
PUBLIC_STATE_SERVING: PublicTargetState
PUBLIC_STATE_LASTSRV: PublicTargetState
PUBLIC_STATE_SYNCING: PublicTargetState
PUBLIC_STATE_WAITING: PublicTargetState
PUBLIC_STATE_OFFLINE: PublicTargetState
LOCAL_STATE_UNSPECIFIED: LocalTargetState
LOCAL_STATE_UPTODATE: LocalTargetState
LOCAL_STATE_ONLINE: LocalTargetState
LOCAL_STATE_OFFLINE: LocalTargetState

class NodeInfo(_message.Message):
    __slots__ = ("node_id", "type", "address", "data_address", "hostname", "status", "last_heartbeat", "tags", "name")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    DATA_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    type: NodeType
    address: str
    data_address: str
    hostname: str
    status: NodeStatus
    last_heartbeat: float
    tags: _containers.RepeatedScalarFieldContainer[str]
    name: str
    def __init__(self, node_id: _Optional[int] = ..., type: _Optional[_Union[NodeType, str]] = ..., address: _Optional[str] = ..., data_address: _Optional[str] = ..., hostname: _Optional[str] = ..., status: _Optional[_Union[NodeStatus, str]] = ..., last_heartbeat: _Optional[float] = ..., tags: _Optional[_Iterable[str]] = ..., name: _Optional[str] = ...) -> None: ...

class TargetInfo(_message.Message):
    __slots__ = ("target_id", "node_id", "chain_id", "public_state", "local_state", "used_bytes", "free_bytes", "capacity_bytes", "error_count", "low_space", "admin_offline", "last_report", "fs_id")
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    CHAIN_ID_FIELD_NUMBER: _ClassVar[int]
    PUBLIC_STATE_FIELD_NUMBER: _ClassVar[int]
    LOCAL_STATE_FIELD_NUMBER: _ClassVar[int]
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    ERROR_COUNT_FIELD_NUMBER: _ClassVar[int]
    LOW_SPACE_FIELD_NUMBER: _ClassVar[int]
    ADMIN_OFFLINE_FIELD_NUMBER: _ClassVar[int]
    LAST_REPORT_FIELD_NUMBER: _ClassVar[int]
    FS_ID_FIELD_NUMBER: _ClassVar[int]
    target_id: int
    node_id: int
    chain_id: int
    public_state: PublicTargetState
    local_state: LocalTargetState
    used_bytes: int
    free_bytes: int
    capacity_bytes: int
    error_count: int
    low_space: bool
    admin_offline: bool
    last_report: float
    fs_id: str
    def __init__(self, target_id: _Optional[int] = ..., node_id: _Optional[int] = ..., chain_id: _Optional[int] = ..., public_state: _Optional[_Union[PublicTargetState, str]] = ..., local_state: _Optional[_Union[LocalTargetState, str]] = ..., used_bytes: _Optional[int] = ..., free_bytes: _Optional[int] = ..., capacity_bytes: _Optional[int] = ..., error_count: _Optional[int] = ..., low_space: _Optional[bool] = ..., admin_offline: _Optional[bool] = ..., last_report: _Optional[float] = ..., fs_id: _Optional[str] = ...) -> None: ...

class ChainTargetInfo(_message.Message):
    __slots__ = ("target_id", "public_state")
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    PUBLIC_STATE_FIELD_NUMBER: _ClassVar[int]
    target_id: int
    public_state: PublicTargetState
    def __init__(self, target_id: _Optional[int] = ..., public_state: _Optional[_Union[PublicTargetState, str]] = ...) -> None: ...

class ChainInfo(_message.Message):
    __slots__ = ("chain_id", "version", "targets", "preferred_order")
    CHAIN_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    PREFERRED_ORDER_FIELD_NUMBER: _ClassVar[int]
    chain_id: int
    version: int
    targets: _containers.RepeatedCompositeFieldContainer[ChainTargetInfo]
    preferred_order: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, chain_id: _Optional[int] = ..., version: _Optional[int] = ..., targets: _Optional[_Iterable[_Union[ChainTargetInfo, _Mapping]]] = ..., preferred_order: _Optional[_Iterable[int]] = ...) -> None: ...

class ChainTable(_message.Message):
    __slots__ = ("table_id", "version", "chain_ids", "desc")
    TABLE_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CHAIN_IDS_FIELD_NUMBER: _ClassVar[int]
    DESC_FIELD_NUMBER: _ClassVar[int]
    table_id: int
    version: int
    chain_ids: _containers.RepeatedScalarFieldContainer[int]
    desc: str
    def __init__(self, table_id: _Optional[int] = ..., version: _Optional[int] = ..., chain_ids: _Optional[_Iterable[int]] = ..., desc: _Optional[str] = ...) -> None: ...

class RoutingInfo(_message.Message):
    __slots__ = ("version", "nodes", "targets", "chains", "chain_tables", "leader_node_id", "leader_address", "bootstrapping")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    CHAINS_FIELD_NUMBER: _ClassVar[int]
    CHAIN_TABLES_FIELD_NUMBER: _ClassVar[int]
    LEADER_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    BOOTSTRAPPING_FIELD_NUMBER: _ClassVar[int]
    version: int
    nodes: _containers.RepeatedCompositeFieldContainer[NodeInfo]
    targets: _containers.RepeatedCompositeFieldContainer[TargetInfo]
    chains: _containers.RepeatedCompositeFieldContainer[ChainInfo]
    chain_tables: _containers.RepeatedCompositeFieldContainer[ChainTable]
    leader_node_id: int
    leader_address: str
    bootstrapping: bool
    def __init__(self, version: _Optional[int] = ..., nodes: _Optional[_Iterable[_Union[NodeInfo, _Mapping]]] = ..., targets: _Optional[_Iterable[_Union[TargetInfo, _Mapping]]] = ..., chains: _Optional[_Iterable[_Union[ChainInfo, _Mapping]]] = ..., chain_tables: _Optional[_Iterable[_Union[ChainTable, _Mapping]]] = ..., leader_node_id: _Optional[int] = ..., leader_address: _Optional[str] = ..., bootstrapping: _Optional[bool] = ...) -> None: ...

class LocalTargetReport(_message.Message):
    __slots__ = ("target_id", "local_state", "used_bytes", "free_bytes", "capacity_bytes", "chain_id", "chain_version", "error_count", "low_space", "fs_id")
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    LOCAL_STATE_FIELD_NUMBER: _ClassVar[int]
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHAIN_ID_FIELD_NUMBER: _ClassVar[int]
    CHAIN_VERSION_FIELD_NUMBER: _ClassVar[int]
    ERROR_COUNT_FIELD_NUMBER: _ClassVar[int]
    LOW_SPACE_FIELD_NUMBER: _ClassVar[int]
    FS_ID_FIELD_NUMBER: _ClassVar[int]
    target_id: int
    local_state: LocalTargetState
    used_bytes: int
    free_bytes: int
    capacity_bytes: int
    chain_id: int
    chain_version: int
    error_count: int
    low_space: bool
    fs_id: str
    def __init__(self, target_id: _Optional[int] = ..., local_state: _Optional[_Union[LocalTargetState, str]] = ..., used_bytes: _Optional[int] = ..., free_bytes: _Optional[int] = ..., capacity_bytes: _Optional[int] = ..., chain_id: _Optional[int] = ..., chain_version: _Optional[int] = ..., error_count: _Optional[int] = ..., low_space: _Optional[bool] = ..., fs_id: _Optional[str] = ...) -> None: ...

class RegisterNodeRequest(_message.Message):
    __slots__ = ("cluster_id", "node_id", "type", "address", "data_address", "hostname", "targets", "name")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    DATA_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    cluster_id: str
    node_id: int
    type: NodeType
    address: str
    data_address: str
    hostname: str
    targets: _containers.RepeatedCompositeFieldContainer[LocalTargetReport]
    name: str
    def __init__(self, cluster_id: _Optional[str] = ..., node_id: _Optional[int] = ..., type: _Optional[_Union[NodeType, str]] = ..., address: _Optional[str] = ..., data_address: _Optional[str] = ..., hostname: _Optional[str] = ..., targets: _Optional[_Iterable[_Union[LocalTargetReport, _Mapping]]] = ..., name: _Optional[str] = ...) -> None: ...

class RegisterNodeResponse(_message.Message):
    __slots__ = ("routing",)
    ROUTING_FIELD_NUMBER: _ClassVar[int]
    routing: RoutingInfo
    def __init__(self, routing: _Optional[_Union[RoutingInfo, _Mapping]] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("cluster_id", "node_id", "type", "address", "data_address", "hb_version", "targets", "timestamp", "hostname", "name")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    DATA_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    HB_VERSION_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    cluster_id: str
    node_id: int
    type: NodeType
    address: str
    data_address: str
    hb_version: int
    targets: _containers.RepeatedCompositeFieldContainer[LocalTargetReport]
    timestamp: float
    hostname: str
    name: str
    def __init__(self, cluster_id: _Optional[str] = ..., node_id: _Optional[int] = ..., type: _Optional[_Union[NodeType, str]] = ..., address: _Optional[str] = ..., data_address: _Optional[str] = ..., hb_version: _Optional[int] = ..., targets: _Optional[_Iterable[_Union[LocalTargetReport, _Mapping]]] = ..., timestamp: _Optional[float] = ..., hostname: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("routing_version", "last_hb_version")
    ROUTING_VERSION_FIELD_NUMBER: _ClassVar[int]
    LAST_HB_VERSION_FIELD_NUMBER: _ClassVar[int]
    routing_version: int
    last_hb_version: int
    def __init__(self, routing_version: _Optional[int] = ..., last_hb_version: _Optional[int] = ...) -> None: ...

class GetRoutingInfoRequest(_message.Message):
    __slots__ = ("known_version",)
    KNOWN_VERSION_FIELD_NUMBER: _ClassVar[int]
    known_version: int
    def __init__(self, known_version: _Optional[int] = ...) -> None: ...

class GetRoutingInfoResponse(_message.Message):
    __slots__ = ("has_routing", "routing")
    HAS_ROUTING_FIELD_NUMBER: _ClassVar[int]
    ROUTING_FIELD_NUMBER: _ClassVar[int]
    has_routing: bool
    routing: RoutingInfo
    def __init__(self, has_routing: _Optional[bool] = ..., routing: _Optional[_Union[RoutingInfo, _Mapping]] = ...) -> None: ...

class WatchRoutingInfoRequest(_message.Message):
    __slots__ = ("known_version",)
    KNOWN_VERSION_FIELD_NUMBER: _ClassVar[int]
    known_version: int
    def __init__(self, known_version: _Optional[int] = ...) -> None: ...

class GetLeaderRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetLeaderResponse(_message.Message):
    __slots__ = ("node_id", "address", "is_leader", "lease_end")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    IS_LEADER_FIELD_NUMBER: _ClassVar[int]
    LEASE_END_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    address: str
    is_leader: bool
    lease_end: float
    def __init__(self, node_id: _Optional[int] = ..., address: _Optional[str] = ..., is_leader: _Optional[bool] = ..., lease_end: _Optional[float] = ...) -> None: ...

class CreateChainTableRequest(_message.Message):
    __slots__ = ("table_id", "replicas", "node_ids", "desc")
    TABLE_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    DESC_FIELD_NUMBER: _ClassVar[int]
    table_id: int
    replicas: int
    node_ids: _containers.RepeatedScalarFieldContainer[int]
    desc: str
    def __init__(self, table_id: _Optional[int] = ..., replicas: _Optional[int] = ..., node_ids: _Optional[_Iterable[int]] = ..., desc: _Optional[str] = ...) -> None: ...

class ChainBalance(_message.Message):
    __slots__ = ("max_pair", "min_pair", "max_chains_per_target", "min_chains_per_target", "unused_targets", "max_chains_per_node", "min_chains_per_node", "mean_pair")
    MAX_PAIR_FIELD_NUMBER: _ClassVar[int]
    MIN_PAIR_FIELD_NUMBER: _ClassVar[int]
    MAX_CHAINS_PER_TARGET_FIELD_NUMBER: _ClassVar[int]
    MIN_CHAINS_PER_TARGET_FIELD_NUMBER: _ClassVar[int]
    UNUSED_TARGETS_FIELD_NUMBER: _ClassVar[int]
    MAX_CHAINS_PER_NODE_FIELD_NUMBER: _ClassVar[int]
    MIN_CHAINS_PER_NODE_FIELD_NUMBER: _ClassVar[int]
    MEAN_PAIR_FIELD_NUMBER: _ClassVar[int]
    max_pair: int
    min_pair: int
    max_chains_per_target: int
    min_chains_per_target: int
    unused_targets: int
    max_chains_per_node: int
    min_chains_per_node: int
    mean_pair: float
    def __init__(self, max_pair: _Optional[int] = ..., min_pair: _Optional[int] = ..., max_chains_per_target: _Optional[int] = ..., min_chains_per_target: _Optional[int] = ..., unused_targets: _Optional[int] = ..., max_chains_per_node: _Optional[int] = ..., min_chains_per_node: _Optional[int] = ..., mean_pair: _Optional[float] = ...) -> None: ...

class CreateChainTableResponse(_message.Message):
    __slots__ = ("table", "chains", "balance")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    CHAINS_FIELD_NUMBER: _ClassVar[int]
    BALANCE_FIELD_NUMBER: _ClassVar[int]
    table: ChainTable
    chains: _containers.RepeatedCompositeFieldContainer[ChainInfo]
    balance: ChainBalance
    def __init__(self, table: _Optional[_Union[ChainTable, _Mapping]] = ..., chains: _Optional[_Iterable[_Union[ChainInfo, _Mapping]]] = ..., balance: _Optional[_Union[ChainBalance, _Mapping]] = ...) -> None: ...

class SetTargetStateRequest(_message.Message):
    __slots__ = ("target_id", "offline")
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    OFFLINE_FIELD_NUMBER: _ClassVar[int]
    target_id: int
    offline: bool
    def __init__(self, target_id: _Optional[int] = ..., offline: _Optional[bool] = ...) -> None: ...

class SetTargetStateResponse(_message.Message):
    __slots__ = ("chain",)
    CHAIN_FIELD_NUMBER: _ClassVar[int]
    chain: ChainInfo
    def __init__(self, chain: _Optional[_Union[ChainInfo, _Mapping]] = ...) -> None: ...

class ReportTargetErrorRequest(_message.Message):
    __slots__ = ("target_id", "node_id", "kind", "detail")
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    target_id: int
    node_id: int
    kind: str
    detail: str
    def __init__(self, target_id: _Optional[int] = ..., node_id: _Optional[int] = ..., kind: _Optional[str] = ..., detail: _Optional[str] = ...) -> None: ...

class MgmtdLease(_message.Message):
    __slots__ = ("node_id", "address", "lease_start", "lease_end", "release")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    LEASE_START_FIELD_NUMBER: _ClassVar[int]
    LEASE_END_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    address: str
    lease_start: float
    lease_end: float
    release: int
    def __init__(self, node_id: _Optional[int] = ..., address: _Optional[str] = ..., lease_start: _Optional[float] = ..., lease_end: _Optional[float] = ..., release: _Optional[int] = ...) -> None: ...

class UserRecord(_message.Message):
    __slots__ = ("name", "uid", "gid", "groups", "admin", "token_id", "created")
    NAME_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    GID_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    ADMIN_FIELD_NUMBER: _ClassVar[int]
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    name: str
    uid: int
    gid: int
    groups: _containers.RepeatedScalarFieldContainer[int]
    admin: bool
    token_id: str
    created: float
    def __init__(self, name: _Optional[str] = ..., uid: _Optional[int] = ..., gid: _Optional[int] = ..., groups: _Optional[_Iterable[int]] = ..., admin: _Optional[bool] = ..., token_id: _Optional[str] = ..., created: _Optional[float] = ...) -> None: ...

class AddUserRequest(_message.Message):
    __slots__ = ("name", "uid", "gid", "groups", "admin")
    NAME_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    GID_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    ADMIN_FIELD_NUMBER: _ClassVar[int]
    name: str
    uid: int
    gid: int
    groups: _containers.RepeatedScalarFieldContainer[int]
    admin: bool
    def __init__(self, name: _Optional[str] = ..., uid: _Optional[int] = ..., gid: _Optional[int] = ..., groups: _Optional[_Iterable[int]] = ..., admin: _Optional[bool] = ...) -> None: ...

class UserTokenRequest(_message.Message):
    __slots__ = ("name", "rotate")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ROTATE_FIELD_NUMBER: _ClassVar[int]
    name: str
    rotate: bool
    def __init__(self, name: _Optional[str] = ..., rotate: _Optional[bool] = ...) -> None: ...

class UserTokenResponse(_message.Message):
    __slots__ = ("user", "token")
    USER_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    user: UserRecord
    token: str
    def __init__(self, user: _Optional[_Union[UserRecord, _Mapping]] = ..., token: _Optional[str] = ...) -> None: ...

class RemoveUserRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class ListUsersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListUsersResponse(_message.Message):
    __slots__ = ("users",)
    USERS_FIELD_NUMBER: _ClassVar[int]
    users: _containers.RepeatedCompositeFieldContainer[UserRecord]
    def __init__(self, users: _Optional[_Iterable[_Union[UserRecord, _Mapping]]] = ...) -> None: ...

class GetUserRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class GetUserResponse(_message.Message):
    __slots__ = ("found", "user")
    FOUND_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    found: bool
    user: UserRecord
    def __init__(self, found: _Optional[bool] = ..., user: _Optional[_Union[UserRecord, _Mapping]] = ...) -> None: ...
