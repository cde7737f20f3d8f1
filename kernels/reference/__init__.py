"""Pure-torch references of the kernels: the yardstick the Triton kernels and kernels/cpu are
tested against (each is itself tested against plain attention), and what the CPU serves with
where kernels/cpu has nothing faster."""
