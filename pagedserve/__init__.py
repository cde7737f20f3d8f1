"""pagedserve: shared plumbing (`common/`), the command-line tools (`cli/`), and the gRPC stubs
generated from protos/ by `make protos` (`allocator/v1/`, never edited by hand)."""
