"""Run by ``test_invariance.py`` in a subprocess under one ISA cap: does a greedy request get the
same tokens whatever else the engine is doing? Prints one JSON object: the ISA torch picked and,
per precision, the checks and a digest of the reference tokens (equal digests across caps: the
same answer on every CPU).

``python -m tests.origin.engine.invariance_probe QUANTIZATION[,QUANTIZATION...] [--spec]``: per
precision, the plain engine one request at a time is the reference; it is compared with batches of
3 and 8, a mix where a long prompt is prefilled in small chunks between the others' decode steps,
a KV cache so small that requests are preempted and recomputed, and (``--spec``) every
speculative method one request at a time (where speculation runs: batch 1). ``--quick``: only the
mix, smaller (a batch of 5 whose long prompt is chunk-prefilled while the 4 others decode).
"""

from __future__ import annotations

import hashlib
import json
import sys

import torch

from origin.config import EngineSettings
from origin.engine import Engine, EngineConfig, generate_many, kernels, seed_answers
from origin.engine.runner import make_runner
from origin.model import load_engine_model
from origin.precision import WeightFormat, lookup
from origin.sampling import SamplingParams

QUESTIONS = [
    "What is the capital of France?",
    "How many legs does a spider have?",
    "Explain what photosynthesis is.",
    "Who wrote the play Hamlet?",
    "Why is the sky blue?",
    "What is the boiling point of water at sea level?",
    "Name three primary colors.",
    "How do vaccines work?",
]
LONG = "Summarize in one sentence: " + " ".join(
    f"Step {i}: the river carries sand from the mountains to the sea, slowly." for i in range(30)
)
PARAMS = SamplingParams(max_tokens=20)
# gguf-a8 on a CPU without AVX2: its dot products in plain C, ~10x slower per token; the mix's
# long prompt is still chunk-prefilled among the others' decodes, over fewer of them
SLOW_PARAMS = SamplingParams(max_tokens=8)
SLOTS, MAX_LEN = 8, 1024
QUICK = 4  # the questions beside the long prompt in the quick check's mix


def check(
    model, tokenizer, quantization: str, spec: bool, quick: bool
) -> tuple[dict[str, bool], str, bool]:  # type: ignore[no-untyped-def]
    """(checks, digest of the reference tokens, whether the runner is batch-invariant)."""
    base = {"max_num_seqs": SLOTS, "max_model_len": MAX_LEN, "quantization": quantization}
    runner = make_runner(model, SLOTS, MAX_LEN, quantization, tokenizer)

    def engine(**options: object) -> Engine:  # one runner (its packed weights) for every engine
        draft = (model, tokenizer) if options.get("speculative") == "draft" else None
        config = EngineConfig(**{**base, **options})  # type: ignore[arg-type]
        return Engine(model, tokenizer, config, runner=runner, draft=draft)

    a8 = lookup(quantization).weights is WeightFormat.GGUF_BLOCKS_A8
    slow = a8 and kernels.a8_path() == "c"
    params = SLOW_PARAMS if slow else PARAMS

    def tokens(eng: Engine, prompts: list[str]) -> list[list[int]]:
        return [c.token_ids for c in generate_many(eng, prompts, params, progress=False)]

    # the quick check's mix: the long prompt among QUICK others (the full one: all eight)
    questions = QUESTIONS[:QUICK] if quick else QUESTIONS
    n = len(questions)
    plain = engine()
    alone = [tokens(plain, [q])[0] for q in [*questions, LONG]]
    chunked = engine(prefill_chunk=16, token_budget=24)
    checks = {
        "long prompt chunk-prefilled among decodes": tokens(chunked, [LONG, *questions])
        == [alone[n], *alone[:n]],
    }
    if not quick:
        checks["batch of 8"] = tokens(plain, QUESTIONS) == alone[:8]
        checks["batches of 3"] = [
            t for i in (0, 3, 6) for t in tokens(plain, QUESTIONS[i : i + 3])
        ] == alone[:8]
        small = engine(max_model_len=160, kv_cache_tokens=200, token_budget=64)
        checks["preempted and recomputed"] = tokens(small, QUESTIONS) == alone[:8]
        checks["preemptions happened"] = small.stats.preemptions > 0
    for method in ("ngram", "suffix", "draft") if spec else ():
        eng = engine(speculative=method)
        if method == "suffix":  # answers it has seen, as a release seeds them
            seed_answers(eng, [tokenizer.decode(t) for t in alone[:4]], QUESTIONS[:4])
        one_at_a_time = [tokens(eng, [q])[0] for q in QUESTIONS[:4]]
        checks[f"{method}: speculation one at a time"] = one_at_a_time == alone[:4]
        checks[f"{method}: tokens accepted"] = eng.spec_metrics()["num_accepted_tokens"] > 0
    # of the answers every mode makes: quick and full digests compare (gguf's with fp32's)
    digest = hashlib.sha256(json.dumps([*alone[:QUICK], alone[n]]).encode()).hexdigest()
    return checks, digest, bool(getattr(runner, "batch_invariant", False))


def main() -> None:
    quantizations, spec, quick = sys.argv[1].split(","), "--spec" in sys.argv, "--quick" in sys.argv
    # EDGEQA_CACHE_DIR: the test session's cache (its conversion and INT8 scales), not the user's
    model, tokenizer = load_engine_model(
        "embedded", "cpu", "auto", EngineSettings.from_env().cache_dir
    )
    report: dict[str, object] = {"aten_capability": torch.backends.cpu.get_cpu_capability()}
    for quantization in quantizations:
        checks, digest, invariant = check(model, tokenizer, quantization, spec, quick)
        report[quantization] = {"checks": checks, "digest": digest, "batch_invariant": invariant}
    print(json.dumps(report))


if __name__ == "__main__":
    main()
