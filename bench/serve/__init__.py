"""Serving benchmark: the whole stack through gRPC and HTTP against the in-process engine."""
