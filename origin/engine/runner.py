"""Model runners: execute one engine step (a batch of token segments) against the slot KV cache.

``LlamaRunner`` is a lean forward for the Llama family (Llama, Mistral, Qwen2, SmolLM2) in plain
PyTorch: fused QKV and gate/up weights stored [in, out], one GEMM per weight for every token of the
step (prefill chunks and decode tokens together), batched decode attention over the slot cache, and
weights in any precision of the registry (``origin/precision.py``: its entry says how they are
built and which forward path a step takes). It matches transformers' logits (tests compare them).
On CUDA it takes the model's weights over: each layer's projections are released from the model
as soon as the runner's own linears are built from them, so the device never holds a layer's
weights twice (a 7B in bf16 is 13.5 GB of a 24 GB A10G); the model it was given keeps its
embedding and norms (the runner reads those in place) and no longer runs its own forward.
``HFRunner`` runs any other causal LM through its own forward with one transformers cache per
slot: correct, not fast.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, overload

import torch

from origin.engine import kernels
from origin.engine.attention import AttentionPlan
from origin.engine.kv_cache import Segment, SlotKVCache
from origin.engine.linear import Linear, make_linear, quantize_per_channel_int8
from origin.engine.ops import rms_norm, rope_table, rotate, silu_mul
from origin.model_folder import ModelFolder
from origin.precision import (
    Backend,
    ForwardPath,
    Precision,
    WeightFormat,
    invariant_precisions,
    lookup,
)

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

LLAMA_FAMILY = ("llama", "mistral", "qwen2")


class Runner(Protocol):
    cache: SlotKVCache
    device: torch.device

    def forward(self, segments: list[Segment]) -> list[torch.Tensor]:
        """Logits ([n, vocab], float32) per segment, n = 1 or ``num_tokens``."""
        ...

    def release(self, slot: int) -> None:
        """Drop what is held for ``slot``: its request has left it (the scheduler says so)."""
        ...

    @property
    def weight_bytes(self) -> int: ...


def unsupported_reason(model: PreTrainedModel, max_len: int) -> str | None:
    """Why ``LlamaRunner`` cannot run this model, or None when it can."""
    config = model.config
    if config.model_type not in LLAMA_FAMILY:
        return f"model_type {config.model_type!r} is not one of {LLAMA_FAMILY}"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"hidden_act {config.hidden_act!r} is not silu"
    window = getattr(config, "sliding_window", None)
    if window and getattr(config, "use_sliding_window", True) and max_len > window:
        return f"sliding_window {window} is shorter than max_len {max_len}"
    if getattr(config, "pretraining_tp", 1) not in (None, 1):
        return "pretraining_tp > 1 is not supported"
    return None


# a decoder layer's weights [out, in] and biases as the runner multiplies them, by linear
Fused = dict[str, tuple[torch.Tensor, torch.Tensor | None]]


def projections(layer: Any) -> dict[str, tuple[Any, ...]]:
    """A decoder layer's projection modules by the runner's linear they make: q, k and v one,
    gate and up one."""
    attn, mlp = layer.self_attn, layer.mlp
    return {
        "qkv": (attn.q_proj, attn.k_proj, attn.v_proj),
        "o": (attn.o_proj,),
        "gate_up": (mlp.gate_proj, mlp.up_proj),
        "down": (mlp.down_proj,),
    }


def fused_projections(layer: Any) -> Fused:
    """A decoder layer's weights [out, in] (and biases) as the runner multiplies them: q, k and v
    stacked into one, gate and up into one."""
    fused = {}
    for name, modules in projections(layer).items():
        weight = torch.cat([p.weight.detach() for p in modules])
        bias = None
        if modules[0].bias is not None:
            bias = torch.cat([p.bias.detach() for p in modules])
        fused[name] = (weight, bias)
    return fused


def release_projections(layer: Any) -> None:
    """Drop a decoder layer's projection weights and biases from its model (set to None, as
    torch lets a registered parameter be): what a runner does on CUDA once its own are built."""
    for modules in projections(layer).values():
        for module in modules:
            module.weight = None
            if module.bias is not None:
                module.bias = None


class _FusedOnRead(Sequence[Fused]):
    """The layers' fused weights (``fused_projections``), made each time a layer's are read and
    never held: on CUDA, where all of them at once would be a second copy of the model."""

    def __init__(self, layers: Any) -> None:
        self.layers = layers

    def __len__(self) -> int:
        return len(self.layers)

    @overload
    def __getitem__(self, index: int) -> Fused: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Fused]: ...

    def __getitem__(self, index: int | slice) -> Fused | Sequence[Fused]:
        if isinstance(index, slice):
            return [self[i] for i in range(len(self))[index]]
        return fused_projections(self.layers[index])


class _FusedWeights(Mapping[tuple[int, str], torch.Tensor]):
    """Every fused weight [out, in] by (layer, linear), read from ``fused`` when asked for."""

    def __init__(self, fused: Sequence[Fused]) -> None:
        self.fused = fused
        self.names = [(i, name) for i in range(len(fused)) for name in _Layer.LINEARS]

    def __getitem__(self, key: tuple[int, str]) -> torch.Tensor:
        return self.fused[key[0]][key[1]][0]

    def __iter__(self) -> Iterator[tuple[int, str]]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)


def choose_backend(precision: Precision, device: str, batch_invariant: bool) -> Backend:
    """The kernels a runner's steps run on (``Precision.backend``): the fixed-order ones when
    asked for, and when they load. When the install could not build them, or the library
    beside the package fails its checks (``kernels/library.py``), the engine runs on the library
    kernels and says what that costs; a precision those kernels alone read (GGUF blocks) cannot."""
    backend = precision.backend(device, batch_invariant)
    if batch_invariant and not precision.invariant_on(backend):
        invariant = ", ".join(p.name for p in invariant_precisions(backend))
        logger.warning(
            "batch invariance needs the CPU's fixed-order kernels; on %s only %s weights keep a "
            "greedy answer independent of the load",
            backend.device,
            invariant,
        )
    if backend is not Backend.FIXED_ORDER:
        return backend
    reason = kernels.unavailable_reason()
    if reason is None:
        return backend
    fallback = precision.fallback(backend)
    if fallback is None:
        raise kernels.KernelCacheError(f"precision {precision.name} needs the kernels: {reason}")
    logger.warning(
        "%s. Running on the library kernels instead: batch invariance is off, so a greedy "
        "answer may depend on the load (the rows batched with it, chunking, the CPU's ISA)",
        reason,
    )
    return fallback


class _Layer:
    LINEARS = ("qkv", "o", "gate_up", "down")

    def __init__(self, layer: Any, linears: dict[str, Linear], fixed_order: bool = False) -> None:
        self.qkv, self.o = linears["qkv"], linears["o"]
        self.gate_up, self.down = linears["gate_up"], linears["down"]
        self.input_norm = layer.input_layernorm.weight.detach()
        self.post_norm = layer.post_attention_layernorm.weight.detach()
        if fixed_order:  # fp32 activations
            self.input_norm, self.post_norm = self.input_norm.float(), self.post_norm.float()


# the LM head's activation integers in w8a8 (its logits are what greedy decoding compares)
_HEAD_ACT_BITS = 10


class LlamaRunner:
    """``quantization``: a precision of the registry (``origin/precision.py``), looked up once
    here; its entry says how the weights are built, which class multiplies them and which of
    the three forward paths a step takes (``ForwardPath``). ``folder``: the model's folder, where
    a converted model's INT8 calibration and packed GGUF blocks are kept (by default the one it
    was read from, ``ModelFolder.of``)."""

    def __init__(
        self,
        model: PreTrainedModel,
        num_slots: int,
        max_len: int,
        quantization: str = "none",
        tokenizer: PreTrainedTokenizerBase | None = None,
        batch_invariant: bool = True,
        folder: ModelFolder | None = None,
    ) -> None:
        reason = unsupported_reason(model, max_len)
        if reason:
            raise ValueError(f"LlamaRunner cannot run this model: {reason}")
        folder = ModelFolder.of(model) if folder is None else folder
        config = model.config
        self.device = model.device
        self.precision = lookup(quantization)
        self.backend = choose_backend(self.precision, self.device.type, batch_invariant)
        self.forward_path = self.precision.forward_path(self.backend)
        # batch-invariant on a CPU: the fixed-order kernels (kernels/), fp32 activations and cache
        self.batch_invariant = self.backend is Backend.FIXED_ORDER
        self.dtype = torch.float32 if self.batch_invariant else model.dtype
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        self.eps = config.rms_norm_eps
        self.scale = self.head_dim**-0.5
        base: Any = model.model
        # on CUDA the model's projections are fused a layer at a time and released once built
        # (the module's docstring); a CPU model keeps them: one serves several engines there
        self.takes_weights = self.device.type == "cuda"
        with torch.no_grad():
            fused: Sequence[Fused] = (
                _FusedOnRead(base.layers)
                if self.takes_weights
                else [fused_projections(layer) for layer in base.layers]
            )
        calibration = self._calibration(model, tokenizer, fused, folder)
        with torch.no_grad():
            linears, lm_head = self._linears(model, fused, calibration, folder)
            if self.forward_path is ForwardPath.FUSED:
                linears, lm_head = _on_huge_pages(linears, lm_head)
            self.layers = [
                _Layer(layer, layer_linears, self.batch_invariant)
                for layer, layer_linears in zip(base.layers, linears, strict=True)
            ]
            self.lm_head = lm_head
            self.embed = base.embed_tokens.weight.detach().to(self.dtype)
            self.final_norm = base.norm.weight.detach().to(self.dtype)
            # cos, sin for every position: [max_len, head_dim], with the model's own rope scaling
            self.cos, self.sin = rope_table(base.rotary_emb, max_len, self.device, self.dtype)
        self.cache = SlotKVCache(
            len(self.layers),
            num_slots,
            self.num_kv_heads,
            max_len,
            self.head_dim,
            self.dtype,
            self.device,
        )
        # batch-invariant: the whole step in fixed-order C, norms and activation included, so no
        # step of a layer depends on the vector width ATen's kernels pick on this CPU
        # w8a8 is batch-invariant by its arithmetic on the library GEMMs: its steps run op by op,
        # with the fixed-order norms, activation and attention around those GEMMs
        self._norm = kernels.rms_norm if self.batch_invariant else rms_norm
        self._silu_mul = kernels.silu_mul if self.batch_invariant else silu_mul
        self._fused = self._fused_forward() if self.forward_path is ForwardPath.FUSED else None

    def _calibration(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase | None,
        fused: Sequence[Fused],
        folder: ModelFolder,
    ) -> dict[tuple[int, str], torch.Tensor | None]:
        """Activation-aware INT8 scales per (layer, linear) where the precision calibrates on
        this device and a tokenizer is given; else none."""
        if self.device.type not in self.precision.calibrated_on or tokenizer is None:
            return {}
        from origin.engine.calibration import awq_scales

        return awq_scales(model, tokenizer, _FusedWeights(fused), quantize_per_channel_int8, folder)

    def _linears(
        self,
        model: PreTrainedModel,
        fused: Sequence[Fused],
        calibration: dict[tuple[int, str], torch.Tensor | None],
        folder: ModelFolder,
    ) -> tuple[list[dict[str, Linear]], Linear]:
        """Every layer's linears and the LM head, as the precision's entry builds them; taking
        the weights over (``takes_weights``), each layer's are released once its are built."""
        precision, backend = self.precision, self.backend
        head_weight = model.lm_head.weight.detach()
        if precision.weights.from_gguf_file:
            return _gguf_linears(model, folder, fused, head_weight, precision)
        base: Any = model.model
        layers: list[dict[str, Linear]] = []
        for i, group in enumerate(fused):
            layers.append(
                {
                    name: make_linear(weight, bias, precision, backend, calibration.get((i, name)))
                    for name, (weight, bias) in group.items()
                }
            )
            del group  # the fused copies: only the linears built from them stay
            if self.takes_weights:
                release_projections(base.layers[i])
        head = make_linear(
            head_weight, None, lookup(precision.head), backend, act_bits=_HEAD_ACT_BITS
        )
        if self.takes_weights and model.lm_head.weight is not base.embed_tokens.weight:
            model.lm_head.weight = None  # a tied head is the embedding, which the runner reads
        return layers, head

    def _fused_forward(self) -> kernels.Forward:
        layers = [
            kernels.LayerWeights(
                _packed(layer.qkv),
                _packed(layer.o),
                _packed(layer.gate_up),
                _packed(layer.down),
                layer.input_norm.contiguous(),
                layer.post_norm.contiguous(),
            )
            for layer in self.layers
        ]
        return kernels.Forward(
            layers,
            self.final_norm.contiguous(),
            _packed(self.lm_head),
            heads=self.num_heads,
            kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            eps=self.eps,
            scale=self.scale,
            k_cache=self.cache.k,
            v_cache=self.cache.v,
            cos=self.cos.contiguous(),
            sin=self.sin.contiguous(),
        )

    @property
    def weight_bytes(self) -> int:
        per_layer = sum(
            lin.weight_bytes + 0
            for layer in self.layers
            for lin in (layer.qkv, layer.o, layer.gate_up, layer.down)
        )
        return per_layer + self.lm_head.weight_bytes

    @property
    def shares_prefixes(self) -> bool:
        """Whether a request may start from another's keys and values (``Scheduler``): they live
        in ``cache``, and with the fixed-order kernels a position's keys and values depend on the
        tokens up to it alone, so a copied prefix is bitwise what the request would compute."""
        return self.batch_invariant

    def release(self, slot: int) -> None:
        """Nothing to do: the slot's positions are simply overwritten by its next owner."""

    @torch.inference_mode()
    def forward(self, segments: list[Segment]) -> list[torch.Tensor]:
        device = self.device
        tokens = [t for seg in segments for t in seg.token_ids]
        positions_list = [seg.start + i for seg in segments for i in range(seg.num_tokens)]
        slots_list = [seg.slot for seg in segments for _ in range(seg.num_tokens)]
        input_ids = torch.tensor(tokens, device=device)
        positions = torch.tensor(positions_list, device=device)
        slots = torch.tensor(slots_list, device=device)
        for seg in segments:
            end = seg.start + seg.num_tokens
            assert end <= self.cache.max_len, "segment runs past the slot's max_len"
            self.cache.lengths[seg.slot] = end
        x = self.embed[input_ids]  # [T, hidden]
        if self._fused is not None:
            rows, counts = logit_rows(segments)
            logits = self._fused(x, positions, slots, torch.tensor(rows))
            return list(logits.split(counts))

        plan = AttentionPlan(segments, self.cache, device, self.batch_invariant)
        cos = self.cos[positions][:, None, :]
        sin = self.sin[positions][:, None, :]
        n_q, n_kv, d = self.num_heads, self.num_kv_heads, self.head_dim
        norm = self._norm
        for index, layer in enumerate(self.layers):
            h = norm(x, layer.input_norm, self.eps)
            qkv = layer.qkv(h)
            # rotate q and k heads together: [T, heads + kv_heads, head_dim]
            qk = rotate(qkv[:, : (n_q + n_kv) * d].view(-1, n_q + n_kv, d), cos, sin)
            q, k = qk[:, :n_q], qk[:, n_q:]
            v = qkv[:, (n_q + n_kv) * d :].view(-1, n_kv, d)
            plan.store(self.cache, index, slots, positions, k, v)
            attn = plan.attend(q, self.cache.k[index], self.cache.v[index], self.scale)
            x = x + layer.o(attn.reshape(-1, n_q * d))
            h = norm(x, layer.post_norm, self.eps)
            x = x + layer.down(self._silu_mul(layer.gate_up(h)))

        rows, counts = logit_rows(segments)
        h = norm(x[rows], self.final_norm, self.eps)
        logits = self.lm_head(h).float()
        return list(logits.split(counts))


