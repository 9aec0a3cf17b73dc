"""Model runners: execute one engine step (a batch of token segments) against the slot KV cache.

``LlamaRunner`` is a lean forward for the Llama family (Llama, Mistral, Qwen2, SmolLM2) in plain
PyTorch: fused QKV and gate/up weights stored [in, out], one GEMM per weight for every token of the
step (prefill chunks and decode tokens together), batched decode attention over the slot cache, and
optional INT8 weights. It matches transformers' logits (tests compare them). ``HFRunner`` runs any
other causal LM through its own forward with one transformers cache per slot: correct, not fast.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch

from origin.engine import kernels
from origin.engine.attention import AttentionPlan
from origin.engine.kv_cache import SlotKVCache
from origin.engine.linear import Linear, make_linear, quantize_per_channel_int8
from origin.engine.ops import rms_norm, rope_table, rotate, silu_mul
from origin.precision import GGUF_BLOCK_QUANTIZATIONS

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

LLAMA_FAMILY = ("llama", "mistral", "qwen2")


@dataclass
class Segment:
    """Tokens of one request computed in one step, starting at cache position ``start``."""

    slot: int
    token_ids: list[int]
    start: int
    all_logits: bool = False  # logits for every token (verification) or only the last

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


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


def fused_projections(layer: Any) -> dict[str, tuple[torch.Tensor, torch.Tensor | None]]:
    """A decoder layer's weights [out, in] (and biases) as the runner multiplies them: q, k and v
    stacked into one, gate and up into one."""
    attn, mlp = layer.self_attn, layer.mlp
    groups = {
        "qkv": (attn.q_proj, attn.k_proj, attn.v_proj),
        "o": (attn.o_proj,),
        "gate_up": (mlp.gate_proj, mlp.up_proj),
        "down": (mlp.down_proj,),
    }
    fused = {}
    for name, projections in groups.items():
        weight = torch.cat([p.weight.detach() for p in projections])
        bias = None
        if projections[0].bias is not None:
            bias = torch.cat([p.bias.detach() for p in projections])
        fused[name] = (weight, bias)
    return fused


def _fixed_order_kernels_load(quantization: str) -> bool:
    """Whether the fixed-order kernels load. Without a private folder to keep them in (they are
    never loaded from a folder another user could write) the engine runs on the library kernels
    and says what that costs; GGUF blocks, which those kernels alone read, cannot."""
    reason = kernels.unavailable_reason()
    if reason is None:
        return True
    if quantization in GGUF_BLOCK_QUANTIZATIONS:
        raise kernels.KernelCacheError(f"precision {quantization} needs the kernels: {reason}")
    logger.warning(
        "%s. Running on the library kernels instead: batch invariance is off, so a greedy "
        "answer may depend on the load (the rows batched with it, chunking, the CPU's ISA)",
        reason,
    )
    return False


class _Layer:
    LINEARS = ("qkv", "o", "gate_up", "down")

    def __init__(self, layer: Any, linears: dict[str, Linear], fixed_order: bool = False) -> None:
        self.qkv, self.o = linears["qkv"], linears["o"]
        self.gate_up, self.down = linears["gate_up"], linears["down"]
        self.input_norm = layer.input_layernorm.weight.detach()
        self.post_norm = layer.post_attention_layernorm.weight.detach()
        if fixed_order:  # fp32 activations
            self.input_norm, self.post_norm = self.input_norm.float(), self.post_norm.float()


class LlamaRunner:
    def __init__(
        self,
        model: PreTrainedModel,
        num_slots: int,
        max_len: int,
        quantization: str = "none",
        tokenizer: PreTrainedTokenizerBase | None = None,
        batch_invariant: bool = True,
    ) -> None:
        reason = unsupported_reason(model, max_len)
        if reason:
            raise ValueError(f"LlamaRunner cannot run this model: {reason}")
        config = model.config
        self.device = model.device
        blocks = quantization in GGUF_BLOCK_QUANTIZATIONS
        if blocks and self.device.type != "cpu":
            raise ValueError(f"precision {quantization} runs on the CPU's kernels, not on CUDA")
        # batch-invariant on a CPU: the fixed-order kernels (kernels/), fp32 activations and cache;
        # GGUF blocks are read by those kernels alone
        batch_invariant = batch_invariant or blocks
        self.batch_invariant = batch_invariant and self.device.type == "cpu"
        if batch_invariant and not self.batch_invariant and quantization != "w8a8":
            logger.warning(
                "batch invariance needs the CPU's fixed-order kernels; on %s only w8a8 weights "
                "keep a greedy answer independent of the load",
                self.device.type,
            )
        if self.batch_invariant:
            self.batch_invariant = _fixed_order_kernels_load(quantization)
        if quantization == "gguf-a8" and kernels.a8_path() == "c":
            logger.warning(
                "gguf-a8 without AVX2 on this CPU: its integer dot products run in plain C, "
                "slower than gguf's (the same answers as with AVX2 or VNNI); prefer gguf here"
            )
        self.dtype = torch.float32 if self.batch_invariant else model.dtype
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        self.eps = config.rms_norm_eps
        self.scale = self.head_dim**-0.5
        base: Any = model.model
        calibration: dict[tuple[int, str], torch.Tensor | None] = {}
        calibrated = quantization == "w8a8" or (
            quantization == "int8" and self.device.type == "cpu"
        )
        with torch.no_grad():
            fused = [fused_projections(layer) for layer in base.layers]
        if calibrated and tokenizer is not None:
            from origin.engine.calibration import awq_scales

            weights = {(i, n): w for i, group in enumerate(fused) for n, (w, _) in group.items()}
            calibration = awq_scales(model, tokenizer, weights, quantize_per_channel_int8)
        with torch.no_grad():
            linears, self.lm_head = self._linears(model, fused, quantization, calibration)
            self.layers = [
                _Layer(layer, layer_linears, self.batch_invariant)
                for layer, layer_linears in zip(base.layers, linears, strict=True)
            ]
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
        fixed = all(
            isinstance(getattr(layer, name), kernels.PackedLinear)
            for layer in self.layers
            for name in _Layer.LINEARS
        ) and isinstance(self.lm_head, kernels.PackedLinear)
        self._fused = self._fused_forward() if self.batch_invariant and fixed else None

    def _linears(
        self,
        model: PreTrainedModel,
        fused: list[dict[str, tuple[torch.Tensor, torch.Tensor | None]]],
        quantization: str,
        calibration: dict[tuple[int, str], torch.Tensor | None],
    ) -> tuple[list[dict[str, Linear]], Linear]:
        """Every layer's linears and the LM head, for ``quantization``."""
        head_weight = model.lm_head.weight.detach()
        if quantization in GGUF_BLOCK_QUANTIZATIONS:
            from origin.engine.gguf_blocks import gguf_linears

            weights = {(i, n): w for i, group in enumerate(fused) for n, (w, _) in group.items()}
            packed, packed_head = gguf_linears(
                model, weights, head_weight, activations_8bit=quantization == "gguf-a8"
            )

            def with_bias(linear: kernels.PackedLinear, bias: torch.Tensor | None) -> Linear:
                if bias is None:
                    return linear
                return dataclasses.replace(linear, bias=bias.float().contiguous())

            gguf_layers: list[dict[str, Linear]] = [
                {n: with_bias(packed[(i, n)], b) for n, (_, b) in group.items()}
                for i, group in enumerate(fused)
            ]
            return gguf_layers, packed_head
        layers: list[dict[str, Linear]] = [
            {
                name: make_linear(
                    weight,
                    bias,
                    quantization,
                    self.device,
                    calibration.get((i, name)),
                    fixed_order=self.batch_invariant,
                )
                for name, (weight, bias) in group.items()
            }
            for i, group in enumerate(fused)
        ]
        # the LM head: bf16 in bf16 mode, where every GEMM is bf16; bf16 for INT8 layers too
        # (INT8 costs greedy agreement at the logits, bf16 does not: decode.py); w8a8 in w8a8
        # mode, where every GEMM must be batch-invariant (with 10-bit activations: the logits are
        # what greedy decoding compares); else full precision
        heads = {"int8": "bf16", "bf16": "bf16", "w8a8": "w8a8"}
        head_quantization = heads.get(quantization, "none")
        head = make_linear(
            head_weight,
            None,
            head_quantization,
            self.device,
            act_bits=10,
            fixed_order=self.batch_invariant,
        )
        return layers, head

    def _fused_forward(self) -> kernels.Forward:
        # every weight a step reads, together on huge pages
        owners: list[tuple[object, str]] = [
            (layer, name) for layer in self.layers for name in _Layer.LINEARS
        ]
        owners.append((self, "lm_head"))
        weights = [getattr(owner, name) for owner, name in owners]
        copies = kernels.huge_page_copies([w.packed for w in weights])
        for (owner, name), weight, copy in zip(owners, weights, copies, strict=True):
            setattr(owner, name, dataclasses.replace(weight, packed=copy))

        def packed(linear: Linear) -> kernels.PackedLinear:
            assert isinstance(linear, kernels.PackedLinear)
            return linear

        layers = [
            kernels.LayerWeights(
                packed(layer.qkv),
                packed(layer.o),
                packed(layer.gate_up),
                packed(layer.down),
                layer.input_norm.contiguous(),
                layer.post_norm.contiguous(),
            )
            for layer in self.layers
        ]
        return kernels.Forward(
            layers,
            self.final_norm.contiguous(),
            packed(self.lm_head),
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
) -> Runner:
    """The lean runner when the architecture allows, else the generic one (no INT8 there).

    With a tokenizer, CPU INT8 is calibrated on a few prompts (activation-aware scaling; the
    chosen scales kept beside a converted model: ``calibration.awq_scales``);
    ``batch_invariant``: a row's numbers never depend on the rest of the step (``docs/engine.md``).
    The generic runner computes one segment per forward, so only its prompt chunking can vary."""
    if unsupported_reason(model, max_len) is None:
        return LlamaRunner(model, num_slots, max_len, quantization, tokenizer, batch_invariant)
    if quantization != "none":
        raise ValueError(
            f"quantization={quantization!r} needs a Llama-family model: "
            f"{unsupported_reason(model, max_len)}"
        )
    return HFRunner(model, num_slots, max_len)
