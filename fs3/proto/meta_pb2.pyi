from . import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SetAttrField(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SETATTR_NONE: _ClassVar[SetAttrField]
    SETATTR_MODE: _ClassVar[SetAttrField]
    SETATTR_UID: _ClassVar[SetAttrField]
    SETATTR_GID: _ClassVar[SetAttrField]
    SETATTR_SIZE: _ClassVar[SetAttrField]
    SETATTR_ATIME: _ClassVar[SetAttrField]
    SETATTR_MTIME: _ClassVar[SetAttrField]
    SETATTR_ATIME_NOW: _ClassVar[SetAttrField]
    SETATTR_MTIME_NOW: _ClassVar[SetAttrField]
    SETATTR_CTIME: _ClassVar[SetAttrField]
SETATTR_NONE: SetAttrField
SETATTR_MODE: SetAttrField
SETATTR_UID: SetAttrField
SETATTR_GID: SetAttrField
SETATTR_SIZE: SetAttrField
SETATTR_ATIME: SetAttrField
SETATTR_MTIME: SetAttrField
SETATTR_ATIME_NOW: SetAttrField
SETATTR_MTIME_NOW: SetAttrField
SETATTR_CTIME: SetAttrField

class Layout(_message.Message):
    __slots__ = ("chunk_size", "stripe", "table_id", "table_version", "chain_ids")
    CHUNK_SIZE_FIELD_NUMBER: _ClassVar[int]
    STRIPE_FIELD_NUMBER: _ClassVar[int]
    TABLE_ID_FIELD_NUMBER: _ClassVar[int]
    TABLE_VERSION_FIELD_NUMBER: _ClassVar[int]
    CHAIN_IDS_FIELD_NUMBER: _ClassVar[int]
    chunk_size: int
    stripe: int
    table_id: int
    table_version: int
    chain_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, chunk_size: _Optional[int] = ..., stripe: _Optional[int] = ..., table_id: _Optional[int] = ..., table_version: _Optional[int] = ..., chain_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class Attr(_message.Message):
    __slots__ = ("inode", "mode", "nlink", "uid", "gid", "rdev", "size", "blocks", "atime", "mtime", "ctime", "layout", "generation", "truncate_version", "blksize", "parent")
    INODE_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    NLINK_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    GID_FIELD_NUMBER: _ClassVar[int]
    RDEV_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    ATIME_FIELD_NUMBER: _ClassVar[int]
    MTIME_FIELD_NUMBER: _ClassVar[int]
    CTIME_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_VERSION_FIELD_NUMBER: _ClassVar[int]
    BLKSIZE_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    inode: int
    mode: int
    nlink: int
    uid: int
    gid: int
    rdev: int
    size: int
    blocks: int
    atime: _common_pb2.Timespec
    mtime: _common_pb2.Timespec
    ctime: _common_pb2.Timespec
    layout: Layout
    generation: int
    truncate_version: int
    blksize: int
    parent: int
    def __init__(self, inode: _Optional[int] = ..., mode: _Optional[int] = ..., nlink: _Optional[int] = ..., uid: _Optional[int] = ..., gid: _Optional[int] = ..., rdev: _Optional[int] = ..., size: _Optional[int] = ..., blocks: _Optional[int] = ..., atime: _Optional[_Union[_common_pb2.Timespec, _Mapping]] = ..., mtime: _Optional[_Union[_common_pb2.Timespec, _Mapping]] = ..., ctime: _Optional[_Union[_common_pb2.Timespec, _Mapping]] = ..., layout: _Optional[_Union[Layout, _Mapping]] = ..., generation: _Optional[int] = ..., truncate_version: _Optional[int] = ..., blksize: _Optional[int] = ..., parent: _Optional[int] = ...) -> None: ...

class StatFsRequest(_message.Message):
    __slots__ = ("user",)
    USER_FIELD_NUMBER: _ClassVar[int]
    user: _common_pb2.UserInfo
    def __init__(self, user: _Optional[_Union[_common_pb2.UserInfo, _Mapping]] = ...) -> None: ...

class StatFsResponse(_message.Message):
    __slots__ = ("block_size", "total_bytes", "free_bytes", "avail_bytes", "total_files", "free_files", "used_files", "name_max")
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    AVAIL_BYTES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FILES_FIELD_NUMBER: _ClassVar[int]
    FREE_FILES_FIELD_NUMBER: _ClassVar[int]
    USED_FILES_FIELD_NUMBER: _ClassVar[int]
    NAME_MAX_FIELD_NUMBER: _ClassVar[int]
    block_size: int
    total_bytes: int
    free_bytes: int
    avail_bytes: int
    total_files: int
    free_files: int
    used_files: int
    name_max: int
    def __init__(self, block_size: _Optional[int] = ..., total_bytes: _Optional[int] = ..., free_bytes: _Optional[int] = ..., avail_bytes: _Optional[int] = ..., total_files: _Optional[int] = ..., free_files: _Optional[int] = ..., used_files: _Optional[int] = ..., name_max: _Optional[int] = ...) -> None: ...

class LookupRequest(_message.Message):
    __slots__ = ("user", "parent", "name")
    USER_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    user: _common_pb2.UserInfo
    parent: int
    name: bytes
    def __init__(self, user: _Optional[_Union[_common_pb2.UserInfo, _Mapping]] = ..., parent: _Optional[int] = ..., name: _Optional[bytes] = ...) -> None: ...

class LookupPathRequest(_message.Message):
    __slots__ = ("user", "parent", "names")
    USER_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    NAMES_FIELD_NUMBER: _ClassVar[int]
    user: _common_pb2.UserInfo
    parent: int
    names: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, user: _Optional[_Union[_common_pb2.UserInfo, _Mapping]] = ..., parent: _Optional[int] = ..., names: _Optional[_Iterable[bytes]] = ...) -> None: ...

