"""Run by ``test_model.py`` in a subprocess: a Llama-2-7B (its config, no weights) loaded for the
nightly engine on CUDA on a machine without CUDA. Prints one JSON object.

``python -m tests.origin.cuda_load_probe FOLDER``: FOLDER holds the 7B's ``config.json`` and a
tokenizer. CUDA is stood in for by the meta device (shapes and dtypes, no memory): torch reports
CUDA present, a tensor asked for on CUDA is made on meta (``CudaOnMeta``), and transformers'
``from_pretrained`` builds the model from its config where ``device_map`` puts it, in the dtype
asked for (meta for CUDA; host memory otherwise, for real), as it reads each tensor of a
checkpoint. The address space is capped at what the imports took plus ``HEADROOM_BYTES``, so a
load that puts the model in host memory (28 GB in fp32, 13.5 in bf16) fails here rather than
filling the machine.

Reported: what ``from_pretrained`` was asked (dtype, device_map), the bytes copied from host
memory to CUDA and the largest host tensor made while loading and building the engine, the
peak resident memory over the imports (``ru_maxrss``), which projections of the model are still
held anywhere once the engine is built (weak references to each), the weight bytes the runner
serves, and the same for a ``w8a8`` runner (INT8 weights quantized on CUDA) on two layers of the
same width.
"""

from __future__ import annotations

import gc
import json
import resource
import sys
import weakref
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from transformers import AutoConfig, AutoModelForCausalLM, LlamaForCausalLM

from origin.config import EngineSettings
from origin.engine.runner import LlamaRunner, projections
from precompute.generate import nightly_engine

HEADROOM_BYTES = 2 << 30
META = torch.device("meta")


def _is_cuda(device: Any) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    return isinstance(device, str) and device.startswith("cuda")


class CudaOnMeta(TorchFunctionMode):
    """CUDA stood in for by the meta device: a device argument naming CUDA becomes meta; the bytes
    copied from host memory to CUDA and the largest host tensor made are counted."""

    def __init__(self) -> None:
        super().__init__()
        self.to_device_bytes = 0
        self.largest_host_tensor_bytes = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func is torch.device:  # naming CUDA is not putting a tensor there
            return func(*args, **(kwargs or {}))
        name = getattr(func, "__name__", "")
        kwargs = dict(kwargs or {})
        if name == "cuda":
            func, args, kwargs = torch.Tensor.to, (args[0], META), {}
        if _is_cuda(kwargs.get("device")):
            kwargs["device"] = META
        args = tuple(META if _is_cuda(a) else a for a in args)
        to_cuda = any(a is META for a in args) or kwargs.get("device") is META
        source = args[0] if args else None
        if name in ("to", "cuda") and to_cuda and isinstance(source, torch.Tensor):
            if source.device.type == "cpu":
                self.to_device_bytes += source.numel() * source.element_size()
        out = func(*args, **kwargs)
        if isinstance(out, torch.Tensor) and out.device.type == "cpu":
            size = out.numel() * out.element_size()
            self.largest_host_tensor_bytes = max(self.largest_host_tensor_bytes, size)
        return out


class FromPretrained:
    """transformers' ``from_pretrained`` as it places a model: built on the meta device, each
    tensor then in ``dtype`` where ``device_map`` puts it (here: meta for CUDA, else the host).
    Records what it was asked and a weak reference to each projection and LM head it made."""

    def __init__(self) -> None:
        self.asked: list[dict[str, str]] = []
        self.held: list[weakref.ref[torch.Tensor]] = []
        self.layers: int | None = None  # the config's, or this many

    def __call__(self, target: Any, *, dtype: torch.dtype, device_map: Any = None, **_: Any) -> Any:
        self.asked.append({"dtype": str(dtype), "device_map": str(device_map)})
        config = AutoConfig.from_pretrained(target)
        config.num_hidden_layers = self.layers or config.num_hidden_layers
        with torch.device(META if _is_cuda(device_map) else "cpu"):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
        for layer in model.model.layers:
            for modules in projections(layer).values():
                self.held.extend(weakref.ref(module.weight) for module in modules)
        self.held.append(weakref.ref(model.lm_head.weight))
        return model.eval()

    def still_held(self) -> int:
        """How many of the projections and LM heads made are still referenced anywhere."""
        gc.collect()
        return sum(ref() is not None for ref in self.held)


def main(folder: Path) -> dict[str, Any]:
    loads = FromPretrained()
    torch.cuda.is_available = lambda: True  # type: ignore[assignment]
    AutoModelForCausalLM.from_pretrained = loads  # type: ignore[assignment,method-assign]
    # the model reports the device its tensors stand for
    LlamaForCausalLM.device = property(lambda self: torch.device("cuda"))  # type: ignore[assignment,method-assign]
    pages = int(Path("/proc/self/statm").read_text().split()[0])
    limit = pages * resource.getpagesize() + HEADROOM_BYTES
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.RLIM_INFINITY))
    before_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    environ = {"EDGEQA_CACHE_DIR": str(folder.parent / "cache")}
    settings = EngineSettings.from_env(
        environ, model=str(folder), device="cuda", dtype="bfloat16", max_num_seqs=64
    )
    with CudaOnMeta() as cuda:
        engine = nightly_engine(settings, "none")
        runner: Any = engine.runner
        report: dict[str, Any] = {
            "asked": list(loads.asked),
            "model_dtype": str(engine.model.dtype),
            "linear": type(runner.layers[0].qkv).__name__,
            "served_weight_bytes": runner.weight_bytes,
            "kv_cache_bytes": runner.cache.bytes,
            "projections": len(loads.held),
            "projections_held": loads.still_held(),  # the engine (and the model it keeps) alive
        }
        del engine, runner
        # INT8 quantized on CUDA: w8a8's (LLM.int8's needs bitsandbytes' own CUDA kernels)
        loads.layers = 2
        loads.held.clear()
        model = loads(folder, dtype=torch.bfloat16, device_map="cuda")
        w8a8: Any = LlamaRunner(model, 1, 64, "w8a8", batch_invariant=False)
        report["w8a8"] = {
            "linear": type(w8a8.layers[0].qkv).__name__,
            "projections": len(loads.held),
            "projections_held": loads.still_held(),
        }
    report["to_device_bytes"] = cuda.to_device_bytes
    report["largest_host_tensor_bytes"] = cuda.largest_host_tensor_bytes
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    report["peak_rss_growth_bytes"] = (peak_kib - before_kib) * 1024
    return report


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]))))
