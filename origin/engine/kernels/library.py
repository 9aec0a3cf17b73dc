"""Where the fixed-order kernels' library comes from, and why it is trusted.

The kernels are built once, at install (``build.py``, ``setup.py``), into the package beside this
file: ``_fixed_order`` with one of the interpreter's extension suffixes (``.abi3.so`` ...). Nothing
is compiled, written or cached at run time, and no other folder is searched.

The library runs as this process, so it is loaded only where it is no less protected than the
Python code that loads it: the file and its folder must belong to this user, to root, or to the
owner of this package's own code, and be writable by neither group nor others. It is opened
without following links, checked with ``fstat``, then loaded through ``/proc/self/fd`` (Linux), so
the file checked is the file loaded. A library built from other sources than the package holds
(an editable checkout edited since it was installed) is not loaded either: its numbers would not
be the ones its source says.

Where no library can be loaded, ``load()`` raises ``KernelUnavailableError`` saying why and what
to do; the engine then runs on the library kernels (``abi.unavailable_reason``).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import stat
from functools import cache
from pathlib import Path
from types import ModuleType

from base.errors import EdgeQAError
from origin.engine.kernels import build

FOLDER = Path(__file__).resolve().parent
REBUILD = "reinstall where a C compiler works (apt-get install gcc; make venv, or pip install -e .)"


class KernelUnavailableError(EdgeQAError, RuntimeError):
    """The fixed-order kernels cannot be loaded in this process."""


class KernelBuildError(KernelUnavailableError):
    """The kernels were not built at install (no working C compiler), were built from other
    sources than the package holds, or do not load."""


class KernelTrustError(KernelUnavailableError):
    """The kernels' library, or its folder, could hold another user's code."""


# the name the engine raises when a precision needs the kernels (it predates the build at install)
KernelCacheError = KernelUnavailableError


def library_path(folder: Path = FOLDER) -> Path | None:
    """The built library in ``folder`` (the package's own by default), or None: not built."""
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = folder / f"{build.MODULE.rpartition('.')[2]}{suffix}"
        if path.exists():
            return path
    return None


def _trusted_owners() -> set[int]:
    """Who may own the library: root, this user, and whoever owns the code loading it (a
    deployment's venv installed by root or by a build user, run by a service user)."""
    return {0, os.getuid(), os.stat(__file__).st_uid}


def _not_protected(status: os.stat_result) -> str | None:
    """Why a file or folder with this status could hold another user's code, or None."""
    if status.st_uid not in _trusted_owners():
        return f"it belongs to uid {status.st_uid}, neither this user, root nor this code's owner"
    if status.st_mode & 0o022:
        return f"group or others may write it (mode {stat.S_IMODE(status.st_mode):o})"
    return None


def _open_checked(path: Path) -> int:
    """``path`` open for reading, once it and its folder are checked (``KernelTrustError``)."""
    try:
        folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as error:
        raise KernelBuildError(f"cannot open {path.parent}: {error.strerror or error}") from None
    try:
        why = _not_protected(os.fstat(folder))
        if why:
            raise KernelTrustError(
                f"not loading the kernels in {path.parent}: {why} (chmod go-w, or reinstall)"
            )
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(path.name, flags, dir_fd=folder)
        except OSError as error:  # ELOOP: a symbolic link
            raise KernelTrustError(
                f"not loading the kernels {path}: {error.strerror or error}"
            ) from None
    finally:
        os.close(folder)
    status = os.fstat(fd)
    why = "not a regular file" if not stat.S_ISREG(status.st_mode) else _not_protected(status)
    if why:
        os.close(fd)
        raise KernelTrustError(f"not loading the kernels {path}: {why} (chmod go-w, or reinstall)")
    return fd


def load_from(path: Path) -> ModuleType:
    """The extension module at ``path``, loaded once it is checked (``KernelTrustError``), and
    checked to be built from the package's sources (``KernelBuildError``)."""
    fd = _open_checked(path)
    try:
        # the very file checked, even if its path names another by now (Linux; else the path)
        by_fd = f"/proc/self/fd/{fd}"
        origin = by_fd if os.path.exists(by_fd) else str(path)
        loader = importlib.machinery.ExtensionFileLoader(build.MODULE, origin)
        spec = importlib.util.spec_from_file_location(build.MODULE, origin, loader=loader)
        assert spec is not None
        try:
            module = importlib.util.module_from_spec(spec)
            loader.exec_module(module)
        except (ImportError, OSError) as error:
            raise KernelBuildError(f"the kernels {path} do not load ({error}): {REBUILD}") from None
    finally:
        os.close(fd)
    module.__file__ = str(path)
    built = module.ffi.string(module.lib.fo_source_digest()).decode()
    if built != build.source_digest():
        raise KernelBuildError(
            f"the kernels {path} were built from other sources than {build.SOURCE.name} and "
            f"{build.HEADER.name} beside them, or with other flags (built {built or 'unknown'}, "
            f"the sources {build.source_digest()}): {REBUILD}"
        )
    return module


@cache
def _outcome() -> ModuleType | KernelUnavailableError:
    path = library_path()
    if path is None:
        return KernelBuildError(
            f"the fixed-order kernels were not built when edgeqa was installed (no working C "
            f"compiler then, or the build failed; nothing named {build.MODULE} in {FOLDER}): "
            f"{REBUILD}"
        )
    try:
        return load_from(path)
    except KernelUnavailableError as error:
        return error


def load() -> ModuleType:
    """The kernels' extension module (its ``ffi`` and ``lib``), loaded once per process;
    ``KernelUnavailableError`` (the same reason each time) where it cannot be."""
    outcome = _outcome()
    if isinstance(outcome, KernelUnavailableError):
        raise type(outcome)(str(outcome))
    return outcome
