"""The allocator core: pure Python, no gRPC, no Redis. Every executor's pool of blocks, their
free lists and prefix index, sequences and their block tables, and the batched Step.

The Python files are the only source. When `make allocator-core` has compiled the hot ones with
mypyc and that build matches them (compiled_build.py), they are imported from the build instead.
"""
from allocator_service.core.compiled_build import compiled_package_dir

_compiled = compiled_package_dir()
if _compiled is not None:
    # Searched first, so the compiled modules shadow their sources; the others are found here.
    __path__.insert(0, str(_compiled))
