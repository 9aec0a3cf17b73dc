"""Run a probe module once per ISA cap this CPU supports, in subprocesses.

``ONEDNN_MAX_CPU_ISA`` caps oneDNN's kernels and ``ATEN_CPU_CAPABILITY`` ATen's: together they
make one machine compute as a less capable CPU would (an AVX2-only one, say, on an AMX Xeon).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

# oneDNN's ISA caps and the ATen kernel level each implies, lowest first; "" is uncapped
ISA_CAPS = {
    "SSE41": ("default", set()),
    "AVX2": ("avx2", {"avx2", "fma"}),
    "AVX512_CORE": ("avx512", {"avx512f", "avx512bw", "avx512vl", "avx512dq"}),
    "AVX512_CORE_BF16": ("avx512", {"avx512f", "avx512bw", "avx512vl", "avx512_bf16"}),
    "AVX512_CORE_AMX": ("avx512", {"avx512_bf16", "amx_bf16", "amx_int8", "amx_tile"}),
}
CAP_VARIABLES = ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY")
ROOT = Path(__file__).parents[3]


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((x for x in text.splitlines() if x.startswith("flags")), "")
    return set(line.split(":", 1)[-1].split())


def supported_caps() -> list[str]:
    """The caps this CPU can run, lowest first, then "" (uncapped)."""
    flags = cpu_flags()
    return [cap for cap, (_, needs) in ISA_CAPS.items() if needs <= flags] + [""]


def run_under_isa_caps(
    module: str, *args: str, caps: list[str] | None = None, timeout: float = 900
) -> dict[str, dict[str, Any]]:
    """``python -m module args`` under each cap (default: every supported one), side by side; the
    JSON object each run prints, by cap name ("uncapped" for "")."""
    caps = supported_caps() if caps is None else caps
    jobs = [(cap, args) for cap in caps]
    return {
        cap or "uncapped": report
        for (cap, _), report in zip(jobs, run_probes(module, jobs, timeout), strict=True)
    }


def run_probes(
    module: str, jobs: list[tuple[str, tuple[str, ...]]], timeout: float = 900
) -> list[dict[str, Any]]:
    """``python -m module *args`` under ``cap`` for each (cap, args) job, as many at once as there
    are cores, one thread each (the same work on fewer threads: the wall time of one core per
    job instead of every job's waits); the JSON object each prints, in order."""
    workers = max(1, min(len(jobs), os.cpu_count() or 1))
    threads = "1" if len(jobs) > 1 else os.environ.get("OMP_NUM_THREADS", "")

    def run(job: tuple[str, tuple[str, ...]]) -> dict[str, Any]:
        cap, args = job
        env = {k: v for k, v in os.environ.items() if k not in CAP_VARIABLES}
        if threads:
            env["OMP_NUM_THREADS"] = threads
        if cap:
            env.update(ONEDNN_MAX_CPU_ISA=cap, ATEN_CPU_CAPABILITY=ISA_CAPS[cap][0])
        done = subprocess.run(
            [sys.executable, "-m", module, *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        name = " ".join([cap or "uncapped", *args])
        assert done.returncode == 0, f"{name}: {done.stderr[-3000:]}"
        report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        return report

    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(run, jobs))