class LookupPathResponse(_message.Message):
    __slots__ = ("attrs",)
    ATTRS_FIELD_NUMBER: _ClassVar[int]
    attrs: _containers.RepeatedCompositeFieldContainer[Attr]
    def __init__(self, attrs: _Optional[_Iterable[_Union[Attr, _Mapping]]] = ...) -> None: ...

class GetAttrRequest(_message.Message):
    __slots__ = ("user", "inode")
    USER_FIELD_NUMBER: _ClassVar[int]
    INODE_FIELD_NUMBER: _ClassVar[int]
    user: _common_pb2.UserInfo
    inode: int
    def __init__(self, user: _Optional[_Union[_common_pb2.UserInfo, _Mapping]] = ..., inode: _Optional[int] = ...) -> None: ...

class AttrResponse(_message.Message):
    __slots__ = ("attr", "parent_attr")
    ATTR_FIELD_NUMBER: _ClassVar[int]
    PARENT_ATTR_FIELD_NUMBER: _ClassVar[int]
    attr: Attr
    parent_attr: Attr
    def __init__(self, attr: _Optional[_Union[Attr, _Mapping]] = ..., parent_attr: _Optional[_Union[Attr, _Mapping]] = ...) -> None: ...

class SetAttrRequest(_message.Message):
    __slots__ = ("user", "request_id", "inode", "valid", "mode", "uid", "gid", "size", "atime", "mtime", "ctime", "session_id")
    USER_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    INODE_FIELD_NUMBER: _ClassVar[int]
    VALID_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    GID_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    ATIME_FIELD_NUMBER: _ClassVar[int]
    MTIME_FIELD_NUMBER: _ClassVar[int]
    CTIME_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    user: _common_pb2.UserInfo
    request_id: str
    inode: int
    valid: int
    mode: int
    uid: int
    gid: int
    size: int
    atime: _common_pb2.Timespec
    mtime: _common_pb2.Timespec
    ctime: _common_pb2.Timespec
    session_id: str
    def __init__(self, user: _Optional[_Union[_common_pb2.UserInfo, _Mapping]] = ..., request_id: _Optional[str] = ..., inode: _Optional[int] = ..., valid: _Optional[int] = ..., mode: _Optional[int] = ..., uid: _Optional[int] = ..., gid: _Optional[int] = ..., size: _Optional[int] = ..., atime: _Optional[_Union[_common_pb2.Timespec, _Mapping]] = ..., mtime: _Optional[_Union[_common_pb2.Timespec, _Mapping]] = ..., ctime: _Optional[_Union[_common_pb2.Timespec, _Mapping]] = ..., session_id: _Optional[str] = ...) -> None: ...

