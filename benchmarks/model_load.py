"""Model load time: the embedded GGUF loaded directly by transformers vs edgeqa's cached conversion.

Every origin start and every nightly generation task loads the model, so this is time to first
answer after a deploy. Prints one JSON object:

    {"systems": {"gguf_direct": {"load_s"}, "edgeqa_first": {"load_s"},
                 "edgeqa_cached": {"load_s"}}, "greedy_identical": bool, "answer": str}

Run: .venv/bin/python benchmarks/model_load.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from origin.sampling import SamplingParams

QUESTION = "What is the capital of France?"


def answer(model: Any, tokenizer: Any, question: str, params: SamplingParams) -> str:
    """The answer by the simplest path from a question to its tokens: one ``DynamicCache``,
    ``transformers``' own forward, the origin's chat template and sampling. The tests' reference
    generator's (``tests/origin/reference.py``), restated: a benchmark imports no test code."""
    import torch
    from transformers import DynamicCache

    from origin.chat import chat_messages, encode_chat, eos_token_ids
    from origin.detokenizer import IncrementalDetokenizer
    from origin.sampling import sample_next

    prompt = encode_chat(tokenizer, chat_messages(question))
    stop_ids = eos_token_ids(model, tokenizer)
    generator = None
    if params.seed is not None:
        generator = torch.Generator(device="cpu").manual_seed(params.seed)
    detok = IncrementalDetokenizer(tokenizer)
    cache = DynamicCache(config=model.config)
    input_ids = torch.tensor([prompt], device=model.device)
    deltas = []
    with torch.inference_mode():
        for _ in range(params.max_tokens):
            logits = model(input_ids=input_ids, cache=cache, use_cache=True).logits[0, -1]
            token = sample_next(logits.cpu(), params, generator)
            if token in stop_ids:
                break
            delta = detok.push(token)
            if delta:
                deltas.append(delta)
            input_ids = torch.tensor([[token]], device=model.device)
    return "".join(deltas)


def _timed(fn):  # type: ignore[no-untyped-def]
    started = time.perf_counter()
    result = fn()
    return time.perf_counter() - started, result


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3, help="cached loads to time")
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from origin.model import embedded_gguf_path, load_model
    from origin.sampling import SamplingParams

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    gguf = embedded_gguf_path()

    def load_direct():  # type: ignore[no-untyped-def]
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32
        )
        return model.eval(), tokenizer

    direct_s, (direct_model, direct_tok) = _timed(load_direct)
    params = SamplingParams(max_tokens=48)
    direct_answer = answer(direct_model, direct_tok, QUESTION, params)
    del direct_model

    with tempfile.TemporaryDirectory() as cache:
        first_s, _ = _timed(lambda: load_model("embedded", cache_dir=Path(cache)))
        cached = [
            _timed(lambda: load_model("embedded", cache_dir=Path(cache)))
            for _ in range(args.repeats)
        ]
        model, tokenizer = cached[-1][1]
        cached_answer = answer(model, tokenizer, QUESTION, params)

    print(
        json.dumps(
            {
                "systems": {
                    "gguf_direct": {"load_s": round(direct_s, 3)},
                    "edgeqa_first": {"load_s": round(first_s, 3)},
                    "edgeqa_cached": {
                        "load_s": round(statistics.median(s for s, _ in cached), 3),
                        "repeats": args.repeats,
                    },
                },
                "greedy_identical": direct_answer == cached_answer,
                "answer": cached_answer,
                "torch_threads": torch.get_num_threads(),
            }
        )
    )


if __name__ == "__main__":
    main()
