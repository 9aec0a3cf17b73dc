"""On one CUDA GPU: the nightly embedder's throughput, and the edgeqa engine against transformers'
``generate`` in bf16 and in INT8, on the embedded model and on a Llama-2-7B of random weights.

Parts, each recorded on its own (an exception is its ``error``, a part the time budget no longer
allows is ``skipped`` with a note), in this order:

- ``embedder``: the nightly job's wordings through ``encode_chunks`` (the embedder on CUDA:
  sentence-transformers' ``encode`` at batch 256), wordings/s; and ``encode`` at batch 1,024.
- ``bf16``: the embedded model (``origin.model.load_model`` on CUDA: bf16 straight onto the
  device) and a Llama-2-7B built from its config on the device in bf16 (random weights, nothing
  downloaded). Each answers ``--prompts`` prompts (64) at once, greedy, ``--max-new-tokens`` each
  (EOS ignored): the nightly engine (``precompute.generate.nightly_engine``, 64 slots) against
  transformers' ``generate`` on one left-padded batch of the same prompts. Output tokens/s; for
  the 7B also the peak host memory (resident, anonymous, file pages: sampled) and the peak device
  memory (``torch.cuda.max_memory_allocated``) of its build, of its load from a folder through
  ``load_model`` (the model saved first; ``--no-folder`` skips it) and of the engine's build (which
  takes the model's weights over, a layer at a time).
- ``int8``: the same with INT8 weights where bitsandbytes imports: the engine's ``int8`` on CUDA
  (LLM.int8, the weights loaded in fp16 as ``origin.runtime.load_dtype`` asks) against
  transformers' ``generate`` on bitsandbytes' 8-bit model (``load_in_8bit``) of the same folder.

Prints one JSON object:
  {"device", "config", "embedder": {...}, "bf16": {"embedded": {...}, "llama_7b": {...}},
   "int8": {"bitsandbytes", "embedded": {...}, "llama_7b": {...}}, "skipped": [...], "elapsed_s"}

Run: .venv/bin/python benchmarks/gpu.py [--budget-s 420] [--prompts 64] [--max-new-tokens 128]
(within ``--budget-s`` and a few seconds: the part running when it runs out is interrupted, and
the parts left are skipped; 420 s by default, under 8 minutes in all)
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

STARTED = time.monotonic()
# Llama-2-7B's shapes (6.7e9 parameters)
LLAMA_2_7B = {
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
}


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget-s", type=float, default=420.0, help="time for all the parts")
    parser.add_argument("--prompts", type=int, default=64, help="prompts answered at once")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--wordings", type=int, default=50_000, help="texts the embedder encodes")
    parser.add_argument(
        "--no-folder", action="store_true", help="no 7B folder: no load_model, no 8-bit baseline"
    )
    return parser


class OutOfTime(Exception):
    """The budget ran out while a part was running."""


class Budget:
    """The parts' shared time: a part runs only when what it needs is left; an alarm at the
    deadline interrupts the one running (its ``error``), and the rest are skipped."""

    def __init__(self, seconds: float) -> None:
        self.deadline = STARTED + seconds
        self.skipped: list[str] = []

        def out_of_time(signum: int, frame: Any) -> None:
            raise OutOfTime(f"the budget of {seconds:.0f} s ran out")

        signal.signal(signal.SIGALRM, out_of_time)
        signal.setitimer(signal.ITIMER_REAL, max(1.0, self.left()))

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def run(self, name: str, needs_s: float, part: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        if self.left() < needs_s:
            note = f"{name}: {max(0.0, self.left()):.0f} s left, it needs about {needs_s:.0f}"
            self.skipped.append(note)
            return {"skipped": note}
        started = time.monotonic()
        try:
            result = part()
        except Exception as error:  # one part's failure is its result, not the run's end
            frames = traceback.extract_tb(error.__traceback__)[-4:]
            where = [f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in frames]
            result = {"error": f"{type(error).__name__}: {error}", "where": where}
        finally:
            _free_device()
        result["part_s"] = round(time.monotonic() - started, 1)
        return result

    def stop(self) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)


class HostMemory:
    """Peak host memory while a block runs, sampled every 5 ms from ``/proc/self/status``: the
    growth of the resident set, of its anonymous part (copies: a model in host memory) and of its
    file pages (a mapped checkpoint, reclaimable), over their values at the start."""

    FIELDS = ("VmRSS", "RssAnon", "RssFile")

    def __enter__(self) -> HostMemory:
        self.start = self._read()
        self.peak = dict(self.start)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._update()

    def _read(self) -> dict[str, int]:
        values = {}
        for line in Path("/proc/self/status").read_text().splitlines():
            name, _, rest = line.partition(":")
            if name in self.FIELDS:
                values[name] = int(rest.split()[0]) * 1024
        return values

    def _update(self) -> None:
        for name, value in self._read().items():
            self.peak[name] = max(self.peak.get(name, 0), value)

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self._update()

    def report(self) -> dict[str, float]:
        import resource

        growth = {name: self.peak.get(name, 0) - self.start.get(name, 0) for name in self.FIELDS}
        return {
            "host_rss_growth_gb": _gb(growth["VmRSS"]),
            "host_anon_growth_gb": _gb(growth["RssAnon"]),
            "host_file_growth_gb": _gb(growth["RssFile"]),
            "host_peak_rss_gb": _gb(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024),
        }


def _gb(n: float) -> float:
    return round(n / 1e9, 3)


def _free_device() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def _device_peak(since_reset: Callable[[], Any]) -> tuple[Any, dict[str, float]]:
    """``since_reset()``'s result and its seconds, peak device memory and what stays allocated."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    started = time.perf_counter()
    result = since_reset()
    torch.cuda.synchronize()
    return result, {
        "seconds": round(time.perf_counter() - started, 2),
        "device_peak_gb": _gb(torch.cuda.max_memory_allocated()),
        "device_before_gb": _gb(before),
        "device_after_gb": _gb(torch.cuda.memory_allocated()),
    }


