"""RPC plumbing, the only package (with fs3.proto) that imports grpc: gRPC and the
native framed transport (:mod:`fs3.rpc.native`), both serving the same servicers."""
