"""Every benchmark answers ``--help`` at once: its command line is built by ``parser()``, which
imports nothing heavy (the libraries and the project's packages are imported by ``main`` once the
arguments are parsed), and no benchmark imports test code (a clean checkout runs them all)."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
SCRIPTS = sorted(BENCHMARKS.glob("*.py"))
# what building a parser must not import: the heavy libraries and the project's own packages
HEAVY = {
    "torch", "transformers", "faiss", "ray", "duckdb", "numpy", "pyarrow", "httpx",
    "edgeqa", "precompute", "origin", "edge_index", "semantic", "base", "policy", "tests",
}  # fmt: skip
# one process for all of them: each module imported as its script imports its siblings
# (benchmarks/ and the checkout first on the path), each help rendered, then what was imported
PROBE = """
import importlib, json, sys
sys.path[:0] = sys.argv[1:3]
helps = {name: importlib.import_module(name).parser().format_help() for name in sys.argv[3:]}
print(json.dumps({"helps": helps, "modules": sorted({m.split(".")[0] for m in sys.modules})}))
"""


def _functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text("utf-8"))
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}


def _has_command_line(path: Path) -> bool:
    """A script (not a private helper) or a helper that runs as one."""
    return not path.name.startswith("_") or '__name__ == "__main__"' in path.read_text("utf-8")


def test_every_benchmark_s_command_line_is_built_by_parser() -> None:
    missing = [
        p.name for p in SCRIPTS if _has_command_line(p) and not {"parser", "main"} <= _functions(p)
    ]
    assert missing == [], "give these a parser() that only builds the argparse parser"


def test_no_benchmark_imports_test_code() -> None:
    importing = [
        p.name
        for p in SCRIPTS
        if re.search(r"^\s*(from|import)\s+tests\b", p.read_text("utf-8"), re.MULTILINE)
    ]
    assert importing == []


def test_every_help_renders_without_importing_anything_heavy() -> None:
    names = [p.stem for p in SCRIPTS if "parser" in _functions(p)]
    assert len(names) >= 20
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(BENCHMARKS), str(ROOT), *names],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    found = json.loads(done.stdout)
    assert sorted(found["helps"]) == sorted(names)
    assert all(text.startswith("usage: ") for text in found["helps"].values())
    assert HEAVY & set(found["modules"]) == set()


def test_the_step_profile_groups_perfs_samples_by_the_code_they_land_in() -> None:
    """``step_profile.py`` sums perf's lines into categories, the server's Python by thread."""
    sys.path[:0] = [str(BENCHMARKS), str(ROOT)]
    try:
        from step_profile import categorize
    finally:
        del sys.path[:2]
    report = "\n".join(
        [
            "# comment",
            "  40.10% |  101:python |_fixed_order.abi3.so |[.] q4_tile",
            "  10.00% |  102:python |_fixed_order.abi3.so |[.] group512_q4_1",
            "  12.50% |  102:python |_fixed_order.abi3.so |[.] attend_64",
            "   5.00% |  101:python |libm.so.6            |[.] __expf_fma",
            "   4.00% |  102:python |libgomp.so.1         |[.] 0x000000000001e02a",
            "   3.00% |  101:python |libpython3.11.so.1.0 |[.] _PyEval_EvalFrameDefault",
            "   2.00% |  103:python |libpython3.11.so.1.0 |[.] _PyEval_EvalFrameDefault",
            "   1.00% |  101:python |[kernel.kallsyms]    |[k] schedule",
            "   0.50% |  101:python |_fixed_order.abi3.so |[.] fo_forward._omp_fn.0",
        ]
    )
    assert categorize(report) == {
        "matmuls": 50.1,
        "attention": 12.5,
        "python": 5.0,
        "norms and activations": 5.0,
        "openmp": 4.0,
        "kernel": 1.0,
        "other": 0.5,
    }
    by_thread = categorize(report, loop_thread=101)
    assert by_thread["python: event loop (HTTP)"] == 3.0 and by_thread["python: engine"] == 2.0
