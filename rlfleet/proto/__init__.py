"""Generated protobuf and gRPC code (committed; see `rlfleet.proto.generate`)."""
