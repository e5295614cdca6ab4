"""gRPC plumbing: the only package (with fs3.proto) that imports grpc."""