class SetAttrResponse(_message.Message):
    __slots__ = ("attr", "need_truncate", "old_size")
    ATTR_FIELD_NUMBER: _ClassVar[int]
    NEED_TRUNCATE_FIELD_NUMBER: _ClassVar[int]
    OLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    attr: Attr
    need_truncate: bool
    old_size: int
    def __init__(self, attr: _Optional[_Union[Attr, _Mapping]] = ..., need_truncate: _Optional[bool] = ..., old_size: _Optional[int] = ...) -> None: ...

class CreateRequest(_message.Message):
    __slots__ = ("user", "request_id", "parent", "name", "mode", "flags", "client_id", "layout", "close_sessions")
    USER_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    FLAGS_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    CLOSE_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    user: _common_pb2.UserInfo
    request_id: str
    parent: int
    name: bytes
    mode: int
    flags: int
    client_id: str
    layout: Layout
    close_sessions: _containers.RepeatedCompositeFieldContainer[SessionRef]
    def __init__(self, user: _Optional[_Union[_common_pb2.UserInfo, _Mapping]] = ..., request_id: _Optional[str] = ..., parent: _Optional[int] = ..., name: _Optional[bytes] = ..., mode: _Optional[int] = ..., flags: _Optional[int] = ..., client_id: _Optional[str] = ..., layout: _Optional[_Union[Layout, _Mapping]] = ..., close_sessions: _Optional[_Iterable[_Union[SessionRef, _Mapping]]] = ...) -> None: ...

class OpenResponse(_message.Message):
    __slots__ = ("attr", "session_id", "created", "need_truncate", "old_size", "parent_attr", "capability")
    ATTR_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    NEED_TRUNCATE_FIELD_NUMBER: _ClassVar[int]
    OLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    PARENT_ATTR_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    attr: Attr
    session_id: str
    created: bool
    need_truncate: bool
    old_size: int
    parent_attr: Attr
    capability: bytes
    def __init__(self, attr: _Optional[_Union[Attr, _Mapping]] = ..., session_id: _Optional[str] = ..., created: _Optional[bool] = ..., need_truncate: _Optional[bool] = ..., old_size: _Optional[int] = ..., parent_attr: _Optional[_Union[Attr, _Mapping]] = ..., capability: _Optional[bytes] = ...) -> None: ...

class OpenRequest(_message.Message):
    __slots__ = ("user", "request_id", "inode", "flags", "client_id", "close_sessions")
    USER_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    INODE_FIELD_NUMBER: _ClassVar[int]
    FLAGS_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    CLOSE_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    user: _common_pb2.UserInfo
    request_id: str
    inode: int
    flags: int
    client_id: str
    close_sessions: _containers.RepeatedCompositeFieldContainer[SessionRef]
    def __init__(self, user: _Optional[_Union[_common_pb2.UserInfo, _Mapping]] = ..., request_id: _Optional[str] = ..., inode: _Optional[int] = ..., flags: _Optional[int] = ..., client_id: _Optional[str] = ..., close_sessions: _Optional[_Iterable[_Union[SessionRef, _Mapping]]] = ...) -> None: ...

class CloseRequest(_message.Message):
    __slots__ = ("user", "request_id", "inode", "session_id", "has_length_hint", "length_hint", "truncate_version", "mtime")
    USER_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    INODE_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    HAS_LENGTH_HINT_FIELD_NUMBER: _ClassVar[int]
    LENGTH_HINT_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_VERSION_FIELD_NUMBER: _ClassVar[int]
    MTIME_FIELD_NUMBER: _ClassVar[int]
    user: _common_pb2.UserInfo
    request_id: str
    inode: int
    session_id: str
    has_length_hint: bool
    length_hint: int
    truncate_version: int
    mtime: _common_pb2.Timespec
    def __init__(self, user: _Optional[_Union[_common_pb2.UserInfo, _Mapping]] = ..., request_id: _Optional[str] = ..., inode: _Optional[int] = ..., session_id: _Optional[str] = ..., has_length_hint: _Optional[bool] = ..., length_hint: _Optional[int] = ..., truncate_version: _Optional[int] = ..., mtime: _Optional[_Union[_common_pb2.Timespec, _Mapping]] = ...) -> None: ...

