"""The one vocabulary of weight precisions: settings, the engine and the nightly job use these
words and no others.

``none`` serves the weights as loaded (fp32 on a CPU, fp16 on CUDA); ``bf16`` and ``int8`` convert
them when the engine is built; ``auto`` is a setting's way of letting the builder decide for the
device (``origin/runtime.py``): an engine itself always runs one of ``ENGINE_QUANTIZATIONS``.
"""

from __future__ import annotations

from typing import Literal, get_args

Quantization = Literal["auto", "none", "bf16", "int8"]
EngineQuantization = Literal["none", "bf16", "int8"]
QUANTIZATIONS: tuple[str, ...] = get_args(Quantization)
ENGINE_QUANTIZATIONS: tuple[str, ...] = get_args(EngineQuantization)
