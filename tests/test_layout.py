"""The shape of the code base: small modules, one way down the layers (import-linter's contracts
in pyproject.toml, run by ``make lint``), and no copy of a block of code across the packages."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("origin", "edge_index", "precompute", "edgeqa", "dags")
MAX_LINES = 450


def test_no_module_is_too_long_to_read() -> None:
    long = {
        str(path.relative_to(ROOT)): n
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        if (n := len(path.read_text("utf-8").splitlines())) > MAX_LINES
    }
    assert long == {}, f"split these modules (over {MAX_LINES} lines)"


def test_the_import_contracts_hold() -> None:
    done = subprocess.run(
        [str(Path(sys.executable).parent / "lint-imports"), "--no-cache"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0 and " 0 broken" in done.stdout, done.stdout[-4000:]
