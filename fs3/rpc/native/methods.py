"""Method ids of the native transport, derived from the proto service descriptors.

``proto/`` stays the one definition of every service: this module walks the
generated ``fs3/proto/*_pb2`` descriptors and gives each method a 32-bit id,
the CRC-32 of its gRPC path (``/fs3.v1.MetaService/Stat``). A hash, not an
index, so adding a method never renumbers the others (peers of different
versions still agree on every method both know); a collision is refused at
import time, so it can never route a call to the wrong handler.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

from google.protobuf import message_factory

from fs3.proto import common_pb2, meta_pb2, mgmtd_pb2, storage_pb2, transport_pb2

_MODULES = (common_pb2, meta_pb2, mgmtd_pb2, storage_pb2, transport_pb2)


@dataclass(frozen=True, slots=True)
class Method:
    """One RPC method as both transports know it."""

    id: int
    path: str  # gRPC path: /package.Service/Method
    service: str  # full service name: fs3.v1.MetaService
    name: str  # method name: Stat (also the servicer attribute)
    request: Any  # request message class
    response: Any  # response message class
    client_streaming: bool
    server_streaming: bool


def method_id(path: str) -> int:
    """The native id of the method at gRPC ``path``."""
    return zlib.crc32(path.encode())


def _build() -> tuple[dict[int, Method], dict[str, Method]]:
    by_id: dict[int, Method] = {}
    by_path: dict[str, Method] = {}
    for mod in _MODULES:
        for svc in mod.DESCRIPTOR.services_by_name.values():
            for m in svc.methods:
                path = f"/{svc.full_name}/{m.name}"
                meth = Method(
                    id=method_id(path),
                    path=path,
                    service=svc.full_name,
                    name=m.name,
                    request=message_factory.GetMessageClass(m.input_type),
                    response=message_factory.GetMessageClass(m.output_type),
                    client_streaming=bool(m.client_streaming),
                    server_streaming=bool(m.server_streaming),
                )
                if meth.id in by_id:
                    raise RuntimeError(
                        f"native method id collision: {path} and {by_id[meth.id].path}"
                    )
                by_id[meth.id] = meth
                by_path[path] = meth
    return by_id, by_path


BY_ID, BY_PATH = _build()


def service_methods(service: str) -> list[Method]:
    """Every method of the service with full name ``service``."""
    return [m for m in BY_ID.values() if m.service == service]


def service_named(short: str) -> str:
    """The full name of the fs3 proto service called ``short`` (``MetaService``)."""
    for svc in {m.service for m in BY_ID.values()}:
        if svc.rsplit(".", 1)[-1] == short:
            return svc
    raise ValueError(f"no fs3 proto service named {short}")


def service_of_adder(add_fn: Any) -> str:
    """The service a generated ``add_<Service>Servicer_to_server`` function registers."""
    name = getattr(add_fn, "__name__", "")
    if not (name.startswith("add_") and name.endswith("Servicer_to_server")):
        raise ValueError(f"{name or add_fn!r} is not a generated add_*Servicer_to_server")
    return service_named(name[len("add_") : -len("Servicer_to_server")])
