"""Model runners: execute one engine step (a batch of token segments) against the slot KV cache.

``LlamaRunner`` is a lean forward for the Llama family (Llama, Mistral, Qwen2, SmolLM2) in plain
PyTorch: fused QKV and gate/up weights stored [in, out], one GEMM per weight for every token of the
step (prefill chunks and decode tokens together), batched decode attention over the slot cache, and
optional INT8 weights. It matches transformers' logits (tests compare them). ``HFRunner`` runs any
other causal LM through its own forward with one transformers cache per slot: correct, not fast.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.nn.functional as F

from origin.engine import kernels
from origin.engine.kv_cache import SlotKVCache
from origin.engine.linear import Linear, make_linear
from origin.engine.ops import rms_norm, rope_table, rotate, silu_mul

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

LLAMA_FAMILY = ("llama", "mistral", "qwen2")
# steps with at most this many segments attend query by query (see _AttentionPlan)
EXACT_MAX_SEGMENTS = 8


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


class _Layer:
    def __init__(
        self,
        layer: Any,
        quantization: str,
        device: torch.device,
        calibration: dict[str, torch.Tensor] | None = None,
        fixed_order: bool = False,
    ) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        calib = calibration or {}

        def linear(weights: list[Any], biases: list[Any], name: str) -> Linear:
            weight = torch.cat([w.detach() for w in weights])
            bias = None
            if biases[0] is not None:
                bias = torch.cat([b.detach() for b in biases])
            return make_linear(
                weight, bias, quantization, device, calib.get(name), fixed_order=fixed_order
            )

        projections = (attn.q_proj, attn.k_proj, attn.v_proj)
        self.qkv = linear([p.weight for p in projections], [p.bias for p in projections], "qkv")
        self.o = linear([attn.o_proj.weight], [attn.o_proj.bias], "o")
        self.gate_up = linear(
            [mlp.gate_proj.weight, mlp.up_proj.weight],
            [mlp.gate_proj.bias, mlp.up_proj.bias],
            "gate_up",
        )
        self.down = linear([mlp.down_proj.weight], [mlp.down_proj.bias], "down")
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
        # batch-invariant on a CPU: the fixed-order kernels (kernels/), fp32 activations and cache
        self.batch_invariant = batch_invariant and self.device.type == "cpu"
        if batch_invariant and not self.batch_invariant and quantization != "w8a8":
            logger.warning(
                "batch invariance needs the CPU's fixed-order kernels; on %s only w8a8 weights "
                "keep a greedy answer independent of the load",
                self.device.type,
            )
        self.dtype = torch.float32 if self.batch_invariant else model.dtype
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        self.eps = config.rms_norm_eps
        self.scale = self.head_dim**-0.5
        base: Any = model.model
        calibration: dict[tuple[int, str], torch.Tensor] = {}
        calibrated = quantization == "w8a8" or (
            quantization == "int8" and self.device.type == "cpu"
        )
        if calibrated and tokenizer is not None:
            from origin.engine.calibration import collect_linear_inputs

            calibration = collect_linear_inputs(model, tokenizer)
        with torch.no_grad():
            self.layers = [
                _Layer(
                    layer,
                    quantization,
                    self.device,
                    {name: x for (i, name), x in calibration.items() if i == index},
                    self.batch_invariant,
                )
                for index, layer in enumerate(base.layers)
            ]
            self.embed = base.embed_tokens.weight.detach().to(self.dtype)
            self.final_norm = base.norm.weight.detach().to(self.dtype)
            # the LM head stays in full precision except in bf16 mode, where every GEMM is bf16,
            # and in w8a8 mode, where every GEMM must be batch-invariant (with 10-bit activations:
            # the logits are what greedy decoding compares)
            head_quantization = quantization if quantization in ("bf16", "w8a8") else "none"
            self.lm_head = make_linear(
                model.lm_head.weight.detach(),
                None,
                head_quantization,
                self.device,
                act_bits=10,
                fixed_order=self.batch_invariant,
            )
            # cos, sin for every position: [max_len, head_dim], with the model's own rope scaling
            self.cos, self.sin = rope_table(base.rotary_emb, max_len, self.device, self.dtype)
        # batch-invariant: norms and the MLP's activation in fixed-order C too, so no step of a
        # layer depends on the vector width ATen's kernels pick on this CPU
        self._norm = kernels.rms_norm if self.batch_invariant else rms_norm
        self._silu_mul = kernels.silu_mul if self.batch_invariant else silu_mul
        self.cache = SlotKVCache(
            len(self.layers),
            num_slots,
            self.num_kv_heads,
            max_len,
            self.head_dim,
            self.dtype,
            self.device,
        )

    @property
    def weight_bytes(self) -> int:
        per_layer = sum(
            lin.weight_bytes + 0
            for layer in self.layers
            for lin in (layer.qkv, layer.o, layer.gate_up, layer.down)
        )
        return per_layer + self.lm_head.weight_bytes

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
        cos = self.cos[positions][:, None, :]
        sin = self.sin[positions][:, None, :]
        for seg in segments:
            end = seg.start + seg.num_tokens
            assert end <= self.cache.max_len, "segment runs past the slot's max_len"
            self.cache.lengths[seg.slot] = end
        plan = _AttentionPlan(segments, self.cache, device, self.batch_invariant)

        x = self.embed[input_ids]  # [T, hidden]
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

        rows = plan.logit_rows
        h = norm(x[rows], self.final_norm, self.eps)
        logits = self.lm_head(h).float()
        return list(logits.split(plan.logit_counts))


class _AttentionPlan:
    """How the tokens of one step attend.

    Batch-invariant (``fixed_order``): every token, prompt or decode, attends over exactly its own
    keys in the fixed-order kernel (``kernels/fixed_order.c``), in one call per layer: its result
    depends on nothing else in the step, nor on where a prompt was cut into chunks. Otherwise:
    Small steps (at most ``EXACT_MAX_SEGMENTS`` segments) attend query by query: each decode or
    verification token over exactly its own valid keys, with the same call whichever step it is
    in. With bf16 weights (whose GEMM rows do not depend on the batch) a token's result is then
    bitwise the same whether it is decoded alone or verified inside a speculative proposal, so
    speculation cannot change a greedy output. Larger steps batch their decode tokens over the
    slot range. Prompt chunks attend together under a causal mask.
    """

    def __init__(
        self,
        segments: list[Segment],
        cache: SlotKVCache,
        device: torch.device,
        fixed_order: bool = False,
    ) -> None:
        self.segments = segments
        self.fixed_order = fixed_order
        self.decode_rows: list[int] = []
        self.decode_slots: list[int] = []
        self.per_query: list[tuple[int, int, int]] = []  # (row, slot, keys up to and incl.)
        self.prefill: list[tuple[int, Segment]] = []  # (first row, segment)
        self.logit_rows: list[int] = []
        self.logit_counts: list[int] = []
        exact = len(segments) <= EXACT_MAX_SEGMENTS
        row = 0
        for seg in segments:
            if fixed_order:
                pass  # every row attends in the kernel: see row_slots, row_lengths
            elif exact and (seg.num_tokens == 1 or seg.all_logits):
                for i in range(seg.num_tokens):
                    self.per_query.append((row + i, seg.slot, seg.start + i + 1))
            elif seg.num_tokens == 1:
                self.decode_rows.append(row)
                self.decode_slots.append(seg.slot)
            else:
                self.prefill.append((row, seg))
            count = seg.num_tokens if seg.all_logits else 1
            self.logit_rows.extend(range(row + seg.num_tokens - count, row + seg.num_tokens))
            self.logit_counts.append(count)
            row += seg.num_tokens
        self.num_tokens = row
        self.device = device
        if fixed_order:
            self.row_slots = torch.tensor([s.slot for s in segments for _ in range(s.num_tokens)])
            ends = [s.start + i + 1 for s in segments for i in range(s.num_tokens)]
            self.row_lengths = torch.tensor(ends)
        if self.decode_slots:
            # slots [0, span) hold every decode slot; rows of other slots in the span are padding
            self.span = max(self.decode_slots) + 1
            self.max_len = max(cache.lengths[s] for s in self.decode_slots)
            lengths = torch.ones(self.span, dtype=torch.long)
            for s in self.decode_slots:
                lengths[s] = cache.lengths[s]
            # additive mask: [span, 1, 1, max_len], -inf where the key position is not valid
            valid = torch.arange(self.max_len)[None, :] < lengths[:, None]
            bias = torch.zeros(valid.shape).masked_fill(~valid, float("-inf"))
            self.decode_bias = bias.to(device)[:, None, None, :]
            self.decode_rows_t = torch.tensor(self.decode_rows, device=device)
            self.decode_slots_t = torch.tensor(self.decode_slots, device=device)
        self.prefill_masks = []
        for _, seg in self.prefill:
            end = seg.start + seg.num_tokens
            query_pos = torch.arange(seg.start, end)[:, None]
            self.prefill_masks.append((torch.arange(end)[None, :] <= query_pos).to(device))

    def store(
        self,
        cache: SlotKVCache,
        layer: int,
        slots: torch.Tensor,
        positions: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
    ) -> None:
        """Write the step's keys and values: slices for one segment, a scatter for several."""
        if len(self.segments) == 1:
            seg = self.segments[0]
            end = seg.start + seg.num_tokens
            cache.k[layer, seg.slot, :, seg.start : end] = k.transpose(0, 1)
            cache.v[layer, seg.slot, :, seg.start : end] = v.transpose(0, 1)
        else:
            cache.write(layer, slots, positions, k, v)

    def attend(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, scale: float
    ) -> torch.Tensor:
        # q: [T, heads, head_dim]; k_cache, v_cache: [slots, kv_heads, max_len, head_dim]
        if self.fixed_order:
            return kernels.attention(q, k_cache, v_cache, self.row_slots, self.row_lengths, scale)
        out = torch.empty_like(q) if len(self.per_query) < self.num_tokens else None
        per_query = []
        for row, slot, length in self.per_query:
            k = k_cache[slot : slot + 1, :, :length]
            v = v_cache[slot : slot + 1, :, :length]
            qs = q[row : row + 1].transpose(0, 1)[None]  # [1, heads, 1, d]
            o = F.scaled_dot_product_attention(qs, k, v, scale=scale, enable_gqa=True)
            per_query.append(o[0, :, 0])
        if out is None:  # every token attended alone
            return torch.stack(per_query)
        for (row, _, _), o in zip(self.per_query, per_query, strict=True):
            out[row] = o
        if self.decode_slots:
            n_heads, d = q.shape[1], q.shape[2]
            q_span = torch.zeros(self.span, n_heads, 1, d, dtype=q.dtype, device=q.device)
            q_span[self.decode_slots_t, :, 0] = q[self.decode_rows_t]
            k = k_cache[: self.span, :, : self.max_len]
            v = v_cache[: self.span, :, : self.max_len]
            # grouped-query attention as two batched matmuls: ~30% faster than SDPA on CPU here
            n_kv = k.shape[1]
            q_groups = q_span.view(self.span, n_kv, n_heads // n_kv, d)
            scores = torch.matmul(q_groups, k.transpose(-1, -2)) * scale + self.decode_bias
            o = torch.matmul(torch.softmax(scores, dim=-1), v).view(self.span, n_heads, d)
            out[self.decode_rows_t] = o[self.decode_slots_t]
        for (row, seg), mask in zip(self.prefill, self.prefill_masks, strict=True):
            end = seg.start + seg.num_tokens
            qs = q[row : row + seg.num_tokens].transpose(0, 1)[None]  # [1, heads, n, d]
            k = k_cache[seg.slot : seg.slot + 1, :, :end]
            v = v_cache[seg.slot : seg.slot + 1, :, :end]
            o = F.scaled_dot_product_attention(
                qs, k, v, attn_mask=mask, scale=scale, enable_gqa=True
            )
            out[row : row + seg.num_tokens] = o[0].transpose(0, 1)
        return out


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

    With a tokenizer, CPU INT8 is calibrated on a few prompts (activation-aware scaling);
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
