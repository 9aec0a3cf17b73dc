"""The one vocabulary of weight precisions: settings, the engine and the nightly job use these
words and no others.

``none`` serves the weights as loaded (fp32 on a CPU, fp16 on CUDA); ``bf16``, ``int8``
(weight-only) and ``w8a8`` (INT8 weights and activations, batch-invariant by construction: see
``docs/engine.md``) convert them when the engine is built; ``gguf`` (CPU) serves a model
converted from a GGUF file from that file's own 4- and 8-bit blocks, bitwise the fp32 model's
results; ``gguf-a8`` (CPU) multiplies those blocks with activations quantized to 8 bits per block
of 32, the arithmetic of llama.cpp's CPU backend: on AVX-512 VNNI 2x gguf's throughput at full
batches (on AVX2 a little above gguf's; without AVX2 several times slower: plain C), still
batch-invariant, not the fp32 model's numbers; ``auto`` is a setting's way of letting the
builder decide for the device and model (``origin/runtime.py``): an engine itself always runs
one of ``ENGINE_QUANTIZATIONS``.
"""

from __future__ import annotations

from typing import Literal, get_args

Quantization = Literal["auto", "none", "bf16", "int8", "w8a8", "gguf", "gguf-a8"]
EngineQuantization = Literal["none", "bf16", "int8", "w8a8", "gguf", "gguf-a8"]
QUANTIZATIONS: tuple[str, ...] = get_args(Quantization)
ENGINE_QUANTIZATIONS: tuple[str, ...] = get_args(EngineQuantization)
# served from a GGUF file's own blocks by the CPU's kernels (origin/engine/gguf_blocks.py)
GGUF_BLOCK_QUANTIZATIONS = ("gguf", "gguf-a8")
