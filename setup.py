"""edgeqa's one compiled part: the fixed-order CPU kernels, built at install as the optional
extension ``origin.engine.kernels._fixed_order`` (``origin/engine/kernels/build.py``). Everything
else is declared in ``pyproject.toml``.

OpenMP where the compiler has it (the kernels split their work over threads), else without (one
thread, the same results). Where no C compiler works (``CC=false``, an image without gcc) the
install still succeeds: the engine then runs on the library kernels and says what is lost.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CCompilerError, CompileError, LinkError

OPENMP = ["-fopenmp"]
_PROBE = "#include <omp.h>\nint probe(void) { return omp_get_max_threads(); }\n"


class BuildKernels(build_ext):
    """build_ext that compiles the kernels with OpenMP where the compiler can, and says so."""

    def build_extension(self, ext: Extension) -> None:
        openmp = self._openmp_works()
        if openmp:
            ext.extra_compile_args = [*ext.extra_compile_args, *OPENMP]
            ext.extra_link_args = [*ext.extra_link_args, *OPENMP]
        try:
            super().build_extension(ext)
        except (CCompilerError, CompileError, LinkError) as error:
            print(
                f"edgeqa: the fixed-order kernels were not built ({error}); the engine will run "
                "on the library kernels, without batch invariance or the GGUF-block weights"
            )
            raise  # the extension is optional: setuptools goes on without it
        if not openmp:
            print(
                "edgeqa: the kernels were built without OpenMP (the compiler has none): one thread"
            )

    def _openmp_works(self) -> bool:
        with tempfile.TemporaryDirectory() as tmp:
            source = Path(tmp) / "probe.c"
            source.write_text(_PROBE)
            try:
                objects = self.compiler.compile(
                    [str(source)], output_dir=tmp, extra_postargs=OPENMP
                )
                self.compiler.link_shared_object(
                    objects, str(Path(tmp) / "probe.so"), extra_postargs=OPENMP
                )
            except (CCompilerError, CompileError, LinkError):
                return False
        return True


setup(
    cffi_modules=["origin/engine/kernels/build.py:ffibuilder"],
    cmdclass={"build_ext": BuildKernels},
)
