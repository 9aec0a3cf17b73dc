"""Batch invariance of the whole engine, under every ISA cap this CPU supports (``docs/engine.md``).

A greedy request's tokens must not depend on how many requests share its steps, on where its
prompt was cut into chunks, on preemption and recompute, or on speculation. Each cap runs in a
subprocess (``invariance_probe.py``), so one machine checks what an AVX2-only CPU, an AVX-512 one
and this one compute.
"""

from __future__ import annotations

from tests.origin.engine.isa import run_under_isa_caps, supported_caps

PROBE = "tests.origin.engine.invariance_probe"


def _failed(reports: dict[str, dict], quantization: str) -> list[str]:  # type: ignore[type-arg]
    return [
        f"{cap} ({report['aten_capability']}): {name}"
        for cap, report in reports.items()
        for name, ok in report[quantization]["checks"].items()
        if not ok
    ]


def test_fp32_greedy_tokens_do_not_depend_on_the_load_under_every_isa_cap() -> None:
    # AVX2 and up (an AVX2-only CPU, AVX-512, AVX-512 BF16, AMX) and uncapped
    caps = [cap for cap in supported_caps() if cap != "SSE41"]
    reports = run_under_isa_caps(PROBE, "none", "--spec", caps=caps)
    assert _failed(reports, "none") == []
    assert all(r["none"]["batch_invariant"] for r in reports.values())
    # the fixed-order kernels sum in one order on every ISA: the same answer on every CPU
    digests = {cap: r["none"]["digest"] for cap, r in reports.items()}
    assert len(set(digests.values())) == 1, digests


def test_every_served_precision_is_batch_invariant() -> None:
    reports = run_under_isa_caps(PROBE, "bf16,int8,w8a8", "--quick", caps=[""])
    for quantization in ("bf16", "int8", "w8a8"):
        assert _failed(reports, quantization) == []
        assert reports["uncapped"][quantization]["batch_invariant"]
