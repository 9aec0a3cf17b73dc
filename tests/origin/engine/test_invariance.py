"""Batch invariance of the whole engine, under every ISA cap this CPU supports (``docs/engine.md``).

A greedy request's tokens must not depend on how many requests share its steps, on where its
prompt was cut into chunks, on preemption and recompute, or on speculation. Each cap runs in a
subprocess (``invariance_probe.py``), so one machine checks what an AVX2-only CPU, an AVX-512 one
and this one compute.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.origin.engine.conftest import needs_kernels
from tests.origin.engine.isa import run_probes, supported_caps

pytestmark = needs_kernels

PROBE = "tests.origin.engine.invariance_probe"


def _failed(reports: dict[str, dict], quantization: str) -> list[str]:  # type: ignore[type-arg]
    return [
        f"{cap} ({report['aten_capability']}): {name}"
        for cap, report in reports.items()
        for name, ok in report[quantization]["checks"].items()
        if not ok
    ]


# fp32 under each vector width this CPU has: AVX2 (an AVX2-only CPU) and uncapped (AVX-512 here).
# The caps above AVX512_CORE (BF16, AMX) add bf16 and int8 instructions only, so for these fp32
# probes they run the uncapped kernels again. SSE41 is ATen's scalar level, which no x86 CPU the
# kernels target runs. Under each cap the fp32 probe runs the mix (a long prompt chunk-prefilled
# while 4 others decode: batching and chunking at once) and the one-at-a-time reference, whose
# digest must be the same under every cap. The default precision (``gguf``: the GGUF's blocks,
# bitwise the fp32 model) runs every check uncapped: batches of 3 and 8, preemption and
# recompute (of eight), and each speculative method; its digest (of the answers both make)
# must equal fp32's. The other served
# precisions (gguf-a8 included: 8-bit activations, not the fp32 numbers) run the mix.
# On an AVX2-only CPU uncapped is AVX2: it runs once.
CAPS = [cap for cap in supported_caps() if cap == "AVX2" and supported_caps()[-2] != "AVX2"] + [""]
PRECISIONS = ("bf16", "int8", "w8a8", "gguf-a8")
DEFAULT = "gguf"


@pytest.fixture(scope="module")
def reports(model_cache_dir: Path) -> dict[str, dict]:  # type: ignore[type-arg]
    """Every probe of this module, side by side: fp32 under each cap, the default precision with
    every check, and each other served precision's quick check, uncapped; on the session's
    converted model (``EDGEQA_CACHE_DIR``)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("EDGEQA_CACHE_DIR", str(model_cache_dir))
        return _run_probes()


def _run_probes() -> dict[str, dict]:  # type: ignore[type-arg]
    # the uncapped quick probes in one process (one model load, one interpreter): 3 jobs
    quick = ",".join(("none", *PRECISIONS))
    capped = [cap for cap in CAPS if cap]
    jobs = [(cap, ("none", "--quick")) for cap in capped]
    jobs += [("", (quick, "--quick")), ("", (DEFAULT, "--spec"))]
    *under_caps, uncapped, default = run_probes(PROBE, jobs)
    fp32 = {cap: report for cap, report in zip(capped, under_caps, strict=True)}
    fp32["uncapped"] = uncapped
    isa = {"aten_capability": uncapped["aten_capability"]}
    return {
        "fp32": fp32,
        DEFAULT: default,
        **{precision: {**isa, precision: uncapped[precision]} for precision in PRECISIONS},
    }


def test_fp32_greedy_tokens_do_not_depend_on_the_load_under_every_isa_cap(reports) -> None:  # type: ignore[no-untyped-def]
    fp32 = reports["fp32"]
    assert list(fp32) == [cap or "uncapped" for cap in CAPS]
    assert _failed(fp32, "none") == []
    assert all(r["none"]["batch_invariant"] for r in fp32.values())
    # every step of a layer is fixed-order C or exact elementwise arithmetic: the same answer
    # whatever vector unit ATen or oneDNN would pick on this CPU
    digests = {cap: r["none"]["digest"] for cap, r in fp32.items()}
    assert len(set(digests.values())) == 1, digests


def test_the_default_precision_passes_every_check(reports) -> None:  # type: ignore[no-untyped-def]
    report = reports[DEFAULT]
    assert _failed({"uncapped": report}, DEFAULT) == []
    checks = report[DEFAULT]["checks"]
    assert {"batch of 8", "preempted and recomputed", "draft: speculation one at a time"} <= set(
        checks
    )
    assert report[DEFAULT]["batch_invariant"]


@pytest.mark.parametrize("quantization", PRECISIONS)
def test_every_served_precision_is_batch_invariant(reports, quantization) -> None:  # type: ignore[no-untyped-def]
    report = {"uncapped": reports[quantization]}
    assert _failed(report, quantization) == []
    assert report["uncapped"][quantization]["batch_invariant"]


def test_gguf_blocks_answer_bitwise_as_the_fp32_model(reports) -> None:  # type: ignore[no-untyped-def]
    """The GGUF file's own blocks, dequantized in the kernels as gguf does, are the fp32 model's
    weights: the same greedy tokens, bit for bit, at a fifth of the bytes."""
    assert reports[DEFAULT][DEFAULT]["digest"] == reports["fp32"]["uncapped"]["none"]["digest"]
