"""Where the fixed-order kernels are built and what is loaded: ``<EDGEQA_CACHE_DIR>/kernels/``,
never a shared folder, and never a library another user could have written (docs/security.md).

``kernels.library()`` loads once per process, so each case runs in a fresh interpreter with its
own home, cache folder and temporary folder (``TMPDIR``: the system's temporary directory there).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
# a GEMM through the kernels: 32.0 when the real library is loaded
GEMM = (
    "import torch; from origin.engine import kernels; "
    "w = kernels.pack_weight(torch.ones(32, 16)); "
    "print(kernels.gemm(torch.ones(2, 32), w, 16)[0, 0].item())"
)
# an engine runner on a tiny model: what it runs on, and that a step computes
RUNNER = (
    "import json, torch; from origin.engine.runner import LlamaRunner, Segment; "
    "from tests.origin.engine.conftest import tiny_model; "
    "runner = LlamaRunner(tiny_model('llama'), num_slots=1, max_len=32); "
    "logits = runner.forward([Segment(0, [1, 2, 3], 0)])[0]; "
    "print(json.dumps({'batch_invariant': runner.batch_invariant, "
    "'finite': bool(torch.isfinite(logits).all())}))"
)
# another user's code: proof that it ran is the marker file its constructor writes
PLANTED = """#include <stdio.h>
__attribute__((constructor)) static void planted(void) {
    FILE *f = fopen(%s, "w");
    if (f) { fputs("planted code ran\\n", f); fclose(f); }
}
"""


def _run(code: str, home: Path, cache_dir: Path, tmp: Path) -> subprocess.CompletedProcess[str]:
    tmp.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("EDGEQA_")}
    env.update(HOME=str(home), EDGEQA_CACHE_DIR=str(cache_dir), TMPDIR=str(tmp))
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def _compiler() -> str:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    assert compiler, "the kernels' tests need a C compiler"
    return compiler


@pytest.fixture(scope="module")
def library_name(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The kernels' file name (the source's and flags' hash), from a build in a home of its own."""
    home = tmp_path_factory.mktemp("home")
    cache_dir = home / ".cache" / "edgeqa"
    done = _run(GEMM, home, cache_dir, home / "tmp")
    assert done.returncode == 0, done.stderr[-3000:]
    (built,) = (cache_dir / "kernels").glob("fixed_order-*.so")
    return built.name


def test_the_kernels_are_built_in_edgeqa_cache_dir(tmp_path: Path) -> None:
    home, cache_dir, tmp = tmp_path / "home", tmp_path / "cache", tmp_path / "tmp"
    home.mkdir()
    done = _run(GEMM, home, cache_dir, tmp)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["32.0"]
    (built,) = (cache_dir / "kernels").glob("fixed_order-*.so")
    assert (cache_dir / "kernels").stat().st_mode & 0o777 == 0o700
    assert built.stat().st_uid == os.getuid() and built.stat().st_mode & 0o022 == 0
    assert not list(home.rglob("*.so")) and not list(tmp.rglob("*.so"))


@pytest.mark.parametrize(
    "planted_as",
    ["writable by others", "in a folder writable by others", "another user's"],
)
def test_a_library_another_user_could_have_written_is_never_loaded(
    planted_as: str, library_name: str, tmp_path: Path
) -> None:
    if planted_as == "another user's" and os.getuid() != 0:
        pytest.skip("only root can give a file to another user")
    home = tmp_path / "home"
    cache_dir = home / ".cache" / "edgeqa"  # the default location: EDGEQA_CACHE_DIR's default
    folder = cache_dir / "kernels"
    folder.mkdir(parents=True, mode=0o700)
    marker, source = tmp_path / "planted-code-ran", tmp_path / "planted.c"
    source.write_text(PLANTED % json.dumps(str(marker)))
    planted = folder / library_name
    cc = [_compiler(), "-shared", "-fPIC", str(source), "-o", str(planted)]
    subprocess.run(cc, check=True, capture_output=True)
    planted.chmod(0o755)
    if planted_as == "writable by others":
        planted.chmod(0o777)
    elif planted_as == "in a folder writable by others":
        folder.chmod(0o777)
    else:
        os.chown(planted, 65534, 65534)  # nobody

    done = _run(GEMM, home, cache_dir, tmp_path / "tmp")
    assert not marker.exists(), "the planted library was loaded"
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["32.0"]  # the real kernels, built again over the planted file
    assert str(folder) in done.stderr and "not loading" in done.stderr  # warned, with the path
    for path in (folder, planted):
        assert path.stat().st_uid == os.getuid() and path.stat().st_mode & 0o022 == 0


def test_an_unwritable_cache_uses_no_temporary_folder_and_the_engine_still_starts(
    tmp_path: Path,
) -> None:
    # sysfs refuses a new folder to every user, root included (permission bits do not stop root)
    unwritable = Path("/sys/edgeqa-kernel-cache-test")
    with pytest.raises(OSError):
        unwritable.mkdir()
    tmp = tmp_path / "tmp"
    done = _run(RUNNER, unwritable / "home", unwritable / "cache", tmp)
    assert done.returncode == 0, done.stderr[-3000:]
    # no library and nothing of edgeqa's in the temporary folder (torch keeps its own there)
    shared = [p for p in tmp.rglob("*") if p.suffix == ".so" or p.name.startswith("edgeqa")]
    assert not shared, "the kernels went to the system's temporary folder"
    assert json.loads(done.stdout.splitlines()[-1]) == {"batch_invariant": False, "finite": True}
    assert str(unwritable / "cache" / "kernels") in done.stderr
    assert "batch invariance is off" in done.stderr  # what the fallback costs, said
