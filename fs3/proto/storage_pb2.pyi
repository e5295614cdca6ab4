from . import common_pb2 as _common_pb2
from . import mgmtd_pb2 as _mgmtd_pb2
from . import transport_pb2 as _transport_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class UpdateType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    UPDATE_TYPE_UNSPECIFIED: _ClassVar[UpdateType]
    UPDATE_WRITE: _ClassVar[UpdateType]
    UPDATE_TRUNCATE: _ClassVar[UpdateType]
    UPDATE_EXTEND: _ClassVar[UpdateType]
    UPDATE_REMOVE: _ClassVar[UpdateType]
UPDATE_TYPE_UNSPECIFIED: UpdateType
UPDATE_WRITE: UpdateType
UPDATE_TRUNCATE: UpdateType
UPDATE_EXTEND: UpdateType
UPDATE_REMOVE: UpdateType

class ChunkId(_message.Message):
    __slots__ = ("inode", "index")
    INODE_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    inode: int
    index: int
    def __init__(self, inode: _Optional[int] = ..., index: _Optional[int] = ...) -> None: ...

class ChunkRange(_message.Message):
    __slots__ = ("inode", "begin", "end", "max_chunks")
    INODE_FIELD_NUMBER: _ClassVar[int]
    BEGIN_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    MAX_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    inode: int
    begin: int
    end: int
    max_chunks: int
    def __init__(self, inode: _Optional[int] = ..., begin: _Optional[int] = ..., end: _Optional[int] = ..., max_chunks: _Optional[int] = ...) -> None: ...

class UpdateTag(_message.Message):
    __slots__ = ("client_id", "request_id", "channel_id", "seqnum")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CHANNEL_ID_FIELD_NUMBER: _ClassVar[int]
    SEQNUM_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    request_id: int
    channel_id: int
    seqnum: int
    def __init__(self, client_id: _Optional[str] = ..., request_id: _Optional[int] = ..., channel_id: _Optional[int] = ..., seqnum: _Optional[int] = ...) -> None: ...

class UpdateIO(_message.Message):
    __slots__ = ("chain_id", "chain_version", "chunk", "type", "offset", "length", "chunk_size", "checksum", "data", "update_ver", "full_chunk")
    CHAIN_ID_FIELD_NUMBER: _ClassVar[int]
    CHAIN_VERSION_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    CHUNK_SIZE_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    UPDATE_VER_FIELD_NUMBER: _ClassVar[int]
    FULL_CHUNK_FIELD_NUMBER: _ClassVar[int]
    chain_id: int
    chain_version: int
    chunk: ChunkId
    type: UpdateType
    offset: int
    length: int
    chunk_size: int
    checksum: int
    data: _transport_pb2.DataRef
    update_ver: int
    full_chunk: bool
    def __init__(self, chain_id: _Optional[int] = ..., chain_version: _Optional[int] = ..., chunk: _Optional[_Union[ChunkId, _Mapping]] = ..., type: _Optional[_Union[UpdateType, str]] = ..., offset: _Optional[int] = ..., length: _Optional[int] = ..., chunk_size: _Optional[int] = ..., checksum: _Optional[int] = ..., data: _Optional[_Union[_transport_pb2.DataRef, _Mapping]] = ..., update_ver: _Optional[int] = ..., full_chunk: _Optional[bool] = ...) -> None: ...

class IOResult(_message.Message):
    __slots__ = ("length", "commit_ver", "update_ver", "checksum", "commit_chain_ver", "chunk_length")
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    COMMIT_VER_FIELD_NUMBER: _ClassVar[int]
    UPDATE_VER_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    COMMIT_CHAIN_VER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_LENGTH_FIELD_NUMBER: _ClassVar[int]
    length: int
    commit_ver: int
    update_ver: int
    checksum: int
    commit_chain_ver: int
    chunk_length: int
    def __init__(self, length: _Optional[int] = ..., commit_ver: _Optional[int] = ..., update_ver: _Optional[int] = ..., checksum: _Optional[int] = ..., commit_chain_ver: _Optional[int] = ..., chunk_length: _Optional[int] = ...) -> None: ...

class WriteRequest(_message.Message):
    __slots__ = ("io", "tag", "retry_count", "target_id", "capability")
    IO_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    RETRY_COUNT_FIELD_NUMBER: _ClassVar[int]
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    io: UpdateIO
    tag: UpdateTag
    retry_count: int
    target_id: int
    capability: bytes
    def __init__(self, io: _Optional[_Union[UpdateIO, _Mapping]] = ..., tag: _Optional[_Union[UpdateTag, _Mapping]] = ..., retry_count: _Optional[int] = ..., target_id: _Optional[int] = ..., capability: _Optional[bytes] = ...) -> None: ...

