"""Counting the Triton kernel variants our launchers produce, with Triton's own specialisation.

Triton compiles one binary per distinct specialisation of a launch: the constexpr values, each
argument's type (pointer dtypes, i32 or i64), and what it specialises on (an integer divisible
by 16, a pointer aligned to 16 bytes). `record_variants` swaps every kernel of our Triton
modules for a recorder that computes that specialisation the way Triton's launcher does
(`create_function_from_signature`, the code its JIT runs before looking up its cache) and then
launches the real kernel, or skips the launch for sweeps that only count.
"""
from __future__ import annotations

import contextlib
import importlib
import inspect
from collections.abc import Iterator

import pytest

KERNEL_MODULES = ("kernels.triton.store_kv", "kernels.triton.decode_attention",
                  "kernels.triton.prefill_attention", "kernels.triton.copy_blocks")


def triton_binder(kernel):
    """Triton's argument binder for `kernel` (a JITFunction, or the interpreter's stand-in),
    built as Triton builds it; skips the test on a Triton whose internals differ."""
    try:
        from triton.backends.compiler import BaseBackend
        from triton.runtime.jit import KernelParam, create_function_from_signature
    except ImportError as error:
        pytest.skip(f"this Triton has no specialisation binder to count variants with: {error}")
    options = getattr(kernel, "kwargs", {}) or {}
    no_spec = getattr(kernel, "do_not_specialize", None) or options.get("do_not_specialize") \
        or ()
    no_align = getattr(kernel, "do_not_specialize_on_alignment", None) \
        or options.get("do_not_specialize_on_alignment") or ()
    signature = inspect.signature(kernel.fn)
    params = [KernelParam(index, param, index in no_spec or param.name in no_spec,
                          index in no_align or param.name in no_align)
              for index, param in enumerate(signature.parameters.values())]
    return create_function_from_signature(signature, params, BaseBackend)


class _Recorder:
    def __init__(self, name: str, kernel, seen: set, launch: bool) -> None:
        self.name, self.kernel, self.seen, self.launch = name, kernel, seen, launch
        self.binder = triton_binder(kernel)

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            _, specialization, options = self.binder(*args, **kwargs)
            self.seen.add((self.name, tuple(tuple(entry) for entry in specialization),
                           tuple(sorted(options.items()))))
            if self.launch:
                return self.kernel[grid](*args, **kwargs)
        return run


def kernels_of(module) -> dict[str, object]:
    """The module's kernels (what `triton.jit` made), by name."""
    return {name: value for name, value in vars(module).items()
            if name.startswith("_") and name.endswith("_kernel") and hasattr(value, "fn")}


@contextlib.contextmanager
def record_variants(monkeypatch: pytest.MonkeyPatch, launch: bool = True) -> Iterator[set]:
    """Yields the set that fills with (kernel, specialisation, options) of every launch."""
    seen: set = set()
    with monkeypatch.context() as patch:
        for module_name in KERNEL_MODULES:
            module = importlib.import_module(module_name)
            for name, kernel in kernels_of(module).items():
                patch.setattr(module, name, _Recorder(name, kernel, seen, launch))
        yield seen


def kernel_names(variants: set) -> set[str]:
    return {name for name, _, _ in variants}
