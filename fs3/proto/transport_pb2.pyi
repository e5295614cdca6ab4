from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ShmRef(_message.Message):
    __slots__ = ("region", "offset", "length")
    REGION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    region: str
    offset: int
    length: int
    def __init__(self, region: _Optional[str] = ..., offset: _Optional[int] = ..., length: _Optional[int] = ...) -> None: ...

class TcpRef(_message.Message):
    __slots__ = ("conn_id", "transfer_id", "length")
    CONN_ID_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_ID_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    conn_id: int
    transfer_id: int
    length: int
    def __init__(self, conn_id: _Optional[int] = ..., transfer_id: _Optional[int] = ..., length: _Optional[int] = ...) -> None: ...

class FrameRef(_message.Message):
    __slots__ = ("offset", "length")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    offset: int
    length: int
    def __init__(self, offset: _Optional[int] = ..., length: _Optional[int] = ...) -> None: ...

class DataRef(_message.Message):
    __slots__ = ("inline", "shm", "tcp", "frame")
    INLINE_FIELD_NUMBER: _ClassVar[int]
    SHM_FIELD_NUMBER: _ClassVar[int]
    TCP_FIELD_NUMBER: _ClassVar[int]
    FRAME_FIELD_NUMBER: _ClassVar[int]
    inline: bytes
    shm: ShmRef
    tcp: TcpRef
    frame: FrameRef
    def __init__(self, inline: _Optional[bytes] = ..., shm: _Optional[_Union[ShmRef, _Mapping]] = ..., tcp: _Optional[_Union[TcpRef, _Mapping]] = ..., frame: _Optional[_Union[FrameRef, _Mapping]] = ...) -> None: ...

class RegisterRegionRequest(_message.Message):
    __slots__ = ("client_id", "region", "path", "size", "pid")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    region: str
    path: str
    size: int
    pid: int
    def __init__(self, client_id: _Optional[str] = ..., region: _Optional[str] = ..., path: _Optional[str] = ..., size: _Optional[int] = ..., pid: _Optional[int] = ...) -> None: ...

class RegisterRegionResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class UnregisterRegionRequest(_message.Message):
    __slots__ = ("client_id", "region")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    region: str
    def __init__(self, client_id: _Optional[str] = ..., region: _Optional[str] = ...) -> None: ...

class UnregisterRegionResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
