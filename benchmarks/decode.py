"""Batch-1 decode speed and greedy agreement with fp32, side by side.

Systems: ``llama.cpp`` (``llama-bench`` on the same GGUF file and threads, when a binary is there:
``benchmarks/_llama_cpp.py``), ``transformers generate (fp32)`` (the model as loaded,
``model.generate``), and the edgeqa engine on the GGUF file's own blocks (``gguf``, the fp32
model's arithmetic; ``gguf-a8``: with 8-bit activations, as llama.cpp computes, the CPU default
where they run in SIMD) and with fp32, bf16 and int8
weights, each batch-invariant (the default: fixed-order kernels) and with the library kernels
(``batch_invariant=False``). Each generates the same number of tokens (EOS ignored) for the same
prompts (real questions from NQ-open), one request at a time.

``tok_per_s`` is the decode rate, what ``llama-bench`` reports as ``tg``: tokens after the first
over the time after the first (the prompt's prefill excluded); ``with_prefill_tok_per_s`` counts
the prefill in, as a user waiting for a whole answer does.

Agreement is teacher-forced: the fp32 transformers model's greedy continuation is fed to each
system token by token through its own decode path, and agreement is the fraction of positions where
the system's argmax equals the fp32 token. The bandwidth bound is the measured memory read
bandwidth divided by the weight bytes one decode step must read (every layer weight and the LM
head; one embedding row).

Prints one JSON object:
  {"systems": {"<name>": {"tok_per_s", "with_prefill_tok_per_s", "agreement", "weight_mb"}},
   "invariant_over_library_tok_per_s": {"fp32", "bf16", "int8"} (the cost of invariance: < 1),
   "bandwidth_bound_tok_per_s": {"fp32", "bf16", "int8"}, "memory_bandwidth_gb_s", "config"}

Run: .venv/bin/python benchmarks/decode.py [--quick] [--build-llama-cpp]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _llama_cpp
from _common import nq_questions

if TYPE_CHECKING:
    from collections.abc import Sequence

    from origin.engine import Engine


def memory_bandwidth_gb_s(megabytes: int = 1024) -> float:
    """Read bandwidth: a sum over a buffer much larger than the caches, best of 5."""
    import torch

    buffer = torch.ones(megabytes * (1 << 20) // 4, dtype=torch.float32)
    buffer.sum()
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        buffer.sum()
        best = min(best, time.perf_counter() - started)
    return buffer.numel() * 4 / best / 1e9


def _rates(run, prompts: list[list[int]], n: int) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """Decode rate (tokens after the first over the time after the first, as llama-bench's tg)
    and the rate with the prefill counted in, for ``run(ids, tokens)`` generating ``tokens``."""
    run(prompts[0], n)  # warm-up
    whole = first = 0.0
    for ids in prompts:
        started = time.perf_counter()
        run(ids, 1)
        first += time.perf_counter() - started
        started = time.perf_counter()
        run(ids, n)
        whole += time.perf_counter() - started
    return {
        "tok_per_s": round((n - 1) * len(prompts) / max(whole - first, 1e-9), 2),
        "with_prefill_tok_per_s": round(n * len(prompts) / whole, 2),
    }


def hf_generate_rates(model, prompts: list[list[int]], n: int) -> dict[str, float]:  # type: ignore[no-untyped-def]
    import torch
    from transformers import GenerationConfig

    def run(ids: list[int], tokens: int) -> None:
        config = GenerationConfig(
            max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, pad_token_id=0,
            eos_token_id=None,
        )  # fmt: skip
        with torch.inference_mode():
            model.generate(torch.tensor([ids]), generation_config=config)

    return _rates(run, prompts, n)


def engine_rates(engine: Engine, prompts: list[list[int]], n: int) -> dict[str, float]:
    from origin.engine import generate_many
    from origin.sampling import SamplingParams

    def run(ids: list[int], tokens: int) -> None:
        params = SamplingParams(max_tokens=tokens, ignore_eos=True)
        generate_many(engine, [ids], params, progress=False)

    return _rates(run, prompts, n)


def reference_continuations(model, prompts: list[list[int]], n: int) -> list[list[int]]:  # type: ignore[no-untyped-def]
    import torch
    from transformers import GenerationConfig

    config = GenerationConfig(max_new_tokens=n, do_sample=False, pad_token_id=0)
    out = []
    with torch.inference_mode():
        for ids in prompts:
            generated = model.generate(torch.tensor([ids]), generation_config=config)[0]
            out.append(generated[len(ids) :].tolist())
    return out


def teacher_forced_agreement(
    engine: Engine, prompts: list[list[int]], references: list[list[int]]
) -> float:
    """Fraction of reference positions where the engine's decode-path argmax agrees."""
    from origin.engine.runner import Segment

    runner = engine.runner
    slot = runner.cache.allocate()
    agree = total = 0
    try:
        for ids, ref in zip(prompts, references, strict=True):
            logits = runner.forward([Segment(slot, ids, 0)])[0][-1]
            position = len(ids)
            for token in ref:
                agree += int(int(logits.argmax()) == token)
                total += 1
                logits = runner.forward([Segment(slot, [token], position)])[0][-1]
                position += 1
    finally:
        runner.cache.free(slot)
    return agree / max(total, 1)


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="4 prompts x 32 tokens (< 5 min)")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument(
        "--build-llama-cpp", action="store_true", help="build llama.cpp first if none is found"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    import torch
    from transformers.utils import logging as hf_logging

    from origin.chat import encode_chat
    from origin.engine import Engine, EngineConfig
    from origin.model import embedded_gguf_path, load_model
    from origin.precision import Backend, lookup

    if args.quick:
        args.prompts, args.tokens = 4, 32
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    if args.build_llama_cpp and _llama_cpp.binary("llama-bench") is None:
        _llama_cpp.build()

    model, tokenizer = load_model("embedded", device="cpu", dtype="float32")
    questions = nq_questions(args.prompts, seed=1)
    prompts = [encode_chat(tokenizer, [{"role": "user", "content": q}]) for q in questions]
    references = reference_continuations(model, prompts, args.tokens)
    threads = torch.get_num_threads()

    systems: dict[str, dict[str, float | None]] = {}
    if _llama_cpp.binary("llama-bench") is not None:
        # the same file, threads and number of generated tokens; its agreement is not measured
        rates = _llama_cpp.bench(embedded_gguf_path(), threads, args.tokens)
        systems["llama.cpp"] = {
            "tok_per_s": rates["decode_tok_per_s"], "agreement": None,
            "weight_mb": round(embedded_gguf_path().stat().st_size / 1e6, 1),
        }  # fmt: skip
    systems["transformers generate (fp32)"] = {
        **hf_generate_rates(model, prompts, args.tokens),
        "agreement": 1.0,
        "weight_mb": round(sum(p.numel() * 4 for p in model.parameters()) / 1e6, 1),
    }
    weight_bytes = {}
    invariance_cost = {}
    precisions = (
        ("gguf", "gguf"), ("gguf-a8", "gguf-a8"), ("fp32", "none"), ("bf16", "bf16"),
        ("int8", "int8"),
    )  # fmt: skip
    for name, quantization in precisions:
        # batch-invariant (the default: fixed-order kernels) and the library kernels beside it
        # (GGUF blocks are read by the fixed-order kernels only)
        blocks = Backend.CPU_LIBRARY not in lookup(quantization).linears
        for invariant in (True,) if blocks else (True, False):
            config = EngineConfig(
                max_num_seqs=1,
                max_model_len=1024,
                quantization=quantization,  # type: ignore[arg-type]
                batch_invariant=invariant,
                # each prompt runs twice (1 token, then all): shared, the second would skip the
                # prefill that the decode rate takes out (llama-bench's tg computes its own)
                prefix_caching=False,
            )
            engine = Engine(model, tokenizer, config)
            label = f"edgeqa {name}" + ("" if invariant else " (library kernels, not invariant)")
            if invariant:
                weight_bytes[name] = engine.runner.weight_bytes
            systems[label] = {
                **engine_rates(engine, prompts, args.tokens),
                "agreement": round(teacher_forced_agreement(engine, prompts, references), 4),
                "weight_mb": round(engine.runner.weight_bytes / 1e6, 1),
            }
            del engine
        if not blocks:
            library = systems[f"edgeqa {name} (library kernels, not invariant)"]["tok_per_s"]
            # > 1: batch invariance costs nothing here, it is faster
            invariance_cost[name] = round(systems[f"edgeqa {name}"]["tok_per_s"] / library, 2)  # type: ignore[operator]

    bandwidth = memory_bandwidth_gb_s()
    baseline = systems["transformers generate (fp32)"]["tok_per_s"]
    print(
        json.dumps(
            {
                "config": {
                    "prompts": args.prompts,
                    "new_tokens": args.tokens,
                    "threads": threads,
                    "torch": torch.__version__,
                },
                "systems": systems,
                "speedup_vs_transformers": {
                    name: round(s["tok_per_s"] / baseline, 2)  # type: ignore[operator]
                    for name, s in systems.items()
                },
                "invariant_over_library_tok_per_s": invariance_cost,
                "memory_bandwidth_gb_s": round(bandwidth, 1),
                "bandwidth_bound_tok_per_s": {
                    name: round(bandwidth * 1e9 / b, 1) for name, b in weight_bytes.items()
                },
            }
        )
    )


if __name__ == "__main__":
    main()