class WriteResponse(_message.Message):
    __slots__ = ("result",)
    RESULT_FIELD_NUMBER: _ClassVar[int]
    result: IOResult
    def __init__(self, result: _Optional[_Union[IOResult, _Mapping]] = ...) -> None: ...

class UpdateRequest(_message.Message):
    __slots__ = ("io", "tag", "is_syncing", "from_target_id", "to_target_id", "capability")
    IO_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    IS_SYNCING_FIELD_NUMBER: _ClassVar[int]
    FROM_TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    TO_TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    io: UpdateIO
    tag: UpdateTag
    is_syncing: bool
    from_target_id: int
    to_target_id: int
    capability: bytes
    def __init__(self, io: _Optional[_Union[UpdateIO, _Mapping]] = ..., tag: _Optional[_Union[UpdateTag, _Mapping]] = ..., is_syncing: _Optional[bool] = ..., from_target_id: _Optional[int] = ..., to_target_id: _Optional[int] = ..., capability: _Optional[bytes] = ...) -> None: ...

class UpdateResponse(_message.Message):
    __slots__ = ("result",)
    RESULT_FIELD_NUMBER: _ClassVar[int]
    result: IOResult
    def __init__(self, result: _Optional[_Union[IOResult, _Mapping]] = ...) -> None: ...

class ReadIO(_message.Message):
    __slots__ = ("chain_id", "chain_version", "chunk", "offset", "length", "dest", "target_id", "capability")
    CHAIN_ID_FIELD_NUMBER: _ClassVar[int]
    CHAIN_VERSION_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    DEST_FIELD_NUMBER: _ClassVar[int]
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    chain_id: int
    chain_version: int
    chunk: ChunkId
    offset: int
    length: int
    dest: _transport_pb2.DataRef
    target_id: int
    capability: bytes
    def __init__(self, chain_id: _Optional[int] = ..., chain_version: _Optional[int] = ..., chunk: _Optional[_Union[ChunkId, _Mapping]] = ..., offset: _Optional[int] = ..., length: _Optional[int] = ..., dest: _Optional[_Union[_transport_pb2.DataRef, _Mapping]] = ..., target_id: _Optional[int] = ..., capability: _Optional[bytes] = ...) -> None: ...

