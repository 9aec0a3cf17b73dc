"""The kernels' instruction-set levels: each level this CPU runs takes its own code path (the
library says which variants ran) and computes the very bits of the plain C path; the level is
read from ``EDGEQA_KERNEL_ISA`` when the library loads; and the portable build (the plain C path
alone, without OpenMP: what aarch64 or a compiler without OpenMP compiles) computes them too,
as do other compilers and, where a cross compiler and an emulator are installed, aarch64."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from origin.engine import kernels
from tests.origin.engine.conftest import ROOT, needs_kernels, package_copy, run_python
from tests.origin.engine.test_forward_kernel import _a8, _linear, _Model, _q4_1, _q8_0
from tests.origin.engine.test_kernels import _attention_inputs, _normal

KERNELS = ROOT / "origin" / "engine" / "kernels"
HARNESS = Path(__file__).with_name("fixed_order_harness.c")
# other builds of the kernels: (compiler, flags, how to run its program)
TOOLCHAINS = {
    "clang without OpenMP, as Apple's": (["clang"], [], []),
    "aarch64 with OpenMP, under qemu": (
        ["aarch64-linux-gnu-gcc"],
        ["-fopenmp"],
        ["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu"],
    ),
}


def workload() -> dict[str, torch.Tensor]:
    """Every kernel at the shapes that pick each variant (one row: the grouped panels; more: the
    tiles), and two fused steps, from fixed seeds: name -> result."""
    rng = np.random.default_rng(11)
    x = _normal(rng, 7, 576)
    layers = {kind: _linear(rng, 576, 200, kind) for kind in ("fp32", "bf16", "int8", "gguf")}
    q8 = _q8_0(rng, 576, 200)[0]
    layers |= {"q8_0": q8, "q4_1-a8": _a8(_q4_1(rng, 576, 200)[0]), "q8_0-a8": _a8(q8)}
    layers["q8_0-a16"] = _a8(q8, residual=True)
    out = {f"{name}/{rows}": layer(x[:rows]) for name, layer in layers.items() for rows in (1, 7)}
    for d in (64, 40):  # the AVX2 kernel held in registers, the general one
        k_cache, v_cache, q = _attention_inputs(rng, d)
        slots, lengths = torch.tensor([0, 1, 2] * 4), torch.arange(1, 13) * 3
        out[f"attention/{d}"] = kernels.attention(q, k_cache, v_cache, slots, lengths, 0.125)
    out["rms_norm"] = kernels.rms_norm(x, 1 + _normal(rng, 576, scale=0.1), 1e-5)
    out["silu_mul"] = kernels.silu_mul(_normal(rng, 7, 1152, scale=4))
    embeddings = _normal(rng, 3, 64)
    positions, slots, rows = torch.tensor([0, 1, 2]), torch.tensor([1, 1, 1]), torch.arange(3)
    for kind in ("gguf", "gguf-a8"):  # a 3-token prompt through a whole step
        forward = _Model(kind).fused()
        out[f"forward/{kind}"] = forward(embeddings.clone(), positions, slots, rows)
    return out


def _rank(level: str) -> int:
    return kernels.ISAS.index(level)


@needs_kernels
@pytest.mark.parametrize("level", kernels.ISAS)
def test_each_level_takes_its_own_path_and_computes_the_plain_c_bits(level: str) -> None:
    best = kernels.supported_isa()
    if _rank(level) > _rank(best):
        pytest.skip(f"this CPU runs the kernels at most at {best}")
    try:
        kernels.set_isa("scalar")
        kernels.paths_taken()
        reference = workload()
        assert kernels.paths_taken() == {"scalar"}
        assert kernels.set_isa(level) == kernels.isa() == level
        got = workload()
        taken = kernels.paths_taken()
        a8_path = kernels.a8_path()
    finally:
        kernels.set_isa(None)
    # the level's own variants ran, and none above it
    assert max(taken, key=_rank) == level, taken
    assert a8_path == {"scalar": "c", "vnni": "vnni"}.get(level, "avx2")
    for name, value in reference.items():
        assert torch.equal(got[name], value), name


@needs_kernels
def test_a_level_above_the_cpus_is_refused_and_none_is_the_level_chosen_at_load() -> None:
    best = kernels.supported_isa()
    assert kernels.set_isa(None) == kernels.isa()
    if best != kernels.ISAS[-1]:
        higher = kernels.ISAS[_rank(best) + 1]
        with pytest.raises(ValueError, match=f"at most at {best}"):
            kernels.set_isa(higher)
        assert kernels.isa() == best  # left as it was
    with pytest.raises(ValueError, match="not one of"):
        kernels.set_isa("sse2")


@needs_kernels
def test_edgeqa_kernel_isa_is_read_when_the_library_loads(tmp_path: Path) -> None:
    gemm = (
        "import torch; from origin.engine import kernels; "
        "w = kernels.pack_weight(torch.ones(32, 16)); kernels.gemm(torch.ones(2, 32), w, 16); "
        "print(kernels.isa(), *sorted(kernels.paths_taken()))"
    )
    done = run_python(gemm, [ROOT], tmp_path, EDGEQA_KERNEL_ISA="scalar")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["scalar", "scalar"]
    best = kernels.supported_isa()
    if best != "vnni":  # a level above the CPU's: the CPU's, and a warning naming both
        done = run_python(gemm, [ROOT], tmp_path, EDGEQA_KERNEL_ISA="vnni")
        assert done.returncode == 0, done.stderr[-3000:]
        assert done.stdout.split()[0] == best
        assert (
            f"EDGEQA_KERNEL_ISA=vnni: this CPU runs the fixed-order kernels at most at {best}"
            in (done.stderr)
        )
    done = run_python(gemm, [ROOT], tmp_path, EDGEQA_KERNEL_ISA="sse2")
    assert done.returncode != 0 and "EDGEQA_KERNEL_ISA" in done.stderr  # a bad value fails loudly


@needs_kernels
@pytest.mark.slow
def test_the_portable_build_computes_the_same_bits(tmp_path: Path) -> None:
    """The kernels compiled as aarch64 compiles them (``FO_SCALAR_ONLY``: the plain C path alone)
    and without OpenMP, loaded as the package's library in a fresh interpreter."""
    packages = tmp_path / "packages"
    package_copy(packages)
    # built where the copy's build.py is, as setup.py builds: every path inside the copy
    compile_ = (
        "from origin.engine.kernels.build import ffibuilder; "
        "ffibuilder([('FO_SCALAR_ONLY', None)]).compile(tmpdir='.')"
    )
    done = run_python(compile_, [packages], packages)
    assert done.returncode == 0, done.stderr[-3000:]
    results = tmp_path / "results.pt"
    run = (
        "import torch; from origin.engine import kernels; "
        "from tests.origin.engine.test_kernel_isa import workload; "
        f"torch.save(workload(), {str(results)!r}); "
        "print(kernels.supported_isa(), kernels.openmp(), *sorted(kernels.paths_taken()))"
    )
    done = run_python(run, [packages, ROOT], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["scalar", "False", "scalar"]
    portable = torch.load(results)
    here = workload()
    assert portable.keys() == here.keys()
    for name, value in here.items():
        assert torch.equal(portable[name], value), name


def _harness_lines(
    tmp_path: Path, name: str, build: tuple[list[str], list[str], list[str]]
) -> list[str]:
    """What ``fixed_order_harness.c`` prints at the plain C level, built with ``build``."""
    compiler, flags, runner = build
    program = tmp_path / name
    sources = [f"-I{KERNELS}", str(HARNESS), str(KERNELS / "fixed_order.c")]
    cmd = [*compiler, "-O2", "-std=c11", "-ffp-contract=off", *flags, *sources, "-o", str(program)]
    subprocess.run([*cmd, "-lm"], check=True, capture_output=True)
    out = subprocess.run([*runner, str(program), "0"], check=True, capture_output=True, text=True)
    lines = out.stdout.splitlines()
    assert lines[0] == "level 0" and lines[-1] == "paths 1"  # the plain C path, and it alone
    return lines[1:-1]


@pytest.mark.slow
@pytest.mark.parametrize("toolchain", TOOLCHAINS)
def test_other_compilers_and_cpus_compute_the_same_bits(toolchain: str, tmp_path: Path) -> None:
    """The kernels built by another compiler or for another CPU give this build's bits, kernel by
    kernel (``expf`` included: the same C library's); skipped where the tools are missing
    (``apt-get install clang gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user``)."""
    compiler, _, runner = TOOLCHAINS[toolchain]
    native = shutil.which("cc") or shutil.which("gcc")
    missing = [
        tool for tool in (native, compiler[0], *runner[:1]) if not tool or not shutil.which(tool)
    ]
    if missing:
        pytest.skip(f"not installed: {', '.join(str(t) for t in missing)}")
    assert native is not None
    here = _harness_lines(tmp_path, "native", ([native], [], []))
    assert len(here) == 21  # every kernel and weight kind
    assert _harness_lines(tmp_path, "other", TOOLCHAINS[toolchain]) == here
