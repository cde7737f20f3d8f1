"""oneDNN-packed linear layers on the CPU (executor_service/model/packed_linear.py): the same
products as F.linear for any row count, used by every linear layer the forward pass calls once
a model is loaded, and left alone where they cannot apply."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from executor_service.model.embedded import write_embedded_checkpoint
from executor_service.model.loader import load_model
from executor_service.model.model_config import ModelConfig
from executor_service.model.packed_linear import (PACKED_MIN_MACS, PackedLinear, linear,
                                                  packing_supported)

needs_onednn = pytest.mark.skipif(not packing_supported(torch.zeros(1, 1)),
                                  reason="this torch build has no oneDNN")


@needs_onednn
@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-4), (torch.bfloat16, 5e-2)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_packed_product_matches_f_linear_for_any_row_count(dtype, tolerance, with_bias):
    if not packing_supported(torch.zeros(1, 1, dtype=dtype)):
        pytest.skip(f"oneDNN here has no {dtype} linear")
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(96, 40, generator=generator).to(dtype)
    bias = torch.randn(96, generator=generator).to(dtype) if with_bias else None
    packed = PackedLinear(weight, bias)
    # Rows below, at and far above the packing's batch hint (64).
    for rows in (1, 2, 7, 64, 65, 513):
        x = torch.randn(rows, 40, generator=generator).to(dtype)
        expected = F.linear(x.double(), weight.double(),
                            None if bias is None else bias.double())
        got = packed(x)
        assert got.dtype == dtype and got.shape == (rows, 96)
        scale = expected.abs().max().item()
        assert (got.double() - expected).abs().max().item() <= tolerance * scale, rows


@needs_onednn
def test_small_products_take_f_linear_and_large_ones_the_packed_path():
    weight = torch.randn(128, 64)
    packed = PackedLinear(weight, None)
    small_rows = PACKED_MIN_MACS // (128 * 64) - 1
    small = torch.randn(small_rows, 64)
    assert torch.equal(linear(small, weight, None, packed), F.linear(small, weight))
    large = torch.randn(small_rows + 1, 64)
    assert torch.equal(linear(large, weight, None, packed), packed(large))


def test_packing_leaves_what_onednn_cannot_run_on_the_plain_path():
    assert not packing_supported(torch.zeros(4, 4, dtype=torch.float16))
    assert not packing_supported(torch.zeros(4, 4, device="meta"))
    with pytest.raises(ValueError, match="float16 weight on cpu cannot be packed"):
        PackedLinear(torch.zeros(4, 4, dtype=torch.float16), None)
    x = torch.randn(3, 4)
    weight = torch.randn(5, 4)
    assert torch.equal(linear(x, weight, None, None), F.linear(x, weight))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_embedded_checkpoint(tmp_path_factory.mktemp("embedded"))


@needs_onednn
def test_a_loaded_cpu_model_packs_every_linear_its_forward_calls(checkpoint):
    config = ModelConfig.from_dir(checkpoint)
    model = load_model(checkpoint, config, torch.float32, torch.device("cpu"), 256)
    assert model.packed_logits is not None
    for layer in model.model.layers:
        for module in (layer.self_attn.qkv, layer.self_attn.o_proj, layer.mlp.gate_up,
                       layer.mlp.down_proj):
            assert module.packed is not None
    # The parameters keep their checkpoint names and values beside the packed copies.
    hidden = torch.randn(200, config.hidden_size)
    o_proj = model.model.layers[0].self_attn.o_proj
    torch.testing.assert_close(o_proj(hidden), F.linear(hidden, o_proj.weight),
                               rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(model.logits(hidden),
                               F.linear(hidden, model.output_embedding()), rtol=1e-4, atol=1e-4)
