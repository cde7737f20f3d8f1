"""A forward-pass input buffer written on the host and read on the device, at fixed addresses.

The host side is written through numpy views; `upload(n)` copies its first n entries into the
device side, asynchronously from pinned memory, and returns that device slice. Both sides are
allocated once, so the device tensors a CUDA graph captured (cuda_graphs.py) are the very ones
later iterations upload into. On the CPU the two sides are one tensor and nothing is copied.
"""
from __future__ import annotations

import torch


class MirroredBuffer:
    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device,
                 fill: int = 0) -> None:
        on_cuda = device.type == "cuda"
        self.host = torch.full(shape, fill, dtype=dtype, pin_memory=on_cuda)
        self.device = torch.full(shape, fill, dtype=dtype, device=device) if on_cuda \
            else self.host

    def __len__(self) -> int:
        return self.host.shape[0]

    @property
    def mirrored(self) -> bool:
        return self.device is not self.host

    def upload(self, n: int) -> torch.Tensor:
        """The first n entries on the device, as the host holds them now."""
        if not self.mirrored:
            return self.host[:n]
        self.device[:n].copy_(self.host[:n], non_blocking=True)
        return self.device[:n]