def _packed(linear: Linear) -> kernels.PackedLinear:
    assert isinstance(linear, kernels.PackedLinear), "the fused step reads packed weights only"
    return linear


def _gguf_linears(
    model: PreTrainedModel,
    folder: ModelFolder,
    fused: Sequence[Fused],
    head_weight: torch.Tensor,
    precision: Precision,
) -> tuple[list[dict[str, Linear]], Linear]:
    """The GGUF file's blocks for every layer (with the model's biases, if any) and the head."""
    from origin.engine.gguf_blocks import gguf_linears

    matrices = {(i, n): w for i, group in enumerate(fused) for n, (w, _) in group.items()}
    activations_8bit = precision.weights is WeightFormat.GGUF_BLOCKS_A8
    if activations_8bit and kernels.a8_path() == "c":
        logger.warning(
            "%s without AVX2 on this CPU: its integer dot products run in plain C, slower than "
            "gguf's (the same answers as with AVX2 or VNNI); prefer gguf here",
            precision.name,
        )
    packed, packed_head = gguf_linears(model, folder, matrices, head_weight, activations_8bit)

    def with_bias(linear: kernels.PackedLinear, bias: torch.Tensor | None) -> Linear:
        if bias is None:
            return linear
        return dataclasses.replace(linear, bias=bias.float().contiguous())

    layers: list[dict[str, Linear]] = [
        {n: with_bias(packed[(i, n)], b) for n, (_, b) in group.items()}
        for i, group in enumerate(fused)
    ]
    return layers, packed_head


