"""How the tokens of one step attend when the step runs op by op (``runner.py``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from origin.engine import kernels
from origin.engine.kv_cache import Segment, SlotKVCache

# steps with at most this many segments attend query by query (see AttentionPlan)
EXACT_MAX_SEGMENTS = 8


class AttentionPlan:
    """How the tokens of one step attend, when the step runs op by op (``kernels.Forward`` runs
    fixed-order steps whole).

    Batch-invariant (``fixed_order``, w8a8 weights): every token, prompt or decode, attends over
    exactly its own keys in the fixed-order kernel (``kernels/fixed_order.c``), in one call per
    layer: its result depends on nothing else in the step, nor on where a prompt was cut into
    chunks. Otherwise: small steps (at most ``EXACT_MAX_SEGMENTS`` segments) attend query by
    query: each decode or verification token over exactly its own valid keys, with the same call
    whichever step it is in. With bf16 weights (whose GEMM rows do not depend on the batch) a
    token's result is then bitwise the same whether it is decoded alone or verified inside a
    speculative proposal, so speculation cannot change a greedy output. Larger steps batch their
    decode tokens over the slot range. Prompt chunks attend together under a causal mask.
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
