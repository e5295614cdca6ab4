from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class ErrorDetail(_message.Message):
    __slots__ = ("code", "errno", "message", "retryable", "leader")
    CODE_FIELD_NUMBER: _ClassVar[int]
    ERRNO_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RETRYABLE_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    code: int
    errno: int
    message: str
    retryable: bool
    leader: str
    def __init__(self, code: _Optional[int] = ..., errno: _Optional[int] = ..., message: _Optional[str] = ..., retryable: _Optional[bool] = ..., leader: _Optional[str] = ...) -> None: ...

class UserInfo(_message.Message):
    __slots__ = ("uid", "gid", "groups")
    UID_FIELD_NUMBER: _ClassVar[int]
    GID_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    uid: int
    gid: int
    groups: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, uid: _Optional[int] = ..., gid: _Optional[int] = ..., groups: _Optional[_Iterable[int]] = ...) -> None: ...

class Empty(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Timespec(_message.Message):
    __slots__ = ("sec", "nsec")
    SEC_FIELD_NUMBER: _ClassVar[int]
    NSEC_FIELD_NUMBER: _ClassVar[int]
    sec: int
    nsec: int
    def __init__(self, sec: _Optional[int] = ..., nsec: _Optional[int] = ...) -> None: ...
