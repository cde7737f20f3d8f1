"""The executor's engine: sequences, scheduling, the model step and sampling; no gRPC."""