# -- the prompts ------------------------------------------------------------------------------


def wordings(n: int) -> list[str]:
    """``n`` distinct wordings of the sample logs' questions (``precompute/samplelogs.py``)."""
    from precompute.samplelogs import INTENTS

    base = [w for intent in INTENTS for w in intent]
    asides = ("", "please", "quick question:", "hi,", "thanks!", "asap")
    return [f"{asides[i % len(asides)]} {base[i % len(base)]} #{i}".strip() for i in range(n)]


def chat_prompts(tokenizer: Any, n: int) -> list[list[int]]:
    """``n`` questions (the sample logs' wordings) as chat prompts' token ids."""
    from origin.chat import chat_messages, encode_chat
    from origin.config import DEFAULT_SYSTEM_PROMPT

    texts = wordings(n)
    return [encode_chat(tokenizer, chat_messages(q, DEFAULT_SYSTEM_PROMPT)) for q in texts]


def random_prompts(lengths: Sequence[int], vocab: int) -> list[list[int]]:
    import torch

    g = torch.Generator().manual_seed(0)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]


# -- the systems ------------------------------------------------------------------------------


def engine_settings(max_new_tokens: int, prompts: int) -> Any:
    from origin.config import EngineSettings

    environ = {"EDGEQA_DEVICE": "cuda", "EDGEQA_MAX_NUM_SEQS": str(prompts)}
    environ["EDGEQA_MAX_TOKENS"] = str(max_new_tokens)
    if os.environ.get("EDGEQA_CACHE_DIR"):
        environ["EDGEQA_CACHE_DIR"] = os.environ["EDGEQA_CACHE_DIR"]
    return EngineSettings.from_env(environ)


