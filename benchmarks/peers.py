"""edgeqa's origin against llama.cpp's server under the same load, with vLLM's serving client.

Both serve the same GGUF file (the embedded SmolLM2 Q4_1) on the same threads, one at a time on
an otherwise idle machine: ``llama-server -t <threads> -np <slots> -c <slots x 512>`` (binary
from ``LLAMA_SERVER`` or the cached build: ``benchmarks/_llama_cpp.py``) and ``edgeqa origin
serve`` with ``EDGEQA_ORIGIN_TIERS=0`` (every request generated) and
``EDGEQA_MAX_NUM_SEQS=<slots>``: the same number of sequences in flight; edgeqa with
``EDGEQA_QUANTIZATION`` from ``--precisions`` (the first, ``auto``, is the origin's default: on
a CPU whose 8-bit dot products run in SIMD ``gguf-a8``, the GGUF's blocks times 8-bit
activations as llama.cpp computes; the second, ``gguf``, the fp32 model's arithmetic). Each
runs as shipped: ``edgeqa origin serve`` sets libgomp's ``GOMP_SPINCOUNT`` itself
(``edgeqa/libraries.py``), and llama-server, also on libgomp, runs without it (its own
default, ``_llama_cpp.environment``), as a user would start it. Each is
driven by vLLM's ``benchmark_serving.py`` (vendored, unchanged:
``tests/third_party/vllm_benchmarks``) on its random dataset (the same prompts for both: one
seed), through the OpenAI chat endpoint with ``--ignore-eos``, at each Poisson rate of
``--rates``: at 2 req/s edgeqa serves what arrives (~96 tok/s: no server can do 2x there), 8 is
above llama-server's saturation (~3-4 req/s) and near edgeqa's, 16 above both.

Prints one JSON object::

  {"config": {...}, "rates": {"<rate>": {"offered_tok_per_s": rate x output_len, "systems":
   {"edgeqa": {...}, "llama.cpp": {...}, "edgeqa gguf": {...}},
   "edgeqa_over_llama_cpp_tok_per_s": x, "edgeqa_p99_ttft_over_llama_cpp": y}}}

with, per system: ``output_tok_per_s``, ``ttft_ms: {mean, p99}``, ``tpot_ms: {mean, p99}``,
``completed``, ``errors``.

Run: .venv/bin/python benchmarks/peers.py [--quick] [--build-llama-cpp]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _llama_cpp
from _common import ROOT
from http_serving import start_origin

VLLM_CLIENT = ROOT / "tests" / "third_party" / "vllm_benchmarks"
MODEL_NAME = "SmolLM2-135M-Instruct"  # the name the origin serves the embedded model under


def _healthy(url: str, child: subprocess.Popen[str], timeout: float = 300) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if child.poll() is not None:
            raise RuntimeError(f"{url}: the server exited ({child.returncode})")
        try:
            if httpx.get(f"{url}/health").status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{url} did not become healthy in {timeout} s")


@contextmanager
def llama_server(threads: int, slots: int) -> Iterator[str]:
    from edgeqa.local import free_port
    from origin.model import embedded_gguf_path

    path = _llama_cpp.binary("llama-server")
    if path is None:
        raise FileNotFoundError("no llama-server: set LLAMA_SERVER or pass --build-llama-cpp")
    port = free_port()
    cmd = [
        str(path), "-m", str(embedded_gguf_path()), "-t", str(threads), "-np", str(slots),
        "-c", str(slots * 512), "--host", "127.0.0.1", "--port", str(port), "-a", MODEL_NAME,
    ]  # fmt: skip
    child = subprocess.Popen(
        cmd, env=_llama_cpp.environment(path), stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        _healthy(url, child)
        yield url
    finally:
        child.terminate()
        child.wait(60)


@contextmanager
def edgeqa_origin(slots: int, precision: str, pids: list[int] | None = None) -> Iterator[str]:
    """``edgeqa origin serve`` with every request generated; ``pids`` gets its process id."""
    from edgeqa.local import free_port

    port = free_port()
    with tempfile.TemporaryDirectory() as store:
        env = {
            "EDGEQA_STORE": store, "EDGEQA_ORIGIN_TIERS": "0", "EDGEQA_MAX_NUM_SEQS": str(slots),
            "EDGEQA_QUANTIZATION": precision,
            "EDGEQA_MAX_MODEL_LEN": "512", "EDGEQA_MAX_QUEUED_REQUESTS": "1024",
            "EDGEQA_MAX_QUEUED_TOKENS": "1000000", "EDGEQA_MAX_TOKENIZE_QUEUE": "1024",
        }  # fmt: skip
        child = start_origin(None, port, env)
        if pids is not None:
            pids.append(child.pid)
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            child.terminate()
            child.wait(60)


def vllm_bench(url: str, tokenizer: Path, rate: float, args: argparse.Namespace) -> dict:  # type: ignore[type-arg]
    """One run of vLLM's client; the summary in this benchmark's shape."""
    with tempfile.TemporaryDirectory() as out:
        cmd = [
            sys.executable, "benchmark_serving.py", "--backend", "openai-chat", "--base-url", url,
            "--endpoint", "/v1/chat/completions", "--model", MODEL_NAME, "--tokenizer",
            str(tokenizer), "--dataset-name", "random", "--random-input-len", str(args.input_len),
            "--random-output-len", str(args.output_len), "--num-prompts", str(args.prompts),
            "--request-rate", str(rate), "--seed", "0", "--ignore-eos", "--percentile-metrics",
            "ttft,tpot,itl", "--metric-percentiles", "50,99", "--save-result", "--result-dir", out,
            "--result-filename", "result.json",
        ]  # fmt: skip
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        done = subprocess.run(
            cmd, cwd=VLLM_CLIENT, capture_output=True, text=True, env=env, check=False
        )
        if done.returncode:
            raise RuntimeError(f"benchmark_serving.py failed: {done.stderr[-2000:]}")
        report = json.loads((Path(out) / "result.json").read_text())
    return {
        "output_tok_per_s": round(report["output_throughput"], 1),
        "ttft_ms": {
            "mean": round(report["mean_ttft_ms"], 1),
            "p99": round(report["p99_ttft_ms"], 1),
        },
        "tpot_ms": {
            "mean": round(report["mean_tpot_ms"], 1),
            "p99": round(report["p99_tpot_ms"], 1),
        },
        "completed": report["completed"],
        "errors": args.prompts - report["completed"],
    }


def auto_precision() -> str:
    """What ``EDGEQA_QUANTIZATION=auto`` serves the embedded model with on this machine."""
    from origin.model import load_engine_model
    from origin.runtime import auto_quantization

    model, _ = load_engine_model("embedded", "cpu", "auto")
    return auto_quantization("cpu", model, 512)


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="32 prompts per rate (default 64)")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--rates", default="2,8,16", help="Poisson request rates (req/s)")
    parser.add_argument("--input-len", type=int, default=48)
    parser.add_argument("--output-len", type=int, default=48)
    parser.add_argument("--slots", type=int, default=32, help="-np and EDGEQA_MAX_NUM_SEQS")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument(
        "--precisions", default="auto,gguf",
        help="edgeqa's weights (EDGEQA_QUANTIZATION): the first is the 'edgeqa' row, others "
        "'edgeqa <precision>'; auto: the origin's default (config.auto says what it chose)",
    )  # fmt: skip
    parser.add_argument("--build-llama-cpp", action="store_true")
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    from edgeqa.libraries import OPENMP_SPIN
    from origin.model import load_tokenizer

    if args.quick:
        args.prompts = 32
    if args.build_llama_cpp and _llama_cpp.binary("llama-server") is None:
        _llama_cpp.build()
    rates = [float(r) for r in args.rates.split(",")]
    precisions = args.precisions.split(",")
    servers: dict[str, Callable[[], contextmanager]] = {  # type: ignore[type-arg]
        "llama.cpp": lambda: llama_server(args.threads, args.slots),
        **{
            "edgeqa" if i == 0 else f"edgeqa {precision}": (
                lambda precision=precision: edgeqa_origin(args.slots, precision)
            )
            for i, precision in enumerate(precisions)
        },
    }
    results: dict[str, dict[str, dict]] = {str(r): {} for r in rates}  # type: ignore[type-arg]
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = Path(tmp) / "tokenizer"
        load_tokenizer("embedded").save_pretrained(tokenizer)
        for name, server in servers.items():
            with server() as url:
                vllm_bench(
                    url, tokenizer, rates[0], argparse.Namespace(**{**vars(args), "prompts": 4})
                )
                for rate in rates:  # after a warm-up
                    results[str(rate)][name] = vllm_bench(url, tokenizer, rate, args)
    print(
        json.dumps(
            {
                "config": {
                    **{k: v for k, v in vars(args).items() if k != "build_llama_cpp"},
                    "edgeqa_gomp_spincount": os.environ.get("GOMP_SPINCOUNT", OPENMP_SPIN),
                    "auto": auto_precision() if "auto" in precisions else None,
                },
                "rates": {
                    rate: {
                        # what arrives: no server outputs more than this for long at this rate
                        "offered_tok_per_s": float(rate) * args.output_len,
                        "systems": row,
                        "edgeqa_over_llama_cpp_tok_per_s": round(
                            row["edgeqa"]["output_tok_per_s"]
                            / max(row["llama.cpp"]["output_tok_per_s"], 1e-9),
                            2,
                        ),
                        "edgeqa_p99_ttft_over_llama_cpp": round(
                            row["edgeqa"]["ttft_ms"]["p99"]
                            / max(row["llama.cpp"]["ttft_ms"]["p99"], 1e-9),
                            2,
                        ),
                    }
                    for rate, row in results.items()
                },
            }
        )
    )


if __name__ == "__main__":
    main()
