from __future__ import annotations

import pytest
import torch

from origin.engine.linear import (
    DenseLinear,
    Int8WeightOnlyLinear,
    make_linear,
    quantize_per_channel_int8,
)
from origin.precision import Backend, lookup
from tests.origin.engine.isa import run_under_isa_caps


def _weight(out_features: int = 96, in_features: int = 64) -> torch.Tensor:
    return torch.randn(out_features, in_features, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("rows", [1, 2, 3, 8])
def test_dense_paths_agree_with_f_linear(rows: int) -> None:
    w, b = _weight(), torch.randn(96)
    x = torch.randn(rows, 64)
    expected = torch.nn.functional.linear(x, w, b)
    assert torch.allclose(DenseLinear(w, b)(x), expected, atol=1e-4)
    assert torch.allclose(DenseLinear(w)(x), x @ w.T, atol=1e-4)


def test_per_channel_quantization_error_is_small() -> None:
    w = _weight()
    q, scales = quantize_per_channel_int8(w)
    assert q.dtype == torch.int8 and scales.shape == (96,)
    error = (q.float() * scales[:, None] - w).abs().max(dim=1).values
    assert torch.all(error <= scales * 0.51 + w.abs().amax(dim=1) * 0.16)
    relative = (q.float() * scales[:, None] - w).norm() / w.norm()
    assert relative < 0.02


@pytest.mark.parametrize("rows", [1, 4, 5, 16])
def test_int8_linear_is_close_to_dense_on_both_paths(rows: int) -> None:
    w = _weight()
    x = torch.randn(rows, 64)
    y = Int8WeightOnlyLinear(w)(x)
    ref = x @ w.T
    assert y.dtype == torch.float32
    assert (y - ref).norm() / ref.norm() < 0.03


def test_a_precision_is_refused_where_its_entry_has_no_such_linear() -> None:
    with pytest.raises(ValueError, match="gguf does not run on CUDA's library kernels"):
        make_linear(_weight(), None, lookup("gguf"), Backend.CUDA_LIBRARY)
    with pytest.raises(ValueError, match="the GGUF file's blocks"):
        make_linear(_weight(), None, lookup("gguf"), Backend.FIXED_ORDER)


@pytest.mark.gpu
def test_bitsandbytes_int8_on_cuda() -> None:
    w = _weight(256, 128).cuda().half()
    x = torch.randn(8, 128, device="cuda").half()
    lin = make_linear(w, None, lookup("int8"), Backend.CUDA_LIBRARY)
    y = lin(x)
    ref = x @ w.T
    assert (y.float() - ref.float()).norm() / ref.float().norm() < 0.05


@pytest.mark.parametrize("in_features", [576, 1536])
def test_bf16_rows_do_not_depend_on_the_row_count(in_features: int) -> None:
    # what makes speculative verification bitwise equal to one-token decoding
    lin = make_linear(_weight(96, in_features), None, lookup("bf16"), Backend.CPU_LIBRARY)
    x = torch.randn(7, in_features, generator=torch.Generator().manual_seed(1))
    together = lin(x)
    alone = torch.cat([lin(x[i : i + 1]) for i in range(7)])
    assert torch.equal(together, alone)


def test_w8a8_rows_are_the_same_whatever_the_batch_and_the_isa() -> None:
    """Batch invariance by construction: under every ISA cap this CPU supports (and uncapped), a
    w8a8 row's result does not depend on the row count, the row order or the other rows, and
    every cap computes the very same numbers (exact integer dot products)."""
    reports = run_under_isa_caps("tests.origin.engine.w8a8_probe")
    for cap, report in reports.items():
        failed = [name for name, ok in report["checks"].items() if not ok]
        assert failed == [], f"{cap} ({report['aten_capability']}): {failed}"
    digests = {cap: report["digest"] for cap, report in reports.items()}
    assert len(reports) >= 2 and len(set(digests.values())) == 1, digests