def nightly_engine_on(
    model: Any, tokenizer: Any, quantization: str, args: Any
) -> tuple[Any, dict[str, Any]]:
    """The nightly engine on ``model`` (which it takes the weights of), with its build's memory."""
    from precompute.generate import nightly_engine

    settings = engine_settings(args.max_new_tokens, args.prompts)
    engine, build = _device_peak(lambda: nightly_engine(settings, quantization, (model, tokenizer)))
    weights, cache = engine.runner.weight_bytes, engine.runner.cache.bytes
    build["runner_weights_gb"], build["kv_cache_gb"] = _gb(weights), _gb(cache)
    # what the build held beyond the weights served and the cache: the embedding and a layer's
    # copies in flight; the model's weights a second time, were they not released as it goes
    build["peak_beyond_weights_and_cache_gb"] = round(
        build["device_peak_gb"] - _gb(weights + cache), 3
    )
    return engine, build


def engine_rate(engine: Any, prompts: list[list[int]], max_new_tokens: int) -> dict[str, Any]:
    """Every prompt at once through the engine, ``max_new_tokens`` each (EOS ignored)."""
    import torch

    from origin.engine import generate_many
    from origin.sampling import SamplingParams

    generate_many(
        engine, prompts[:2], SamplingParams(max_tokens=4, ignore_eos=True), progress=False
    )
    params = SamplingParams(max_tokens=max_new_tokens, ignore_eos=True)
    torch.cuda.synchronize()
    started = time.perf_counter()
    results = generate_many(engine, prompts, params, progress=False)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    tokens = sum(r.completion_tokens or len(r.token_ids) for r in results)
    errors = sorted({r.error for r in results if r.error})
    rate = {"tokens": tokens, "seconds": round(seconds, 2), "tokens_per_s": round(tokens / seconds)}
    rate["first_tokens"] = [r.token_ids[:16] for r in results]
    return {**rate, "errors": errors} if errors else rate


