"""The precision registry (``origin/precision.py``): its entries agree with themselves, with the
settings' vocabulary and with what the invariance tests prove."""

from __future__ import annotations

from typing import get_args

import pytest

from origin.precision import (
    AUTO,
    ENGINE_QUANTIZATIONS,
    QUANTIZATIONS,
    REGISTRY,
    Backend,
    EngineQuantization,
    ForwardPath,
    Invariance,
    LinearKind,
    Needs,
    Quantization,
    choose_auto,
    invariant_precisions,
    lookup,
)
from tests.origin.engine.test_invariance import DEFAULT, PRECISIONS


def test_the_registry_is_the_vocabulary_of_the_settings() -> None:
    assert ENGINE_QUANTIZATIONS == get_args(EngineQuantization)
    assert QUANTIZATIONS == get_args(Quantization) == (AUTO, *ENGINE_QUANTIZATIONS)
    assert [p.name for p in REGISTRY] == list(ENGINE_QUANTIZATIONS)
    assert all(lookup(p.name) is p for p in REGISTRY)


def test_an_unknown_precision_is_refused_naming_the_setting() -> None:
    with pytest.raises(ValueError, match=r"quantization must be one of none, bf16, .*got 'int4'"):
        lookup("int4")
    with pytest.raises(ValueError, match=r"^EDGEQA_QUANTIZATION must be one of"):
        lookup("fp8", "EDGEQA_QUANTIZATION")
    # auto is a setting: the builder resolves it, an engine never runs it
    with pytest.raises(ValueError, match="quantization 'auto' is resolved when an engine is built"):
        lookup(AUTO)


@pytest.mark.parametrize("precision", REGISTRY, ids=lambda p: p.name)
def test_every_entry_agrees_with_itself(precision) -> None:  # type: ignore[no-untyped-def]
    # the devices it runs on are those of the kernels it has a linear for
    assert {b.device for b in precision.linears} == set(precision.devices)
    # the whole step in one C call reads packed weights only; a step of other linears on the
    # fixed-order kernels runs op by op around them
    if Backend.FIXED_ORDER in precision.linears:
        packed = precision.linears[Backend.FIXED_ORDER] is LinearKind.FIXED_ORDER
        assert (precision.forward is ForwardPath.FUSED) == packed
    assert all(
        precision.forward_path(b) is ForwardPath.LIBRARY_OPS
        for b in precision.linears
        if b is not Backend.FIXED_ORDER
    )
    # the LM head is built on the same kernels (the GGUF entries: the file's own head)
    head = lookup(precision.head)
    assert head is precision or set(precision.linears) <= set(head.linears)
    assert set(precision.calibrated_on) <= set(precision.devices)
    if precision.auto is not None:
        assert set(precision.auto.on) <= set(precision.devices)


def test_every_precision_that_runs_on_the_cpu_is_proved_batch_invariant_there() -> None:
    """The CPU's precisions are exactly those ``test_invariance.py`` runs (fp32, the default and
    the others), and the registry declares each invariant on the kernels a runner takes when
    invariance is asked for; on CUDA only exact integer arithmetic is (``test_linear.py``'s
    w8a8 check under every ISA)."""
    on_cpu = {p.name for p in REGISTRY if "cpu" in p.devices}
    assert on_cpu == {"none", DEFAULT, *PRECISIONS}
    for name in on_cpu:
        precision = lookup(name)
        assert precision.invariant_on(precision.backend("cpu", batch_invariant=True)), name
    assert [p.name for p in invariant_precisions(Backend.CUDA_LIBRARY)] == [
        p.name for p in REGISTRY if p.invariance is Invariance.ARITHMETIC
    ]


def test_the_kernels_a_precision_runs_on() -> None:
    int8, gguf = lookup("int8"), lookup("gguf")
    assert int8.backend("cpu", batch_invariant=True) is Backend.FIXED_ORDER
    assert int8.backend("cpu", batch_invariant=False) is Backend.CPU_LIBRARY
    assert int8.backend("cuda:1", batch_invariant=True) is Backend.CUDA_LIBRARY
    assert int8.fallback(Backend.FIXED_ORDER) is Backend.CPU_LIBRARY
    # the GGUF blocks are read by the fixed-order kernels alone: invariant whatever is asked
    assert gguf.backend("cpu", batch_invariant=False) is Backend.FIXED_ORDER
    assert gguf.fallback(Backend.FIXED_ORDER) is None
    with pytest.raises(ValueError, match="runs on CPU, not on CUDA"):
        gguf.backend("cuda", batch_invariant=True)


def test_auto_asks_the_registry_what_each_choice_needs() -> None:
    def meeting(*needs: Needs):  # type: ignore[no-untyped-def]
        return lambda need: need in needs

    assert choose_auto("cpu", meeting(*Needs)) is lookup("gguf-a8")
    # 8-bit activations in plain C: the GGUF's blocks times fp32 activations
    assert choose_auto("cpu", meeting(Needs.GGUF_BLOCKS)) is lookup("gguf")
    assert choose_auto("cpu", meeting(Needs.GGUF_BLOCKS, Needs.NATIVE_BF16)) is lookup("gguf")
    assert choose_auto("cpu", meeting(Needs.FAST_A8, Needs.NATIVE_BF16)) is lookup("bf16")
    assert choose_auto("cpu", meeting(Needs.NATIVE_BF16)) is lookup("bf16")
    assert choose_auto("cpu", meeting()) is lookup("none")
    # on CUDA the weights as loaded (fp16), whatever else holds
    assert choose_auto("cuda", meeting(*Needs)) is lookup("none")
    with pytest.raises(ValueError, match="device must be one of cpu, cuda"):
        choose_auto("mps", meeting())
