"""Generated gRPC/protobuf code (scripts/gen_proto.py). Do not edit."""