def generate_rate(model: Any, prompts: list[list[int]], max_new_tokens: int) -> dict[str, Any]:
    """transformers' ``generate`` on one left-padded batch of every prompt, greedy,
    ``max_new_tokens`` each (EOS ignored)."""
    import torch
    from transformers import GenerationConfig

    width = max(len(p) for p in prompts)
    ids = torch.zeros((len(prompts), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt)
        mask[row, width - len(prompt) :] = 1
    ids, mask = ids.to(model.device), mask.to(model.device)

    def config(tokens: int) -> GenerationConfig:
        return GenerationConfig(
            max_new_tokens=tokens,
            min_new_tokens=tokens,
            do_sample=False,
            pad_token_id=0,
            eos_token_id=None,
        )

    with torch.inference_mode():
        model.generate(ids[:2], attention_mask=mask[:2], generation_config=config(4))
        torch.cuda.synchronize()
        started = time.perf_counter()
        out = model.generate(ids, attention_mask=mask, generation_config=config(max_new_tokens))
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    new = out[:, width:]
    tokens = int(new.numel())
    rate = {"tokens": tokens, "seconds": round(seconds, 2), "tokens_per_s": round(tokens / seconds)}
    rate["first_tokens"] = new[:, :16].tolist()
    return rate


def compared(engine: dict[str, Any], generate: dict[str, Any]) -> dict[str, Any]:
    """The two rates side by side: the speedup, and on how many prompts the first 16 greedy
    tokens are the same (their kernels differ: a sanity check, not a bit-exactness one)."""
    ours, theirs = engine.pop("first_tokens"), generate.pop("first_tokens")
    same = sum(a == b for a, b in zip(ours, theirs, strict=True))
    return {
        "edgeqa_engine": engine,
        "transformers_generate": generate,
        "speedup": round(engine["tokens_per_s"] / generate["tokens_per_s"], 2),
        "first_16_tokens_equal": f"{same}/{len(ours)}",
    }


# -- the parts --------------------------------------------------------------------------------


def embedder_part(args: Any) -> dict[str, Any]:
    import numpy as np
    import torch

    from semantic.batch import encode_chunks
    from semantic.loading import load_embedder

    model = load_embedder("embedded", device="cuda")
    texts = wordings(args.wordings)
    list(encode_chunks(model, texts[:1024]))  # warm-up
    torch.cuda.synchronize()
    started = time.perf_counter()
    vectors = np.concatenate(list(encode_chunks(model, texts)))
    seconds = time.perf_counter() - started
    started = time.perf_counter()
    model.encode(texts, batch_size=1024, normalize_embeddings=True, convert_to_numpy=True)
    wide_s = time.perf_counter() - started
    return {
        "wordings": len(texts),
        "dimension": int(vectors.shape[1]),
        "path": "encode_chunks (the nightly job's): encode at batch 256",
        "wordings_per_s": round(len(texts) / seconds),
        "batch_1024_wordings_per_s": round(len(texts) / wide_s),
    }


def cache_dir() -> Path:
    from origin.model import DEFAULT_CACHE_DIR

    return Path(os.environ.get("EDGEQA_CACHE_DIR") or DEFAULT_CACHE_DIR).expanduser()


def embedded_part(args: Any, quantization: str) -> dict[str, Any]:
    """The embedded model loaded as the engine serves it on CUDA (bf16; fp16 for LLM.int8): the
    engine against ``generate`` (for INT8: bitsandbytes' 8-bit model of the same conversion)."""
    from origin.model import load_model, resolve_model_path

    dtype = "float16" if quantization == "int8" else "bfloat16"
    model, tokenizer = load_model("embedded", device="cuda", dtype=dtype, cache_dir=cache_dir())
    prompts = chat_prompts(tokenizer, args.prompts)
    if quantization == "int8":
        folder = resolve_model_path("embedded", cache_dir())
        generate = generate_rate(bnb_8bit(folder), prompts, args.max_new_tokens)
    else:
        generate = generate_rate(model, prompts, args.max_new_tokens)
    _free_device()
    engine, build = nightly_engine_on(model, tokenizer, quantization, args)
    del model
    result = compared(engine_rate(engine, prompts, args.max_new_tokens), generate)
    return {
        "dtype": dtype,
        "prompt_tokens_max": max(map(len, prompts)),
        **result,
        "engine_build": build,
    }


def bnb_8bit(folder: Path) -> Any:
    """bitsandbytes' 8-bit model of ``folder`` on the current CUDA device (transformers)."""
    import torch
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    return AutoModelForCausalLM.from_pretrained(
        folder,
        quantization_config=BitsAndBytesConfig(load_in_8bit=True),
        dtype=torch.float16,
        device_map=torch.device("cuda"),
        local_files_only=True,
    ).eval()


class Llama7B:
    """The 7B's prompts (random token ids, as long as the embedded model's chat prompts), the
    tokenizer its engine detokenizes with, and its folder once saved (``save``)."""

    def __init__(self, args: Any) -> None:
        from origin.model import load_tokenizer

        self.tokenizer = load_tokenizer("embedded", cache_dir())
        lengths = [len(p) for p in chat_prompts(self.tokenizer, args.prompts)]
        self.prompts = random_prompts(lengths, LLAMA_2_7B["vocab_size"])
        self.folder: Path | None = None

    def build(self, dtype: Any) -> tuple[Any, dict[str, Any]]:
        """Built from its config on the device (random weights), with the build's memory."""
        import torch
        from transformers import AutoModelForCausalLM, LlamaConfig

        def on_device() -> Any:
            with torch.device("cuda"):
                return AutoModelForCausalLM.from_config(LlamaConfig(**LLAMA_2_7B), dtype=dtype)

        with HostMemory() as host:
            model, build = _device_peak(on_device)
        return model.eval(), {**build, **host.report()}

    def save(self, model: Any) -> float:
        """``model`` and the embedded tokenizer (a chat template) as a folder; the seconds."""
        started = time.perf_counter()
        self.folder = Path(tempfile.mkdtemp(prefix="edgeqa-llama-7b-"))
        model.save_pretrained(self.folder)
        self.tokenizer.save_pretrained(self.folder)
        return round(time.perf_counter() - started, 1)

    def load(self, dtype: str) -> tuple[Any, dict[str, Any]]:
        """The saved folder through ``origin.model.load_model`` on CUDA, with the load's memory."""
        from origin.model import load_model

        with HostMemory() as host:
            (model, _), load = _device_peak(
                lambda: load_model(str(self.folder), device="cuda", dtype=dtype)
            )
        return model, {**load, **host.report()}

    def remove(self) -> None:
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)


