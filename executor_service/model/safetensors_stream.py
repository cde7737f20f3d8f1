"""Reads a safetensors file one tensor at a time, straight into tensors the caller allocated.

Why not `safetensors.safe_open`: it maps the whole file, and every page a read touches stays
in the process's resident memory until the file is closed, so loading a shard costs the
shard's size on top of the model. Here each tensor is read with `readinto` into its target
(when the dtype already matches, on the CPU) or into one scratch buffer the size of the
tensor, then copied (converting the dtype, or moving to the GPU). A load then holds the model
in its serving dtype plus the largest single tensor, never more (tests/executor/
test_loader_memory.py measures it).

The format (https://huggingface.co/docs/safetensors): 8 bytes little-endian header length, a
JSON header mapping each name to its dtype, shape and [begin, end) byte offsets after the
header, then the data, little-endian and C-contiguous.
"""
from __future__ import annotations

import json
import math
import struct
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import torch

from executor_service.model.model_config import UnsupportedModel

# The checkpoint dtypes a served model can hold (safetensors' own names).
DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
          "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32, "I16": torch.int16,
          "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}
# A header larger than this is not a checkpoint (safetensors itself refuses over 100 MB).
MAX_HEADER_BYTES = 100 << 20


class NotSafetensors(UnsupportedModel):
    """The file is not a safetensors file we can read: the checkpoint is refused."""


@dataclass(frozen=True, slots=True)
class TensorEntry:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int      # absolute offset of the first byte in the file
    num_bytes: int


class SafetensorsReader:
    """One open file; `entries()` lists its tensors, `read_into` fills a target with one."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._file: BinaryIO = open(self.path, "rb")   # noqa: SIM115 - closed by close()
        try:
            self._entries = self._read_header()
        except BaseException:
            self._file.close()
            raise
        self._scratch: torch.Tensor | None = None

    def __enter__(self) -> SafetensorsReader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._file.close()
        self._scratch = None

    def entries(self) -> Iterator[TensorEntry]:
        return iter(self._entries)

    def read_into(self, entry: TensorEntry, target: torch.Tensor) -> None:
        """Fills `target` (any device, any floating dtype, the entry's shape) with the tensor."""
        if tuple(target.shape) != entry.shape:
            raise ValueError(f"{entry.name} is {entry.shape}, the target {tuple(target.shape)}")
        direct = (target.device.type == "cpu" and target.dtype == entry.dtype
                  and target.is_contiguous() and sys.byteorder == "little")
        if direct:
            self._read_bytes(entry, as_bytes(target))
            return
        source = self._scratch_bytes(entry.num_bytes)
        self._read_bytes(entry, source)
        with torch.no_grad():
            target.copy_(source.view(entry.dtype).view(entry.shape))

    def _read_bytes(self, entry: TensorEntry, into: torch.Tensor) -> None:
        self._file.seek(entry.start)
        view = memoryview(into.numpy()).cast("B")
        done = 0
        while done < entry.num_bytes:
            count = self._file.readinto(view[done:])
            if not count:
                raise NotSafetensors(f"{self.path.name} ends inside {entry.name}")
            done += count

    def _scratch_bytes(self, num_bytes: int) -> torch.Tensor:
        """A byte buffer of at least `num_bytes`, reused tensor after tensor (the largest one
        read so far): the only memory a load needs beyond the model's."""
        if self._scratch is None or self._scratch.numel() < num_bytes:
            self._scratch = None   # free the smaller one first
            self._scratch = torch.empty(num_bytes, dtype=torch.uint8)
        return self._scratch[:num_bytes]

    def _read_header(self) -> list[TensorEntry]:
        prefix = self._file.read(8)
        if len(prefix) != 8:
            raise NotSafetensors(f"{self.path.name} is too short to be a safetensors file")
        (header_bytes,) = struct.unpack("<Q", prefix)
        if header_bytes > MAX_HEADER_BYTES:
            raise NotSafetensors(f"{self.path.name}: a header of {header_bytes} bytes is not "
                                 "a safetensors header")
        try:
            header = json.loads(self._file.read(header_bytes))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise NotSafetensors(f"{self.path.name}: its header is not JSON ({error})") from None
        data_start = 8 + header_bytes
        entries = []
        for name, spec in header.items():
            if name == "__metadata__":
                continue
            if spec["dtype"] not in DTYPES:
                raise NotSafetensors(f"{self.path.name}: {name} has dtype {spec['dtype']}, "
                                     f"not one of {', '.join(DTYPES)}")
            dtype, shape = DTYPES[spec["dtype"]], tuple(spec["shape"])
            begin, end = spec["data_offsets"]
            expected = math.prod(shape) * dtype.itemsize
            if end - begin != expected:
                raise NotSafetensors(f"{self.path.name}: {name} holds {end - begin} bytes, its "
                                     f"shape {shape} and dtype {spec['dtype']} need {expected}")
            entries.append(TensorEntry(name, dtype, shape, data_start + begin, end - begin))
        return entries


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous CPU tensor's storage as a flat uint8 tensor (shares memory)."""
    return tensor.detach().view(-1).view(torch.uint8)
