"""The Triton kernels, one per file with its launcher. Imported only where Triton runs them:
on CUDA through kernels.dispatch, and on the CPU by the tests under TRITON_INTERPRET=1."""