class SessionRef(_message.Message):
    __slots__ = ("inode", "session_id")
    INODE_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    inode: int
    session_id: str
    def __init__(self, inode: _Optional[int] = ..., session_id: _Optional[str] = ...) -> None: ...

class CloseSessionsRequest(_message.Message):
    __slots__ = ("user", "sessions")
    USER_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    user: _common_pb2.UserInfo
    sessions: _containers.RepeatedCompositeFieldContainer[SessionRef]
    def __init__(self, user: _Optional[_Union[_common_pb2.UserInfo, _Mapping]] = ..., sessions: _Optional[_Iterable[_Union[SessionRef, _Mapping]]] = ...) -> None: ...

class CloseSessionsResponse(_message.Message):
    __slots__ = ("closed",)
    CLOSED_FIELD_NUMBER: _ClassVar[int]
    closed: int
    def __init__(self, closed: _Optional[int] = ...) -> None: ...

class SyncRequest(_message.Message):
    __slots__ = ("user", "request_id", "inode", "session_id", "has_length_hint", "length_hint", "truncate_version", "mtime")
    USER_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    INODE_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    HAS_LENGTH_HINT_FIELD_NUMBER: _ClassVar[int]
    LENGTH_HINT_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_VERSION_FIELD_NUMBER: _ClassVar[int]
    MTIME_FIELD_NUMBER: _ClassVar[int]
    user: _common_pb2.UserInfo
    request_id: str
    inode: int
    session_id: str
    has_length_hint: bool
    length_hint: int
    truncate_version: int
    mtime: _common_pb2.Timespec
    def __init__(self, user: _Optional[_Union[_common_pb2.UserInfo, _Mapping]] = ..., request_id: _Optional[str] = ..., inode: _Optional[int] = ..., session_id: _Optional[str] = ..., has_length_hint: _Optional[bool] = ..., length_hint: _Optional[int] = ..., truncate_version: _Optional[int] = ..., mtime: _Optional[_Union[_common_pb2.Timespec, _Mapping]] = ...) -> None: ...

class MknodRequest(_message.Message):
    __slots__ = ("user", "request_id", "parent", "name", "mode", "rdev")
    USER_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    RDEV_FIELD_NUMBER: _ClassVar[int]
    user: _common_pb2.UserInfo
    request_id: str
    parent: int
    name: bytes
    mode: int
    rdev: int
    def __init__(self, user: _Optional[_Union[_common_pb2.UserInfo, _Mapping]] = ..., request_id: _Optional[str] = ..., parent: _Optional[int] = ..., name: _Optional[bytes] = ..., mode: _Optional[int] = ..., rdev: _Optional[int] = ...) -> None: ...

class MkdirRequest(_message.Message):
    __slots__ = ("user", "request_id", "parent", "name", "mode")
    USER_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    user: _common_pb2.UserInfo
    request_id: str
    parent: int
    name: bytes
    mode: int
    def __init__(self, user: _Optional[_Union[_common_pb2.UserInfo, _Mapping]] = ..., request_id: _Optional[str] = ..., parent: _Optional[int] = ..., name: _Optional[bytes] = ..., mode: _Optional[int] = ...) -> None: ...

class SymlinkRequest(_message.Message):
    __slots__ = ("user", "request_id", "parent", "name", "target")
    USER_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    user: _common_pb2.UserInfo
    request_id: str
    parent: int
    name: bytes
    target: bytes
    def __init__(self, user: _Optional[_Union[_common_pb2.UserInfo, _Mapping]] = ..., request_id: _Optional[str] = ..., parent: _Optional[int] = ..., name: _Optional[bytes] = ..., target: _Optional[bytes] = ...) -> None: ...

class ReadLinkRequest(_message.Message):
    __slots__ = ("user", "inode")
    USER_FIELD_NUMBER: _ClassVar[int]
    INODE_FIELD_NUMBER: _ClassVar[int]
    user: _common_pb2.UserInfo
    inode: int
    def __init__(self, user: _Optional[_Union[_common_pb2.UserInfo, _Mapping]] = ..., inode: _Optional[int] = ...) -> None: ...

