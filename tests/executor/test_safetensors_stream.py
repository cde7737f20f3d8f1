"""The streaming safetensors reader against files safetensors itself wrote."""
from __future__ import annotations

import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from executor_service.model.safetensors_stream import NotSafetensors, SafetensorsReader

TENSORS = {"f32": torch.randn(3, 5), "bf16": torch.randn(4, 2).to(torch.bfloat16),
           "f16": torch.randn(7).to(torch.float16), "i64": torch.arange(6).view(2, 3),
           "scalar": torch.tensor(2.5), "flags": torch.tensor([True, False, True])}


@pytest.fixture
def written(tmp_path: Path) -> Path:
    path = tmp_path / "model.safetensors"
    save_file(TENSORS, path, metadata={"format": "pt"})
    return path


def test_every_tensor_reads_back_exactly_in_its_dtype_and_converted(written: Path) -> None:
    with SafetensorsReader(written) as reader:
        entries = list(reader.entries())
        assert {entry.name for entry in entries} == set(TENSORS)
        for entry in entries:
            same = torch.empty(entry.shape, dtype=entry.dtype)
            reader.read_into(entry, same)
            assert torch.equal(same, TENSORS[entry.name])
            wider = torch.empty(entry.shape, dtype=torch.float64)
            reader.read_into(entry, wider)
            assert torch.equal(wider, TENSORS[entry.name].double())
            # Into a view of a larger tensor (a fused projection's rows): only its rows change.
            host = torch.zeros((2, *entry.shape), dtype=entry.dtype)
            reader.read_into(entry, host[1])
            assert torch.equal(host[1], TENSORS[entry.name]) and not host[0].any()


def test_a_target_of_another_shape_is_refused(written: Path) -> None:
    with SafetensorsReader(written) as reader:
        entry = next(e for e in reader.entries() if e.name == "f32")
        with pytest.raises(ValueError, match=r"f32 is \(3, 5\)"):
            reader.read_into(entry, torch.empty(5, 3))


@pytest.mark.parametrize("damage, message", [
    (lambda data: data[:5], "too short"),
    (lambda data: struct.pack("<Q", 1 << 40) + data[8:], "not a safetensors header"),
    (lambda data: data[:8] + b"\xff" * (len(data) - 8), "not JSON"),
    (lambda data: data[:-4], "ends inside"),
])
def test_a_damaged_file_is_refused_naming_it(written: Path, damage, message: str) -> None:
    written.write_bytes(damage(written.read_bytes()))
    with pytest.raises(NotSafetensors, match=message) as refused:
        with SafetensorsReader(written) as reader:
            for entry in reader.entries():
                reader.read_into(entry, torch.empty(entry.shape, dtype=entry.dtype))
    assert "model.safetensors" in str(refused.value)
