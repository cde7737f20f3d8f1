"""Allocator benchmark: Step throughput of the core, in-process and over gRPC."""
