"""Pure-torch references of the kernels: the CPU implementation, and the yardstick the Triton
kernels are tested against (each is itself tested against plain attention)."""