def _on_huge_pages(
    layers: list[dict[str, Linear]], head: Linear
) -> tuple[list[dict[str, Linear]], Linear]:
    """The same packed weights, copied together onto huge pages: every weight a fused step
    reads (``kernels.huge_page_copies``)."""
    linears = [_packed(group[name]) for group in layers for name in _Layer.LINEARS]
    linears.append(_packed(head))
    copies = iter(kernels.huge_page_copies([linear.packed for linear in linears]))
    moved: list[Linear] = [dataclasses.replace(linear, packed=next(copies)) for linear in linears]
    width = len(_Layer.LINEARS)
    grouped = [
        dict(zip(_Layer.LINEARS, moved[i : i + width], strict=True))
        for i in range(0, len(layers) * width, width)
    ]
    return grouped, moved[-1]


def logit_rows(segments: list[Segment]) -> tuple[list[int], list[int]]:
    """The step's rows whose logits are wanted (a segment's last token, or all of its tokens for
    verification), and how many per segment."""
    rows: list[int] = []
    counts: list[int] = []
    row = 0
    for seg in segments:
        count = seg.num_tokens if seg.all_logits else 1
        rows.extend(range(row + seg.num_tokens - count, row + seg.num_tokens))
        counts.append(count)
        row += seg.num_tokens
    return rows, counts


