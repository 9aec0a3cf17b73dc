"""Which fixed-order kernels are loaded: the library the install built beside the package, with
nothing compiled or written at run time; never one another user could have written, nor one
built from other sources than the package holds (docs/security.md). Without one the engine starts
on the library kernels and says what is lost.

The library loads once per process, so each case runs in a fresh interpreter; most run on a copy
of the packages (``package_copy``) whose library is planted, opened up, stale or missing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from origin.engine import kernels
from tests.origin.engine.conftest import ROOT, needs_kernels, package_copy, run_python

# a GEMM through the kernels: 32.0 when the real library is loaded
GEMM = (
    "import torch; from origin.engine import kernels; "
    "w = kernels.pack_weight(torch.ones(32, 16)); "
    "print(kernels.gemm(torch.ones(2, 32), w, 16)[0, 0].item())"
)
REASON = "from origin.engine import kernels; print(kernels.unavailable_reason())"
# an engine runner on a tiny model: what it runs on, that a step computes, and that the GGUF
# blocks' precisions (which only the kernels read) refuse with the reason
RUNNER = """
import json, torch
from transformers import AutoConfig, AutoModelForCausalLM
from origin.engine import kernels
from origin.engine.runner import LlamaRunner, Segment
config = AutoConfig.for_model(
    "llama", vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
)
model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
runner = LlamaRunner(model, num_slots=1, max_len=32)
logits = runner.forward([Segment(0, [1, 2, 3], 0)])[0]
try:
    LlamaRunner(model, num_slots=1, max_len=32, quantization="gguf")
    gguf = "started"
except kernels.KernelUnavailableError as error:
    gguf = str(error)
print(json.dumps({"batch_invariant": runner.batch_invariant,
                  "finite": bool(torch.isfinite(logits).all()), "gguf": gguf}))
"""
# another user's code: proof that it ran is the marker file its constructor writes
PLANTED = """#include <stdio.h>
__attribute__((constructor)) static void planted(void) {
    FILE *f = fopen(%s, "w");
    if (f) { fputs("planted code ran\\n", f); fclose(f); }
}
"""


def _planted(tmp_path: Path) -> tuple[Path, Path]:
    """A shared library whose constructor writes a marker file: (the library, the marker)."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not compiler:
        pytest.skip("planting a library needs a C compiler")
    marker, source = tmp_path / "planted-code-ran", tmp_path / "planted.c"
    source.write_text(PLANTED % json.dumps(str(marker)))
    library = tmp_path / "planted.so"
    cc = [compiler, "-shared", "-fPIC", str(source), "-o", str(library)]
    subprocess.run(cc, check=True, capture_output=True)
    library.chmod(0o755)
    return library, marker


@needs_kernels
def test_the_installed_library_is_loaded_and_nothing_is_written_at_run_time(
    tmp_path: Path,
) -> None:
    # sysfs refuses a new folder to every user, root included: no cache could be written
    unwritable = Path("/sys/edgeqa-kernel-cache-test")
    with pytest.raises(OSError):
        unwritable.mkdir()
    home, tmp = tmp_path / "home", tmp_path / "tmp"
    home.mkdir()
    tmp.mkdir()
    done = run_python(
        GEMM, [ROOT], ROOT, HOME=str(home), EDGEQA_CACHE_DIR=str(unwritable), TMPDIR=str(tmp)
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["32.0"]
    assert not [p for p in (*home.rglob("*"), *tmp.rglob("*")) if p.suffix == ".so"]
    built = kernels.library_path()
    assert built is not None and built.parent == Path(kernels.__file__).resolve().parent


@pytest.mark.parametrize(
    "opened_as",
    ["writable by others", "in a folder writable by others", "a symbolic link", "another user's"],
)
def test_a_library_another_user_could_have_written_is_never_loaded(
    opened_as: str, tmp_path: Path
) -> None:
    if opened_as == "another user's" and os.getuid() != 0:
        pytest.skip("only root can give a file to another user")
    planted, marker = _planted(tmp_path)
    folder = package_copy(tmp_path / "packages")
    name = (kernels.library_path() or Path("_fixed_order.abi3.so")).name
    if opened_as == "a symbolic link":
        (folder / name).symlink_to(planted)
    else:
        shutil.copy2(planted, folder / name)
    if opened_as == "writable by others":
        (folder / name).chmod(0o777)
    elif opened_as == "in a folder writable by others":
        folder.chmod(0o777)
    elif opened_as == "another user's":
        os.chown(folder / name, 65534, 65534)  # nobody

    done = run_python(REASON, [tmp_path / "packages"], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert not marker.exists(), "the planted library was loaded"
    reason = done.stdout.strip()
    assert reason.startswith("not loading the kernels") and str(folder) in reason
    assert "without the fixed-order kernels" in done.stderr.lower()  # what is lost, said


def test_a_library_of_this_users_alone_is_what_is_loaded(tmp_path: Path) -> None:
    """The control: the same planted library, private, is loaded (its code runs, and it then
    fails as the kernels it is not): the checks above are what kept it out."""
    planted, marker = _planted(tmp_path)
    package_copy(tmp_path / "packages", planted)
    done = run_python(REASON, [tmp_path / "packages"], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert marker.exists()
    assert "do not load" in done.stdout


@needs_kernels
def test_a_library_built_from_other_sources_is_not_loaded(tmp_path: Path) -> None:
    built = kernels.library_path()
    assert built is not None
    folder = package_copy(tmp_path / "packages", built)
    source = folder / "fixed_order.c"
    source.write_text(source.read_text() + "\n/* edited since the build */\n")
    done = run_python(REASON, [tmp_path / "packages"], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "built from other sources" in done.stdout and "pip install -e ." in done.stdout


def test_without_the_kernels_the_engine_starts_on_the_library_kernels_and_says_so(
    tmp_path: Path,
) -> None:
    package_copy(tmp_path / "packages")  # as an install without a C compiler leaves it
    done = run_python(RUNNER, [tmp_path / "packages"], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["batch_invariant"] is False and report["finite"] is True
    assert "were not built when edgeqa was installed" in report["gguf"]
    assert "were not built" in done.stderr
    assert "batch invariance is off" in done.stderr  # the runner's account of the fallback
    assert "GGUF-block weights" in done.stderr  # and the kernels' own, once


@needs_kernels
def test_the_bindings_constants_are_the_compiled_headers() -> None:
    """The Python side reads the header's enums itself (packing needs no library): they must be
    the values the extension was compiled with."""
    from origin.engine.kernels import abi

    lib = kernels.library()
    assert abi._H and all(getattr(lib, name) == value for name, value in abi._H.items())
    assert kernels.ISAS == ("scalar", "avx2", "avx512", "vnni")