class ReadResult(_message.Message):
    __slots__ = ("error", "length", "commit_ver", "checksum", "chunk_length", "chunk_checksum", "data")
    ERROR_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    COMMIT_VER_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    CHUNK_LENGTH_FIELD_NUMBER: _ClassVar[int]
    CHUNK_CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    error: _common_pb2.ErrorDetail
    length: int
    commit_ver: int
    checksum: int
    chunk_length: int
    chunk_checksum: int
    data: bytes
    def __init__(self, error: _Optional[_Union[_common_pb2.ErrorDetail, _Mapping]] = ..., length: _Optional[int] = ..., commit_ver: _Optional[int] = ..., checksum: _Optional[int] = ..., chunk_length: _Optional[int] = ..., chunk_checksum: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class BatchReadRequest(_message.Message):
    __slots__ = ("ios", "client_id", "request_id", "cancel")
    IOS_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    ios: _containers.RepeatedCompositeFieldContainer[ReadIO]
    client_id: str
    request_id: int
    cancel: bool
    def __init__(self, ios: _Optional[_Iterable[_Union[ReadIO, _Mapping]]] = ..., client_id: _Optional[str] = ..., request_id: _Optional[int] = ..., cancel: _Optional[bool] = ...) -> None: ...

class BatchReadResponse(_message.Message):
    __slots__ = ("results", "request_id")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[ReadResult]
    request_id: int
    def __init__(self, results: _Optional[_Iterable[_Union[ReadResult, _Mapping]]] = ..., request_id: _Optional[int] = ...) -> None: ...

class QueryLastChunkOp(_message.Message):
    __slots__ = ("chain_id", "chain_version", "range", "capability")
    CHAIN_ID_FIELD_NUMBER: _ClassVar[int]
    CHAIN_VERSION_FIELD_NUMBER: _ClassVar[int]
    RANGE_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    chain_id: int
    chain_version: int
    range: ChunkRange
    capability: bytes
    def __init__(self, chain_id: _Optional[int] = ..., chain_version: _Optional[int] = ..., range: _Optional[_Union[ChunkRange, _Mapping]] = ..., capability: _Optional[bytes] = ...) -> None: ...

class QueryLastChunkResult(_message.Message):
    __slots__ = ("error", "found", "last_index", "last_length", "total_length", "total_chunks", "more")
    ERROR_FIELD_NUMBER: _ClassVar[int]
    FOUND_FIELD_NUMBER: _ClassVar[int]
    LAST_INDEX_FIELD_NUMBER: _ClassVar[int]
    LAST_LENGTH_FIELD_NUMBER: _ClassVar[int]
    TOTAL_LENGTH_FIELD_NUMBER: _ClassVar[int]
    TOTAL_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    error: _common_pb2.ErrorDetail
    found: bool
    last_index: int
    last_length: int
    total_length: int
    total_chunks: int
    more: bool
    def __init__(self, error: _Optional[_Union[_common_pb2.ErrorDetail, _Mapping]] = ..., found: _Optional[bool] = ..., last_index: _Optional[int] = ..., last_length: _Optional[int] = ..., total_length: _Optional[int] = ..., total_chunks: _Optional[int] = ..., more: _Optional[bool] = ...) -> None: ...

class QueryLastChunkRequest(_message.Message):
    __slots__ = ("ops",)
    OPS_FIELD_NUMBER: _ClassVar[int]
    ops: _containers.RepeatedCompositeFieldContainer[QueryLastChunkOp]
    def __init__(self, ops: _Optional[_Iterable[_Union[QueryLastChunkOp, _Mapping]]] = ...) -> None: ...

class QueryLastChunkResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[QueryLastChunkResult]
    def __init__(self, results: _Optional[_Iterable[_Union[QueryLastChunkResult, _Mapping]]] = ...) -> None: ...

class TruncateChunkOp(_message.Message):
    __slots__ = ("chain_id", "chain_version", "chunk", "length", "chunk_size", "only_extend", "tag", "capability")
    CHAIN_ID_FIELD_NUMBER: _ClassVar[int]
    CHAIN_VERSION_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    CHUNK_SIZE_FIELD_NUMBER: _ClassVar[int]
    ONLY_EXTEND_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    chain_id: int
    chain_version: int
    chunk: ChunkId
    length: int
    chunk_size: int
    only_extend: bool
    tag: UpdateTag
    capability: bytes
    def __init__(self, chain_id: _Optional[int] = ..., chain_version: _Optional[int] = ..., chunk: _Optional[_Union[ChunkId, _Mapping]] = ..., length: _Optional[int] = ..., chunk_size: _Optional[int] = ..., only_extend: _Optional[bool] = ..., tag: _Optional[_Union[UpdateTag, _Mapping]] = ..., capability: _Optional[bytes] = ...) -> None: ...

class TruncateChunkResult(_message.Message):
    __slots__ = ("error", "result")
    ERROR_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    error: _common_pb2.ErrorDetail
    result: IOResult
    def __init__(self, error: _Optional[_Union[_common_pb2.ErrorDetail, _Mapping]] = ..., result: _Optional[_Union[IOResult, _Mapping]] = ...) -> None: ...

class TruncateChunksRequest(_message.Message):
    __slots__ = ("ops",)
    OPS_FIELD_NUMBER: _ClassVar[int]
    ops: _containers.RepeatedCompositeFieldContainer[TruncateChunkOp]
    def __init__(self, ops: _Optional[_Iterable[_Union[TruncateChunkOp, _Mapping]]] = ...) -> None: ...

class TruncateChunksResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[TruncateChunkResult]
    def __init__(self, results: _Optional[_Iterable[_Union[TruncateChunkResult, _Mapping]]] = ...) -> None: ...

class RemoveChunksOp(_message.Message):
    __slots__ = ("chain_id", "chain_version", "range", "tag", "capability")
    CHAIN_ID_FIELD_NUMBER: _ClassVar[int]
    CHAIN_VERSION_FIELD_NUMBER: _ClassVar[int]
    RANGE_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    chain_id: int
    chain_version: int
    range: ChunkRange
    tag: UpdateTag
    capability: bytes
    def __init__(self, chain_id: _Optional[int] = ..., chain_version: _Optional[int] = ..., range: _Optional[_Union[ChunkRange, _Mapping]] = ..., tag: _Optional[_Union[UpdateTag, _Mapping]] = ..., capability: _Optional[bytes] = ...) -> None: ...

class RemoveChunksResult(_message.Message):
    __slots__ = ("error", "removed", "more")
    ERROR_FIELD_NUMBER: _ClassVar[int]
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    error: _common_pb2.ErrorDetail
    removed: int
    more: bool
    def __init__(self, error: _Optional[_Union[_common_pb2.ErrorDetail, _Mapping]] = ..., removed: _Optional[int] = ..., more: _Optional[bool] = ...) -> None: ...

class RemoveChunksRequest(_message.Message):
    __slots__ = ("ops",)
    OPS_FIELD_NUMBER: _ClassVar[int]
    ops: _containers.RepeatedCompositeFieldContainer[RemoveChunksOp]
    def __init__(self, ops: _Optional[_Iterable[_Union[RemoveChunksOp, _Mapping]]] = ...) -> None: ...

class RemoveChunksResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[RemoveChunksResult]
    def __init__(self, results: _Optional[_Iterable[_Union[RemoveChunksResult, _Mapping]]] = ...) -> None: ...

class ChunkMeta(_message.Message):
    __slots__ = ("chunk", "commit_ver", "update_ver", "chain_ver", "length", "checksum", "uncommitted")
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    COMMIT_VER_FIELD_NUMBER: _ClassVar[int]
    UPDATE_VER_FIELD_NUMBER: _ClassVar[int]
    CHAIN_VER_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    UNCOMMITTED_FIELD_NUMBER: _ClassVar[int]
    chunk: ChunkId
    commit_ver: int
    update_ver: int
    chain_ver: int
    length: int
    checksum: int
    uncommitted: bool
    def __init__(self, chunk: _Optional[_Union[ChunkId, _Mapping]] = ..., commit_ver: _Optional[int] = ..., update_ver: _Optional[int] = ..., chain_ver: _Optional[int] = ..., length: _Optional[int] = ..., checksum: _Optional[int] = ..., uncommitted: _Optional[bool] = ...) -> None: ...

class SyncStartRequest(_message.Message):
    __slots__ = ("chain_id", "chain_version", "target_id", "from_target_id", "capability")
    CHAIN_ID_FIELD_NUMBER: _ClassVar[int]
    CHAIN_VERSION_FIELD_NUMBER: _ClassVar[int]
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    chain_id: int
    chain_version: int
    target_id: int
    from_target_id: int
    capability: bytes
    def __init__(self, chain_id: _Optional[int] = ..., chain_version: _Optional[int] = ..., target_id: _Optional[int] = ..., from_target_id: _Optional[int] = ..., capability: _Optional[bytes] = ...) -> None: ...

class SyncStartResponse(_message.Message):
    __slots__ = ("metas",)
    METAS_FIELD_NUMBER: _ClassVar[int]
    metas: _containers.RepeatedCompositeFieldContainer[ChunkMeta]
    def __init__(self, metas: _Optional[_Iterable[_Union[ChunkMeta, _Mapping]]] = ...) -> None: ...

class SyncDoneRequest(_message.Message):
    __slots__ = ("chain_id", "chain_version", "target_id", "from_target_id", "capability")
    CHAIN_ID_FIELD_NUMBER: _ClassVar[int]
    CHAIN_VERSION_FIELD_NUMBER: _ClassVar[int]
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    chain_id: int
    chain_version: int
    target_id: int
    from_target_id: int
    capability: bytes
    def __init__(self, chain_id: _Optional[int] = ..., chain_version: _Optional[int] = ..., target_id: _Optional[int] = ..., from_target_id: _Optional[int] = ..., capability: _Optional[bytes] = ...) -> None: ...

class SyncDoneResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TargetSpace(_message.Message):
    __slots__ = ("target_id", "path", "capacity_bytes", "free_bytes", "used_bytes", "chunk_count", "chain_id", "local_state")
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHUNK_COUNT_FIELD_NUMBER: _ClassVar[int]
    CHAIN_ID_FIELD_NUMBER: _ClassVar[int]
    LOCAL_STATE_FIELD_NUMBER: _ClassVar[int]
    target_id: int
    path: str
    capacity_bytes: int
    free_bytes: int
    used_bytes: int
    chunk_count: int
    chain_id: int
    local_state: _mgmtd_pb2.LocalTargetState
    def __init__(self, target_id: _Optional[int] = ..., path: _Optional[str] = ..., capacity_bytes: _Optional[int] = ..., free_bytes: _Optional[int] = ..., used_bytes: _Optional[int] = ..., chunk_count: _Optional[int] = ..., chain_id: _Optional[int] = ..., local_state: _Optional[_Union[_mgmtd_pb2.LocalTargetState, str]] = ...) -> None: ...

class SpaceInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SpaceInfoResponse(_message.Message):
    __slots__ = ("targets",)
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    targets: _containers.RepeatedCompositeFieldContainer[TargetSpace]
    def __init__(self, targets: _Optional[_Iterable[_Union[TargetSpace, _Mapping]]] = ...) -> None: ...

class ListChunksRequest(_message.Message):
    __slots__ = ("target_id", "chain_id", "inode")
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    CHAIN_ID_FIELD_NUMBER: _ClassVar[int]
    INODE_FIELD_NUMBER: _ClassVar[int]
    target_id: int
    chain_id: int
    inode: int
    def __init__(self, target_id: _Optional[int] = ..., chain_id: _Optional[int] = ..., inode: _Optional[int] = ...) -> None: ...

class ListChunksResponse(_message.Message):
    __slots__ = ("target_id", "metas")
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    METAS_FIELD_NUMBER: _ClassVar[int]
    target_id: int
    metas: _containers.RepeatedCompositeFieldContainer[ChunkMeta]
    def __init__(self, target_id: _Optional[int] = ..., metas: _Optional[_Iterable[_Union[ChunkMeta, _Mapping]]] = ...) -> None: ...
