"""The shape of the code base: small modules, one way down the layers (import-linter's contracts
in pyproject.toml, run by ``make lint``), and no copy of a block of code across the packages."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("origin", "edge_index", "semantic", "base", "policy", "precompute", "edgeqa", "dags")
MAX_LINES = 600  # a smell detector: split by concept, never to stay under it (issue 33)


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


def test_no_block_of_six_lines_is_written_twice() -> None:
    """Six consecutive identical code lines (stripped; blank lines, comments, imports, lone
    brackets and one-name argument lines aside) in two places of the packages: one of them
    should call the other."""
    window = 6
    argument = re.compile(r"[\w.*]+(: [^=]+)?( ?= ?[^=].*)?,")
    seen: dict[tuple[str, ...], str] = {}
    copies = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            lines = [
                (n, text)
                for n, raw in enumerate(path.read_text("utf-8").splitlines(), 1)
                if (text := raw.strip())
                and not text.startswith(("#", "import ", "from "))
                and text not in (")", "]", "}", "),", "],", "},", '"""')
                and not argument.fullmatch(text)
            ]
            for i in range(len(lines) - window + 1):
                block = tuple(text for _, text in lines[i : i + window])
                where = f"{path.relative_to(ROOT)}:{lines[i][0]}"
                if block in seen and not seen[block].startswith(f"{where.split(':')[0]}:"):
                    copies.append(f"{seen[block]} and {where}")
                seen.setdefault(block, where)
    assert copies == [], "the same block in two places:\n" + "\n".join(copies)


# the packages whose __init__.py is the map of what lives where, one line per module
MAPPED = (
    "base",
    "policy",
    "edge_index",
    "edge_index/server",
    "semantic",
    "origin",
    "origin/server",
    "precompute",
)


def test_each_package_s_docstring_maps_every_module_it_holds() -> None:
    import ast

    unmapped = {}
    for package in MAPPED:
        doc = ast.get_docstring(ast.parse((ROOT / package / "__init__.py").read_text("utf-8")))
        assert doc, f"{package}/__init__.py has no docstring"
        names = [p.name for p in (ROOT / package).glob("*.py") if p.name != "__init__.py"]
        names += [p.name + "/" for p in (ROOT / package).iterdir() if (p / "__init__.py").is_file()]
        missing = [name for name in sorted(names) if name not in doc]
        if missing:
            unmapped[package] = missing
    assert unmapped == {}, "add these to their package's map (its __init__.py docstring)"


def test_the_readme_s_layout_links_every_top_package_s_map() -> None:
    """The README's layout table names each mapped top-level package and links its map (the
    ``__init__.py`` docstring the test above keeps whole), so the README never lags the code."""
    readme = (ROOT / "README.md").read_text("utf-8")
    tops = sorted({package.split("/")[0] for package in MAPPED})
    missing = [top for top in tops if f"[`{top}/__init__.py`]({top}/__init__.py)" not in readme]
    assert missing == [], "link these packages' maps from the README's layout table"
