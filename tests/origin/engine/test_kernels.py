"""The fixed-order kernels: a row's numbers depend on that row alone, on every path."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from origin.engine import kernels
from tests.origin.engine.conftest import needs_kernels


def _normal(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> torch.Tensor:
    return torch.from_numpy(rng.standard_normal(shape, dtype=np.float32) * np.float32(scale))


@pytest.fixture
def simd_then_restore():  # type: ignore[no-untyped-def]
    yield kernels.set_simd
    kernels.set_simd(None)


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int8])
@pytest.mark.parametrize("shape", [(576, 960), (1536, 40)])  # 40 columns: a padded panel
def test_gemm_rows_do_not_depend_on_the_other_rows(dtype, shape, simd_then_restore) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(0)
    k, n = shape
    w = _normal(rng, k, n, scale=0.05)
    weight_t = (w * 2000).round().clamp(-127, 127).to(torch.int8) if dtype == torch.int8 else w
    packed = kernels.pack_weight(weight_t.to(dtype))
    x = _normal(rng, 13, k, scale=3)
    y = kernels.gemm(x, packed, n)
    assert y.shape == (13, n)
    atol = 0.05 if dtype == torch.int8 else 1e-3  # integer weights: dot products in the 1e4s
    torch.testing.assert_close(y, x @ weight_t.to(dtype).float(), rtol=1e-4, atol=atol)
    alone = torch.cat([kernels.gemm(x[i : i + 1], packed, n) for i in range(13)])
    assert torch.equal(y, alone)
    for m in (2, 3, 4, 5, 6, 7, 11):  # every tile mix of 6, 4, 2 and 1 rows
        assert torch.equal(kernels.gemm(x[:m], packed, n), alone[:m])
    order = torch.from_numpy(rng.permutation(13))
    assert torch.equal(kernels.gemm(x[order], packed, n), alone[order])
    others = _normal(rng, 13, k, scale=40)
    others[5] = x[0]
    assert torch.equal(kernels.gemm(others, packed, n)[5], alone[0])
    # the scalar path (CPUs without AVX2/FMA) sums in the same order: the same bits
    simd_then_restore(False)
    assert torch.equal(kernels.gemm(x, packed, n), y)


def _attention_inputs(rng: np.random.Generator, d: int = 64):  # type: ignore[no-untyped-def]
    slots, kv_heads, max_len = 3, 3, 40
    k_cache = _normal(rng, slots, kv_heads, max_len, d)
    v_cache = _normal(rng, slots, kv_heads, max_len, d)
    return k_cache, v_cache, _normal(rng, 12, 9, d)


@needs_kernels
@pytest.mark.parametrize("d", [64, 128, 40])  # the AVX2 paths held in registers, the general one
def test_attention_matches_sdpa_and_each_query_is_alone(d, simd_then_restore) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(1)
    k_cache, v_cache, q = _attention_inputs(rng, d)
    slots = torch.tensor([0] * 8 + [1, 2, 2, 1])
    lengths = torch.tensor([1, 2, 3, 4, 5, 6, 7, 8, 40, 17, 33, 3])
    out = kernels.attention(q, k_cache, v_cache, slots, lengths, 0.125)
    for t in range(12):
        s, n = int(slots[t]), int(lengths[t])
        ref = F.scaled_dot_product_attention(
            q[t][None, :, None], k_cache[s : s + 1, :, :n], v_cache[s : s + 1, :, :n],
            scale=0.125, enable_gqa=True,
        )[0, :, 0]  # fmt: skip
        torch.testing.assert_close(out[t], ref, rtol=1e-5, atol=1e-5)
        alone = kernels.attention(q[t : t + 1], k_cache, v_cache, slots[t : t + 1],
                                  lengths[t : t + 1], 0.125)  # fmt: skip
        assert torch.equal(alone[0], out[t])
    # a prompt cut in chunks: the same rows whatever the cut
    for cut in (3, 5):
        parts = [
            kernels.attention(q[a:b], k_cache, v_cache, slots[a:b], lengths[a:b], 0.125)
            for a, b in ((0, cut), (cut, 8))
        ]
        assert torch.equal(torch.cat(parts), out[:8])
    simd_then_restore(False)
    assert torch.equal(kernels.attention(q, k_cache, v_cache, slots, lengths, 0.125), out)


@needs_kernels
@pytest.mark.parametrize("width", [576, 581])  # 581: a tail past the last 8 lanes
def test_norm_and_activation_rows_are_alone_and_match_torch(width, simd_then_restore) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(2)
    x, weight = _normal(rng, 11, width, scale=4), _normal(rng, width)
    y = kernels.rms_norm(x, weight, 1e-5)
    reference = weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5))
    torch.testing.assert_close(y, reference, rtol=1e-5, atol=1e-5)
    assert torch.equal(
        torch.cat([kernels.rms_norm(x[i : i + 1], weight, 1e-5) for i in range(11)]), y
    )
    gate_up = _normal(rng, 11, 2 * width, scale=5)
    act = kernels.silu_mul(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    torch.testing.assert_close(act, F.silu(gate) * up, rtol=1e-5, atol=1e-5)
    assert torch.equal(kernels.silu_mul(gate_up[3:5]), act[3:5])
    simd_then_restore(False)  # the scalar path: the same bits
    assert torch.equal(kernels.rms_norm(x, weight, 1e-5), y)
    assert torch.equal(kernels.silu_mul(gate_up), act)


@needs_kernels
def test_kernels_refuse_what_they_cannot_compute() -> None:
    with pytest.raises(TypeError, match="fp32, bf16 or int8"):
        kernels.pack_weight(torch.zeros(8, 16, dtype=torch.float16))
    q = torch.zeros(1, 4, 12)  # a head size that is not a multiple of 8
    cache = torch.zeros(1, 2, 4, 12)
    with pytest.raises(ValueError, match="fo_attention refused"):
        kernels.attention(q, cache, cache, torch.tensor([0]), torch.tensor([1]), 1.0)
    with pytest.raises(ValueError, match="rms_norm weight"):
        kernels.rms_norm(torch.zeros(2, 8), torch.zeros(7), 1e-5)
    with pytest.raises(ValueError, match="even width"):
        kernels.silu_mul(torch.zeros(2, 7))


@pytest.mark.parametrize(("given", "kept"), [(None, "1000000"), ("5", "5")])
def test_the_openmp_spin_is_set_before_torch_loads_unless_given(given, kept) -> None:  # type: ignore[no-untyped-def]
    """libgomp reads GOMP_SPINCOUNT once, when torch loads it: the origin server sets its value
    first (before the CLI has imported torch) and keeps an operator's."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "GOMP_SPINCOUNT"}
    if given is not None:
        env["GOMP_SPINCOUNT"] = given
    code = (
        "import edgeqa.cli, os, sys; from edgeqa.libraries import spin_openmp_threads; "
        "print(spin_openmp_threads(), os.environ['GOMP_SPINCOUNT'], 'torch' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert done.stdout.split() == ["True", kept, "False"]  # set, and torch not loaded yet


def test_origin_serve_sets_the_openmp_spin_first(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import os

    import origin.server
    from edgeqa import cli

    seen = {}
    monkeypatch.setenv("GOMP_SPINCOUNT", "unset at teardown")  # restored to what it was
    monkeypatch.delenv("GOMP_SPINCOUNT")
    monkeypatch.setattr(
        origin.server, "serve", lambda *a: seen.update(spin=os.environ.get("GOMP_SPINCOUNT"))
    )
    assert cli.main(["origin", "serve", "--no-logs", "--no-tiers"]) == 0
    assert seen == {"spin": "1000000"}
