"""Where a step's time goes: the engine's own step counters and Linux perf's samples by code.

Two runs of the same workload as ``peers.py`` (``--input-len`` random tokens in the chat template,
``--output-len`` tokens each, ``--ignore-eos``), on the weights ``--precision`` names (``auto``:
the origin's default):

- ``engine``: the engine alone, offline (``generate_many``): ``--prompts`` prompts at once,
  ``--repeat`` times, the batch kept full. ``perf record`` samples the process only while they run
  (a control fifo: loading and warm-up are not counted).
- ``server``: ``edgeqa origin serve`` with ``peers.py``'s settings (every request generated),
  driven by vLLM's serving client at ``--rate`` Poisson requests/s; ``perf record`` samples the
  origin's process, every thread, for the run.

Samples are grouped by the code they land in: ``matmuls`` (the fixed-order GEMMs, the 8-bit
activations' quantization included), ``attention``, ``norms and activations`` (RMSNorm,
SiLU-and-multiply), ``openmp`` (threads waiting for or handing out work), ``torch`` (tensor ops
outside the fused step: sampling, the LM head's argmax, copies), ``tokenizers``, ``python`` (the
interpreter: the scheduler, detokenizing, the outputs; in the server split into the event loop's
thread, the HTTP path, and the others, the engine's), ``kernel`` and ``other``. The engine's
counters (``edgeqa_engine_step_seconds``: schedule, forward, sample, update) say the same by
part of the step.

Prints one JSON object::

  {"config": {...}, "engine": {"output_tok_per_s", "step_seconds": {...}, "perf": {...}},
   "server": {"client": {...peers.py's summary...}, "step_seconds": {...}, "perf": {...}}}

``perf`` shares are percent of the process's samples. Needs Linux ``perf`` (a kernel that lets
a user profile their own processes: ``perf_event_paranoid`` <= 2).

    python benchmarks/step_profile.py [--precision gguf-a8] [--rate 16]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT

sys.path.insert(0, str(ROOT))

# (category, pattern over "dso symbol"), first match wins
CATEGORIES = (
    ("matmuls", r"_fixed_order.*\] (q4_|q8_|q16_|a8_|group|tile|gemm|fo_gemm|q_panel|q_row|panel"
     r"|block_|quantize|w_scalar|epilogue|linear_rows|weight_at|round_even|half_float|q_dequant"
     r"|dot|axpy)"),
    ("attention", r"_fixed_order.*\] (attend|fo_attention|combine)"),
    ("norms and activations", r"(_fixed_order.*\] (norm_row|sum_squares|silu|fo_rms)|expf)"),
    ("openmp", r"libgomp"),
    ("torch", r"libtorch|libc10|libgomp-|mkl|dnnl"),
    ("tokenizers", r"tokenizers"),
    ("python", r"libpython|python3"),
    ("kernel", r"\[k\]"),
)  # fmt: skip
PERF_LINE = re.compile(r"\s*([0-9.]+)%\s*\|\s*(\d+):\S*\s*\|\s*(\S+)\s*\|\s*(\[.\]) (.*)")


def categorize(report: str, loop_thread: int | None = None) -> dict[str, float]:
    """``perf report --sort pid,dso,sym -t '|'`` lines as percent per category; python samples
    on ``loop_thread`` (the server's event loop) apart from the rest."""
    shares: dict[str, float] = {}
    for line in report.splitlines():
        match = PERF_LINE.match(line)
        if not match:
            continue
        percent, thread, dso, kind, symbol = match.groups()
        key = f"{dso} {kind} {symbol.strip()}"
        name = next((n for n, rx in CATEGORIES if re.search(rx, key)), "other")
        if name == "python" and loop_thread is not None:
            name = "python: event loop (HTTP)" if int(thread) == loop_thread else "python: engine"
        shares[name] = shares.get(name, 0.0) + float(percent)
    return {name: round(share, 1) for name, share in sorted(shares.items(), key=lambda s: -s[1])}


def perf_report(data: Path) -> str:
    return subprocess.run(
        ["perf", "report", "-i", str(data), "--no-children", "--sort", "pid,dso,sym",
         "--stdio", "-g", "none", "-t", "|"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip


def engine_part(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """The engine alone in a child process under ``perf record``, recording only while the
    measured batches run."""
    ctl, ack, data = folder / "ctl", folder / "ack", folder / "engine.data"
    os.mkfifo(ctl)
    os.mkfifo(ack)
    env = {**os.environ, "STEP_PROFILE_CTL": str(ctl), "STEP_PROFILE_ACK": str(ack)}
    child = [sys.executable, __file__, "--engine-child", *args.argv]
    done = subprocess.run(
        ["perf", "record", "-q", "-F", "999", "-D", "-1", "--control",
         f"fifo:{ctl},{ack}", "-o", str(data), "--", *child],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    if done.returncode:
        raise RuntimeError(f"perf record failed: {done.stderr[-2000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["perf"] = categorize(perf_report(data))
    return result


def engine_child(args: argparse.Namespace) -> None:
    """In the child: build the engine, warm up, then the measured batches with perf enabled."""
    import random

    from edgeqa.libraries import quiet_libraries
    from origin.chat import prompt_ids
    from origin.config import EngineSettings
    from origin.engine import generate_many
    from origin.runtime import build_engine
    from origin.sampling import SamplingParams

    quiet_libraries()
    settings = EngineSettings.from_env(
        quantization=args.precision, max_num_seqs=args.prompts, max_model_len=512
    )
    engine = build_engine(settings)
    tokenizer, rng = engine.tokenizer, random.Random(0)
    prompts = []
    for _ in range(args.prompts):
        words = [rng.randrange(1000, len(tokenizer) - 1000) for _ in range(args.input_len)]
        prompts.append(prompt_ids(tokenizer, tokenizer.decode(words)))
    params = SamplingParams(max_tokens=args.output_len, ignore_eos=True)
    generate_many(engine, prompts[:2], SamplingParams(max_tokens=4), progress=False)
    before = dict(engine.stats.phase_s)
    control(os.environ.get("STEP_PROFILE_CTL"), os.environ.get("STEP_PROFILE_ACK"), "enable")
    started = time.perf_counter()
    tokens = 0
    for _ in range(args.repeat):
        tokens += sum(
            c.completion_tokens for c in generate_many(engine, prompts, params, progress=False)
        )
    seconds = time.perf_counter() - started
    control(os.environ.get("STEP_PROFILE_CTL"), os.environ.get("STEP_PROFILE_ACK"), "disable")
    steps = {k: round(v - before[k], 3) for k, v in engine.stats.phase_s.items()}
    print(
        json.dumps(
            {
                "precision": engine.config.quantization,
                "output_tok_per_s": round(tokens / seconds, 1),
                "seconds": round(seconds, 3),
                "step_seconds": steps,
            }
        )
    )


def control(ctl: str | None, ack: str | None, command: str) -> None:
    """Tell ``perf record --control`` to start or stop sampling, and wait for its answer."""
    if not ctl or not ack:
        return
    with open(ctl, "w") as out:
        out.write(command + "\n")
    with open(ack) as answer:
        answer.readline()


def server_part(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """The origin behind its HTTP server, driven by vLLM's client at ``--rate``, while perf
    samples its process."""
    import httpx
    from peers import MODEL_NAME, edgeqa_origin, vllm_bench

    from origin.model import load_tokenizer

    tokenizer = folder / "tokenizer"
    load_tokenizer("embedded").save_pretrained(tokenizer)
    bench = argparse.Namespace(**{**vars(args), "prompts": args.server_prompts})
    pids: list[int] = []
    with edgeqa_origin(args.prompts, args.precision, pids) as url:
        pid = pids[0]
        vllm_bench(url, tokenizer, args.rate, argparse.Namespace(**{**vars(bench), "prompts": 4}))

        def steps() -> dict[str, float]:
            text = httpx.get(f"{url}/metrics").text
            found = re.findall(
                rf'edgeqa_engine_step_seconds_total{{model_name="{MODEL_NAME}",phase="(\w+)"}} '
                r"([0-9.e+-]+)",
                text,
            )
            return {phase: float(value) for phase, value in found}

        before = steps()
        data = folder / "server.data"
        perf = subprocess.Popen(
            ["perf", "record", "-q", "-F", "999", "-p", str(pid), "-o", str(data)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        time.sleep(1.0)  # perf attached to every thread
        client: dict[str, Any] = {}
        runner = threading.Thread(
            target=lambda: client.update(vllm_bench(url, tokenizer, args.rate, bench))
        )
        runner.start()
        runner.join()
        perf.send_signal(2)  # SIGINT: perf writes its data and exits
        perf.wait(60)
        after = steps()
    step_seconds = {k: round(after[k] - before.get(k, 0.0), 3) for k in after}
    return {
        "client": client,
        "step_seconds": step_seconds,
        "perf": categorize(perf_report(data), loop_thread=pid),
    }


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--precision", default="auto", help="EDGEQA_QUANTIZATION (default auto)")
    parser.add_argument("--prompts", type=int, default=32, help="at once (engine); slots (both)")
    parser.add_argument("--repeat", type=int, default=3, help="measured batches (engine)")
    parser.add_argument("--server-prompts", type=int, default=64, help="requests (server)")
    parser.add_argument("--rate", type=float, default=16.0, help="Poisson req/s (server)")
    parser.add_argument("--input-len", type=int, default=48)
    parser.add_argument("--output-len", type=int, default=48)
    parser.add_argument("--parts", default="engine,server")
    parser.add_argument("--engine-child", action="store_true", help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    args.argv = argv  # what the engine's child process is started with
    if args.engine_child:
        engine_child(args)
        return
    if shutil.which("perf") is None:
        raise SystemExit("step_profile.py needs Linux perf (apt-get install linux-perf)")
    config = {k: v for k, v in vars(args).items() if k not in ("engine_child", "argv")}
    result: dict[str, Any] = {"config": config}
    with tempfile.TemporaryDirectory() as tmp:
        for part in args.parts.split(","):
            make = {"engine": engine_part, "server": server_part}[part]
            folder = Path(tmp) / part
            folder.mkdir()
            result[part] = make(args, folder)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