class ReadLinkResponse(_message.Message):
    __slots__ = ("target",)
    TARGET_FIELD_NUMBER: _ClassVar[int]
    target: bytes
    def __init__(self, target: _Optional[bytes] = ...) -> None: ...

class LinkRequest(_message.Message):
    __slots__ = ("user", "request_id", "inode", "new_parent", "new_name")
    USER_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    INODE_FIELD_NUMBER: _ClassVar[int]
    NEW_PARENT_FIELD_NUMBER: _ClassVar[int]
    NEW_NAME_FIELD_NUMBER: _ClassVar[int]
    user: _common_pb2.UserInfo
    request_id: str
    inode: int
    new_parent: int
    new_name: bytes
    def __init__(self, user: _Optional[_Union[_common_pb2.UserInfo, _Mapping]] = ..., request_id: _Optional[str] = ..., inode: _Optional[int] = ..., new_parent: _Optional[int] = ..., new_name: _Optional[bytes] = ...) -> None: ...

class RemoveRequest(_message.Message):
    __slots__ = ("user", "request_id", "parent", "name")
    USER_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    user: _common_pb2.UserInfo
    request_id: str
    parent: int
    name: bytes
    def __init__(self, user: _Optional[_Union[_common_pb2.UserInfo, _Mapping]] = ..., request_id: _Optional[str] = ..., parent: _Optional[int] = ..., name: _Optional[bytes] = ...) -> None: ...

class RemoveResponse(_message.Message):
    __slots__ = ("inode", "inode_removed", "parent_attr")
    INODE_FIELD_NUMBER: _ClassVar[int]
    INODE_REMOVED_FIELD_NUMBER: _ClassVar[int]
    PARENT_ATTR_FIELD_NUMBER: _ClassVar[int]
    inode: int
    inode_removed: bool
    parent_attr: Attr
    def __init__(self, inode: _Optional[int] = ..., inode_removed: _Optional[bool] = ..., parent_attr: _Optional[_Union[Attr, _Mapping]] = ...) -> None: ...

class RenameRequest(_message.Message):
    __slots__ = ("user", "request_id", "parent", "name", "new_parent", "new_name", "flags")
    USER_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    NEW_PARENT_FIELD_NUMBER: _ClassVar[int]
    NEW_NAME_FIELD_NUMBER: _ClassVar[int]
    FLAGS_FIELD_NUMBER: _ClassVar[int]
    user: _common_pb2.UserInfo
    request_id: str
    parent: int
    name: bytes
    new_parent: int
    new_name: bytes
    flags: int
    def __init__(self, user: _Optional[_Union[_common_pb2.UserInfo, _Mapping]] = ..., request_id: _Optional[str] = ..., parent: _Optional[int] = ..., name: _Optional[bytes] = ..., new_parent: _Optional[int] = ..., new_name: _Optional[bytes] = ..., flags: _Optional[int] = ...) -> None: ...

class RenameResponse(_message.Message):
    __slots__ = ("inode", "replaced_inode")
    INODE_FIELD_NUMBER: _ClassVar[int]
    REPLACED_INODE_FIELD_NUMBER: _ClassVar[int]
    inode: int
    replaced_inode: int
    def __init__(self, inode: _Optional[int] = ..., replaced_inode: _Optional[int] = ...) -> None: ...

class ReadDirRequest(_message.Message):
    __slots__ = ("user", "inode", "cursor", "limit", "with_attrs")
    USER_FIELD_NUMBER: _ClassVar[int]
    INODE_FIELD_NUMBER: _ClassVar[int]
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    WITH_ATTRS_FIELD_NUMBER: _ClassVar[int]
    user: _common_pb2.UserInfo
    inode: int
    cursor: bytes
    limit: int
    with_attrs: bool
    def __init__(self, user: _Optional[_Union[_common_pb2.UserInfo, _Mapping]] = ..., inode: _Optional[int] = ..., cursor: _Optional[bytes] = ..., limit: _Optional[int] = ..., with_attrs: _Optional[bool] = ...) -> None: ...

