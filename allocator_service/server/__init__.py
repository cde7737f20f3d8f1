"""The allocator's gRPC layer: the Allocator and AllocatorAdmin servicers (thin: proto in, core
through the state gate, proto out), the admin views' conversions, configuration and executor
identity. The block protocol's own codec is shared, in pagedserve.protocol."""