def llama_7b_bf16(args: Any, llama: Llama7B, budget: Budget) -> dict[str, Any]:
    import torch

    model, build = llama.build(torch.bfloat16)
    result: dict[str, Any] = {"build_on_device": build}
    generate = generate_rate(model, llama.prompts, args.max_new_tokens)
    if args.no_folder or budget.left() < 180:
        result["load_from_folder"] = {"skipped": "--no-folder, or under 180 s left"}
    else:
        result["save_s"] = llama.save(model)
        del model
        _free_device()
        model, result["load_from_folder"] = llama.load("bfloat16")
    engine, result["engine_build"] = nightly_engine_on(model, llama.tokenizer, "none", args)
    del model
    rate = engine_rate(engine, llama.prompts, args.max_new_tokens)
    return {**result, **compared(rate, generate)}


def llama_7b_int8(args: Any, llama: Llama7B) -> dict[str, Any]:
    import torch

    result: dict[str, Any] = {}
    if llama.folder is not None:
        model, result["load_from_folder"] = llama.load("float16")
    else:
        model, result["build_on_device"] = llama.build(torch.float16)
    engine, result["engine_build"] = nightly_engine_on(model, llama.tokenizer, "int8", args)
    del model
    rate = engine_rate(engine, llama.prompts, args.max_new_tokens)
    del engine
    _free_device()
    if llama.folder is None:
        return {**result, "edgeqa_engine": rate, "transformers_generate": {"skipped": "no folder"}}
    generate = generate_rate(bnb_8bit(llama.folder), llama.prompts, args.max_new_tokens)
    return {**result, **compared(rate, generate)}


def bitsandbytes_version() -> str | None:
    """bitsandbytes' version, or None where it does not import (the reason in ``why``)."""
    try:
        import bitsandbytes
    except Exception as error:  # not installed, or its CUDA library does not load
        bitsandbytes_version.why = f"{type(error).__name__}: {error}"  # type: ignore[attr-defined]
        return None
    return str(bitsandbytes.__version__)


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    budget = Budget(args.budget_s)
    report: dict[str, Any] = {"config": {**vars(args), "llama_7b": LLAMA_2_7B}}
    llamas: list[Llama7B] = []  # made by the first 7B part, used by the next

    def llama() -> Llama7B:
        if not llamas:
            llamas.append(Llama7B(args))
        return llamas[0]

    try:
        import torch
        import transformers
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
        cuda = torch.cuda.is_available()
        report["device"] = {
            "name": torch.cuda.get_device_name() if cuda else None,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        }
        if not cuda:
            raise RuntimeError("no CUDA device: this benchmark runs on a GPU")
        report["embedder"] = budget.run("embedder", 30, lambda: embedder_part(args))
        bf16 = report["bf16"] = {}
        bf16["embedded"] = budget.run("bf16 embedded", 45, lambda: embedded_part(args, "none"))
        bf16["llama_7b"] = budget.run(
            "bf16 llama_7b", 75, lambda: llama_7b_bf16(args, llama(), budget)
        )
        version = bitsandbytes_version()
        int8 = report["int8"] = {"bitsandbytes": version or "not installed"}
        if version is None:
            int8["why"] = bitsandbytes_version.why  # type: ignore[attr-defined]
        else:
            int8["embedded"] = budget.run("int8 embedded", 45, lambda: embedded_part(args, "int8"))
            int8["llama_7b"] = budget.run("int8 llama_7b", 90, lambda: llama_7b_int8(args, llama()))
    except Exception as error:  # the run's own failure: what was measured is still printed
        report["error"] = f"{type(error).__name__}: {error}"
    finally:
        budget.stop()
        for made in llamas:
            made.remove()
        report["skipped"] = budget.skipped
        report["elapsed_s"] = round(time.monotonic() - STARTED, 1)
        print(json.dumps(report))


if __name__ == "__main__":
    main()