class HFRunner:
    """Any causal LM with the transformers Cache API: a cache per slot, a forward per segment."""

    def __init__(self, model: PreTrainedModel, num_slots: int, max_len: int) -> None:
        self.model = model
        self.device = model.device
        # only the bookkeeping of the slot cache is used; the tensors live in per-slot caches
        self.cache = SlotKVCache(0, num_slots, 1, max_len, 1, torch.float32, "cpu")
        self._caches: dict[int, object] = {}

    @property
    def weight_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.model.parameters())

    def release(self, slot: int) -> None:
        self._caches.pop(slot, None)

    @torch.inference_mode()
    def forward(self, segments: list[Segment]) -> list[torch.Tensor]:
        from transformers import DynamicCache

        results = []
        for seg in segments:
            cache = self._caches.get(seg.slot)
            if cache is None or seg.start == 0:
                cache = DynamicCache(config=self.model.config)
                self._caches[seg.slot] = cache
            if cache.get_seq_length() > seg.start:  # type: ignore[attr-defined]
                cache.crop(seg.start)  # type: ignore[attr-defined]
            assert cache.get_seq_length() == seg.start  # type: ignore[attr-defined]
            ids = torch.tensor([seg.token_ids], device=self.device)
            logits = self.model(input_ids=ids, cache=cache, use_cache=True).logits[0]
            results.append((logits if seg.all_logits else logits[-1:]).float())
            self.cache.lengths[seg.slot] = seg.start + seg.num_tokens
        return results


def make_runner(
    model: PreTrainedModel,
    num_slots: int,
    max_len: int,
    quantization: str = "none",
    tokenizer: PreTrainedTokenizerBase | None = None,
    batch_invariant: bool = True,
    folder: ModelFolder | None = None,
) -> Runner:
    """The lean runner when the architecture allows, else the generic one (no INT8 there).

    With a tokenizer, CPU INT8 is calibrated on a few prompts (activation-aware scaling; the
    chosen scales kept beside a converted model: ``calibration.awq_scales``);
    ``batch_invariant``: a row's numbers never depend on the rest of the step (``docs/engine.md``);
    ``folder``: where those scales and packed GGUF blocks are kept (``LlamaRunner``).
    The generic runner computes one segment per forward, so only its prompt chunking can vary."""
    if unsupported_reason(model, max_len) is None:
        return LlamaRunner(
            model, num_slots, max_len, quantization, tokenizer, batch_invariant, folder
        )
    if lookup(quantization).weights is not WeightFormat.AS_LOADED:
        raise ValueError(
            f"quantization={quantization!r} needs a Llama-family model: "
            f"{unsupported_reason(model, max_len)}"
        )
    return HFRunner(model, num_slots, max_len)
