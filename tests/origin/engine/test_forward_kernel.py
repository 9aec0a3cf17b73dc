"""The fused step (``kernels.Forward``) is the composition of the fixed-order kernels, bit for bit:
the runner's batch-invariant forward is defined by those kernels, and fused only for speed."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from origin.engine import kernels
from origin.engine.ops import rotate
from tests.origin.engine.conftest import needs_kernels
from tests.origin.engine.test_kernels import _normal

pytestmark = needs_kernels

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN, VOCAB = 64, 4, 2, 16, 96, 200
LAYERS, SLOTS, MAX_LEN, EPS = 2, 3, 24, 1e-5


def _q4_1(rng: np.random.Generator, k: int, n: int) -> tuple[kernels.PackedLinear, torch.Tensor]:
    """GGUF Q4_1 weights for an [n, k] layer, and the same weights dequantized (fp32 [k, n])."""
    d = (_normal(rng, n, k // 32, scale=0.01).abs() + 1e-3).half()
    m = (-_normal(rng, n, k // 32, scale=0.05).abs()).half()
    q = torch.from_numpy(rng.integers(0, 16, (n, k), dtype=np.uint8))
    weight = d.float().repeat_interleave(32, 1) * q.float() + m.float().repeat_interleave(32, 1)
    packed = kernels.PackedLinear(kernels.pack_q4_1(d, m, q), n, kind=kernels.Q4_1)
    return packed, weight.t().contiguous()


def _q8_0(rng: np.random.Generator, k: int, n: int) -> tuple[kernels.PackedLinear, torch.Tensor]:
    d = (_normal(rng, n, k // 32, scale=0.001).abs() + 1e-4).half()
    q = torch.from_numpy(rng.integers(-127, 128, (n, k), dtype=np.int8))
    weight = d.float().repeat_interleave(32, 1) * q.float()
    packed = kernels.PackedLinear(kernels.pack_q8_0(d, q), n, kind=kernels.Q8_0)
    return packed, weight.t().contiguous()


def _linear(rng: np.random.Generator, k: int, n: int, kind: str) -> kernels.PackedLinear:
    w = _normal(rng, k, n, scale=k**-0.5)
    if kind == "int8":  # per-channel scales and an activation scale, as CPU INT8 has them
        scale = w.abs().amax(dim=0) / 127
        q = (w / scale).round().clamp(-127, 127).to(torch.int8)
        in_scale = (1 + _normal(rng, k, scale=0.1)).contiguous()
        return kernels.PackedLinear(kernels.pack_weight(q), n, in_scale, scale.contiguous())
    if kind == "gguf":  # Q4_1 layers (and a Q8_0 head: see _Model)
        return _q4_1(rng, k, n)[0]
    if kind == "gguf-a8":  # the same, with 8-bit activations
        return _a8(_q4_1(rng, k, n)[0])
    dtype = torch.bfloat16 if kind == "bf16" else torch.float32
    bias = _normal(rng, n, scale=0.1) if kind == "fp32" else None  # Qwen2's QKV bias
    return kernels.PackedLinear(kernels.pack_weight(w.to(dtype)), n, bias=bias)


def _a8(linear: kernels.PackedLinear, residual: bool = False) -> kernels.PackedLinear:
    assert linear.kind is not None
    packed, kind = kernels.with_8bit_activations(linear.packed, linear.kind, residual)
    return kernels.PackedLinear(packed, linear.out_features, kind=kind)


@pytest.mark.parametrize("weight", [-128, -127, 127])
def test_8bit_activations_at_the_extremes_give_exact_integer_sums_on_every_path(
    weight: int,
) -> None:
    """The largest integer sums a block can hold: every activation at +-127 (a constant row is
    its block's maximum everywhere) times Q8_0 weights at an end of the byte's range and Q4_1
    weights at 15. The AVX2 path sums 16-bit pairs, which would saturate past 2^15: every path
    must still give the scalar path's bits, and those must be the exact product."""
    k, n = 256, 32
    d = torch.full((n, k // 32), 2.0**-10).half()
    q8 = torch.full((n, k), weight, dtype=torch.int8)
    q8[1::2] = 127  # the other columns at the top end
    q4 = torch.full((n, k), 15, dtype=torch.uint8)
    m = torch.zeros(n, k // 32).half()
    cases = [
        (kernels.PackedLinear(kernels.pack_q8_0(d, q8), n, kind=kernels.Q8_0), q8.float(), False),
        (kernels.PackedLinear(kernels.pack_q8_0(d, q8), n, kind=kernels.Q8_0), q8.float(), True),
        (
            kernels.PackedLinear(kernels.pack_q4_1(d, m, q4), n, kind=kernels.Q4_1),
            q4.float(),
            False,
        ),
    ]
    x = torch.ones(4, k) * torch.tensor([[1.0], [-1.0], [0.5], [-3.0]])
    try:
        for linear, q, residual in cases:
            a8 = _a8(linear, residual)
            kernels.set_simd(False)
            scalar = kernels.gemm(x, a8.packed, n, a8.kind)
            # x's blocks quantize to +-127 exactly (d = |x| / 127): the product is exact
            exact = (
                (x.double().sign() * 127)
                @ (q.double().t() * 2.0**-10)
                * x.abs().double()[:, :1]
                / 127
            )
            torch.testing.assert_close(scalar.double(), exact, rtol=1e-6, atol=0)
            for simd in (True, None):
                kernels.set_simd(simd)
                assert torch.equal(kernels.gemm(x, a8.packed, n, a8.kind), scalar), (simd, residual)
    finally:
        kernels.set_simd(None)


class _Model:
    def __init__(self, kind: str, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        qkv = (HEADS + 2 * KV_HEADS) * HEAD_DIM
        self.layers = [
            kernels.LayerWeights(
                _linear(rng, HIDDEN, qkv, kind),
                _linear(rng, HEADS * HEAD_DIM, HIDDEN, kind),
                _linear(rng, HIDDEN, 2 * FFN, kind),
                _linear(rng, FFN, HIDDEN, kind),
                1 + _normal(rng, HIDDEN, scale=0.1),
                1 + _normal(rng, HIDDEN, scale=0.1),
            )
            for _ in range(LAYERS)
        ]
        self.final_norm = 1 + _normal(rng, HIDDEN, scale=0.1)
        # 200: a padded last panel
        heads = {"gguf": lambda: _q8_0(rng, HIDDEN, VOCAB)[0]}
        heads["gguf-a8"] = lambda: _a8(_q8_0(rng, HIDDEN, VOCAB)[0], residual=True)
        self.head = heads.get(kind, lambda: _linear(rng, HIDDEN, VOCAB, kind))()
        angles = torch.arange(MAX_LEN)[:, None] * 0.5 ** torch.arange(HEAD_DIM // 2)[None, :]
        angles = torch.cat([angles, angles], dim=1).double()
        self.cos, self.sin = angles.cos().float(), angles.sin().float()
        shape = (LAYERS, SLOTS, KV_HEADS, MAX_LEN, HEAD_DIM)
        self.k, self.v = torch.zeros(shape), torch.zeros(shape)

    def fused(self) -> kernels.Forward:
        return kernels.Forward(
            self.layers, self.final_norm, self.head, heads=HEADS, kv_heads=KV_HEADS,
            head_dim=HEAD_DIM, eps=EPS, scale=HEAD_DIM**-0.5, k_cache=self.k, v_cache=self.v,
            cos=self.cos, sin=self.sin,
        )  # fmt: skip

    def composed(self, x, positions, slots, rows):  # type: ignore[no-untyped-def]
        """The step as the kernels compose: what ``fo_forward`` must equal."""
        n = HEADS + KV_HEADS
        cos, sin = self.cos[positions][:, None], self.sin[positions][:, None]
        for i, layer in enumerate(self.layers):
            h = kernels.rms_norm(x, layer.input_norm, EPS)
            qkv = layer.qkv(h)
            qk = rotate(qkv[:, : n * HEAD_DIM].reshape(-1, n, HEAD_DIM), cos, sin)
            v = qkv[:, n * HEAD_DIM :].reshape(-1, KV_HEADS, HEAD_DIM)
            heads = torch.arange(KV_HEADS)[None, :]
            self.k[i][slots[:, None], heads, positions[:, None]] = qk[:, HEADS:]
            self.v[i][slots[:, None], heads, positions[:, None]] = v
            attn = kernels.attention(
                qk[:, :HEADS], self.k[i], self.v[i], slots, positions + 1, HEAD_DIM**-0.5
            )
            x = x + layer.o(attn.reshape(len(x), -1))
            h = kernels.rms_norm(x, layer.post_norm, EPS)
            x = x + layer.down(kernels.silu_mul(layer.gate_up(h)))
        return self.head(kernels.rms_norm(x[rows], self.final_norm, EPS))


@pytest.mark.parametrize("kind", ["fp32", "bf16", "int8", "gguf", "gguf-a8"])
@pytest.mark.parametrize("simd", [None, True, False])
def test_the_fused_step_is_the_kernels_composed(kind: str, simd: bool | None) -> None:
    rng = np.random.default_rng(3)
    embeddings = _normal(rng, 40, HIDDEN)
    # a prompt of 5 in slot 1, then a decode step of 3 slots with a 3-token verification in slot 2
    steps = [
        ([3, 7, 1, 9, 2], [0, 1, 2, 3, 4], [1] * 5, [4]),
        ([5, 8, 6, 4, 11], [0, 5, 0, 1, 2], [0, 1, 2, 2, 2], [0, 1, 2, 3, 4]),
    ]
    reference, fused = _Model(kind), _Model(kind)
    forward = fused.fused()
    kernels.set_simd(simd)
    try:
        for tokens, positions, slots, rows in steps:
            args = [torch.tensor(a) for a in (positions, slots, rows)]
            want = reference.composed(embeddings[tokens], *args)
            got = forward(embeddings[tokens].clone(), *args)
            assert got.shape == (len(rows), VOCAB)
            assert torch.equal(got, want)
            assert torch.equal(fused.k, reference.k) and torch.equal(fused.v, reference.v)
    finally:
        kernels.set_simd(None)


def test_the_fused_step_refuses_positions_slots_and_rows_out_of_range() -> None:
    forward = _Model("fp32").fused()
    x = torch.zeros(1, HIDDEN)
    for positions, slots, rows in (([MAX_LEN], [0], [0]), ([0], [SLOTS], [0]), ([0], [0], [1])):
        with pytest.raises(ValueError, match="fo_forward refused"):
            forward(x, torch.tensor(positions), torch.tensor(slots), torch.tensor(rows))


@pytest.mark.parametrize("block", [_q4_1, _q8_0])
def test_gguf_blocks_multiply_as_their_fp32_weights_do(block) -> None:  # type: ignore[no-untyped-def]
    """A GGUF weight is dequantized in the kernel exactly as gguf does it (fl(fl(d * q) + m)), so
    its products are bitwise those of the fp32 copy the converted model holds: on every path and
    for every row count."""
    rng = np.random.default_rng(5)
    k, n = 576, 200
    linear, weight = block(rng, k, n)
    dense = kernels.pack_weight(weight)
    x = _normal(rng, 9, k)
    try:
        for simd in (None, True, False):  # the best (AVX-512 here), AVX2, scalar
            kernels.set_simd(simd)
            for rows in (1, 2, 3, 7, 9):  # batch 1's grouped kernel, and the tiles
                got = kernels.gemm(x[:rows], linear.packed, n, linear.kind)
                assert torch.equal(got, kernels.gemm(x[:rows], dense, n))
    finally:
        kernels.set_simd(None)
    torch.testing.assert_close(got, x @ weight, rtol=1e-4, atol=1e-3)
    with pytest.raises(TypeError, match="GGUF block kind"):
        kernels.gemm(x, linear.packed, n)
    with pytest.raises(ValueError, match="fo_gemm refused"):
        kernels.gemm(x[:, :64], linear.packed, n, linear.kind)


@pytest.mark.parametrize(
    ("block", "residual", "tolerance"),
    [(_q4_1, False, 0.02), (_q8_0, False, 0.02), (_q8_0, True, 2e-4)],
)
def test_8bit_activations_are_row_invariant_and_close_to_the_weights(
    block, residual: bool, tolerance: float
) -> None:  # type: ignore[no-untyped-def]
    """gguf-a8: each row's activations quantized alone per block of 32 (the LM head's with a
    second pass on the rounding error), exact integer dot products, then the block's float steps
    in order. Every path (VNNI, AVX2, scalar) and every row count give the same
    bits; the result is the weights' product up to the activations' rounding."""
    rng = np.random.default_rng(6)
    k, n = 576, 200  # 13 panels: VNNI pairs and a last panel alone
    linear, weight = block(rng, k, n)
    a8 = _a8(linear, residual)
    assert a8.kind in (kernels.Q4_1_A8, kernels.Q8_0_A8, kernels.Q8_0_A16)
    x = _normal(rng, 11, k, scale=2)
    x[3, :32] = 0.0  # a block of zeros: scale 0
    x[4, 40] = 300.0  # an outlier: its block's scale alone grows
    alone = torch.cat([kernels.gemm(x[i : i + 1], a8.packed, n, a8.kind) for i in range(11)])
    try:
        for simd in (None, True, False):
            kernels.set_simd(simd)
            for rows in (1, 2, 3, 4, 5, 9, 11):  # tiles of 4, 2 and 1 rows
                assert torch.equal(kernels.gemm(x[:rows], a8.packed, n, a8.kind), alone[:rows])
            order = torch.from_numpy(rng.permutation(11))
            assert torch.equal(kernels.gemm(x[order], a8.packed, n, a8.kind), alone[order])
    finally:
        kernels.set_simd(None)
    exact = x @ weight
    error = (alone - exact).norm(dim=1) / exact.norm(dim=1)
    assert float(error.max()) < tolerance, error
    assert not torch.equal(alone, exact)  # it is not the fp32 product: quantized activations
    with pytest.raises(ValueError, match="8-bit activation form"):
        kernels.with_8bit_activations(a8.packed, a8.kind)  # type: ignore[arg-type]
    if block is _q4_1:
        with pytest.raises(ValueError, match="residual activation pass is for Q8_0"):
            kernels.with_8bit_activations(linear.packed, kernels.Q4_1, residual=True)