class DirEntry(_message.Message):
    __slots__ = ("name", "inode", "type", "attr")
    NAME_FIELD_NUMBER: _ClassVar[int]
    INODE_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    ATTR_FIELD_NUMBER: _ClassVar[int]
    name: bytes
    inode: int
    type: int
    attr: Attr
    def __init__(self, name: _Optional[bytes] = ..., inode: _Optional[int] = ..., type: _Optional[int] = ..., attr: _Optional[_Union[Attr, _Mapping]] = ...) -> None: ...

class ReadDirResponse(_message.Message):
    __slots__ = ("entries", "more")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[DirEntry]
    more: bool
    def __init__(self, entries: _Optional[_Iterable[_Union[DirEntry, _Mapping]]] = ..., more: _Optional[bool] = ...) -> None: ...

class GetXattrRequest(_message.Message):
    __slots__ = ("user", "inode", "name")
    USER_FIELD_NUMBER: _ClassVar[int]
    INODE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    user: _common_pb2.UserInfo
    inode: int
    name: bytes
    def __init__(self, user: _Optional[_Union[_common_pb2.UserInfo, _Mapping]] = ..., inode: _Optional[int] = ..., name: _Optional[bytes] = ...) -> None: ...

class GetXattrResponse(_message.Message):
    __slots__ = ("value",)
    VALUE_FIELD_NUMBER: _ClassVar[int]
    value: bytes
    def __init__(self, value: _Optional[bytes] = ...) -> None: ...

class SetXattrRequest(_message.Message):
    __slots__ = ("user", "request_id", "inode", "name", "value", "flags")
    USER_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    INODE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    FLAGS_FIELD_NUMBER: _ClassVar[int]
    user: _common_pb2.UserInfo
    request_id: str
    inode: int
    name: bytes
    value: bytes
    flags: int
    def __init__(self, user: _Optional[_Union[_common_pb2.UserInfo, _Mapping]] = ..., request_id: _Optional[str] = ..., inode: _Optional[int] = ..., name: _Optional[bytes] = ..., value: _Optional[bytes] = ..., flags: _Optional[int] = ...) -> None: ...

class ListXattrRequest(_message.Message):
    __slots__ = ("user", "inode")
    USER_FIELD_NUMBER: _ClassVar[int]
    INODE_FIELD_NUMBER: _ClassVar[int]
    user: _common_pb2.UserInfo
    inode: int
    def __init__(self, user: _Optional[_Union[_common_pb2.UserInfo, _Mapping]] = ..., inode: _Optional[int] = ...) -> None: ...

class ListXattrResponse(_message.Message):
    __slots__ = ("names",)
    NAMES_FIELD_NUMBER: _ClassVar[int]
    names: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, names: _Optional[_Iterable[bytes]] = ...) -> None: ...

class RemoveXattrRequest(_message.Message):
    __slots__ = ("user", "request_id", "inode", "name")
    USER_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    INODE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    user: _common_pb2.UserInfo
    request_id: str
    inode: int
    name: bytes
    def __init__(self, user: _Optional[_Union[_common_pb2.UserInfo, _Mapping]] = ..., request_id: _Optional[str] = ..., inode: _Optional[int] = ..., name: _Optional[bytes] = ...) -> None: ...

class AccessRequest(_message.Message):
    __slots__ = ("user", "inode", "mask")
    USER_FIELD_NUMBER: _ClassVar[int]
    INODE_FIELD_NUMBER: _ClassVar[int]
    MASK_FIELD_NUMBER: _ClassVar[int]
    user: _common_pb2.UserInfo
    inode: int
    mask: int
    def __init__(self, user: _Optional[_Union[_common_pb2.UserInfo, _Mapping]] = ..., inode: _Optional[int] = ..., mask: _Optional[int] = ...) -> None: ...

class SetLayoutRequest(_message.Message):
    __slots__ = ("user", "request_id", "inode", "layout")
    USER_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    INODE_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    user: _common_pb2.UserInfo
    request_id: str
    inode: int
    layout: Layout
    def __init__(self, user: _Optional[_Union[_common_pb2.UserInfo, _Mapping]] = ..., request_id: _Optional[str] = ..., inode: _Optional[int] = ..., layout: _Optional[_Union[Layout, _Mapping]] = ...) -> None: ...

