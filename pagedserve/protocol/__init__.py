"""The vocabulary that crosses service boundaries, owned by no service.

Block operations and their results (the allocation protocol), the allocator's limits, sampling
parameters and finish reasons as domain objects, and one codec per message family that converts
them to and from protos in both directions. Services import this package; it imports no service.
"""
