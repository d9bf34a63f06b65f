"""Generated protobuf code for proto/types.proto (do not edit; see the .proto header)."""