class PruneSessionsRequest(_message.Message):
    __slots__ = ("user", "client_id")
    USER_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    user: _common_pb2.UserInfo
    client_id: str
    def __init__(self, user: _Optional[_Union[_common_pb2.UserInfo, _Mapping]] = ..., client_id: _Optional[str] = ...) -> None: ...

class PruneSessionsResponse(_message.Message):
    __slots__ = ("pruned",)
    PRUNED_FIELD_NUMBER: _ClassVar[int]
    pruned: int
    def __init__(self, pruned: _Optional[int] = ...) -> None: ...

class GcEntry(_message.Message):
    __slots__ = ("id", "inode", "layout", "length", "removed_at")
    ID_FIELD_NUMBER: _ClassVar[int]
    INODE_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    REMOVED_AT_FIELD_NUMBER: _ClassVar[int]
    id: bytes
    inode: int
    layout: Layout
    length: int
    removed_at: float
    def __init__(self, id: _Optional[bytes] = ..., inode: _Optional[int] = ..., layout: _Optional[_Union[Layout, _Mapping]] = ..., length: _Optional[int] = ..., removed_at: _Optional[float] = ...) -> None: ...

class ListGcRequest(_message.Message):
    __slots__ = ("user", "limit")
    USER_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    user: _common_pb2.UserInfo
    limit: int
    def __init__(self, user: _Optional[_Union[_common_pb2.UserInfo, _Mapping]] = ..., limit: _Optional[int] = ...) -> None: ...

class ListGcResponse(_message.Message):
    __slots__ = ("entries",)
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[GcEntry]
    def __init__(self, entries: _Optional[_Iterable[_Union[GcEntry, _Mapping]]] = ...) -> None: ...

class AckGcRequest(_message.Message):
    __slots__ = ("user", "ids")
    USER_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    user: _common_pb2.UserInfo
    ids: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, user: _Optional[_Union[_common_pb2.UserInfo, _Mapping]] = ..., ids: _Optional[_Iterable[bytes]] = ...) -> None: ...

class GetCapabilityRequest(_message.Message):
    __slots__ = ("user", "inode", "write", "session_id")
    USER_FIELD_NUMBER: _ClassVar[int]
    INODE_FIELD_NUMBER: _ClassVar[int]
    WRITE_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    user: _common_pb2.UserInfo
    inode: int
    write: bool
    session_id: str
    def __init__(self, user: _Optional[_Union[_common_pb2.UserInfo, _Mapping]] = ..., inode: _Optional[int] = ..., write: _Optional[bool] = ..., session_id: _Optional[str] = ...) -> None: ...

class GetCapabilityResponse(_message.Message):
    __slots__ = ("capability",)
    CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    capability: bytes
    def __init__(self, capability: _Optional[bytes] = ...) -> None: ...

class InodeRecord(_message.Message):
    __slots__ = ("attr", "symlink_target")
    ATTR_FIELD_NUMBER: _ClassVar[int]
    SYMLINK_TARGET_FIELD_NUMBER: _ClassVar[int]
    attr: Attr
    symlink_target: bytes
    def __init__(self, attr: _Optional[_Union[Attr, _Mapping]] = ..., symlink_target: _Optional[bytes] = ...) -> None: ...

class SessionRecord(_message.Message):
    __slots__ = ("client_id", "flags", "opened_at", "write")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    FLAGS_FIELD_NUMBER: _ClassVar[int]
    OPENED_AT_FIELD_NUMBER: _ClassVar[int]
    WRITE_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    flags: int
    opened_at: float
    write: bool
    def __init__(self, client_id: _Optional[str] = ..., flags: _Optional[int] = ..., opened_at: _Optional[float] = ..., write: _Optional[bool] = ...) -> None: ...

class IdemRecord(_message.Message):
    __slots__ = ("time", "response", "op")
    TIME_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    time: float
    response: bytes
    op: str
    def __init__(self, time: _Optional[float] = ..., response: _Optional[bytes] = ..., op: _Optional[str] = ...) -> None: ...
