"""The native fs3 RPC transport: framed protobuf calls over TCP and Unix sockets.

* :mod:`~fs3.rpc.native.wire`: the frame format and the buffered receiver;
* :mod:`~fs3.rpc.native.methods`: method ids from the proto descriptors;
* :mod:`~fs3.rpc.native.server`: dispatch to the servicers gRPC serves;
* :mod:`~fs3.rpc.native.client`: a channel the generated stubs accept;
* :mod:`~fs3.rpc.native.endpoints`: where same-host peers find Unix sockets;
* :mod:`~fs3.rpc.native.pool`: reusable private memory that payloads are received into.
"""
