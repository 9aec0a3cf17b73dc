"""The KV cache: preallocated slots indexed by position (gpt-fast style).

A request owns one slot for its lifetime in the running set. Its keys and values for position ``p``
live at ``[:, slot, :, p]``; the slot's length is how many positions are valid. Finishing a request,
cancelling it or rejecting speculative tokens only moves that length: nothing is copied or freed.
A ``Segment`` is what one request computes in a step: its tokens, from a position of its slot.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


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


class SlotKVCache:
    # k, v: [layers, slots, kv_heads, max_len, head_dim]
    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        num_kv_heads: int,
        max_len: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        shape = (num_layers, num_slots, num_kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.num_slots = num_slots
        self.max_len = max_len
        self.lengths = [0] * num_slots
        self._free = list(range(num_slots))  # kept sorted: the lowest free slot is taken first
        # free slot -> the tokens whose keys and values its positions still hold (``free``'s
        # ``holds``); forgotten when the slot is taken, by whatever takes it
        self.kept: dict[int, list[int]] = {}
        self.kv_heads_index = torch.arange(num_kv_heads, device=device)

    @property
    def bytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def used_slots(self) -> list[int]:
        free = set(self._free)
        return [s for s in range(self.num_slots) if s not in free]

    def allocate(self) -> int:
        """Take the lowest free slot; low slots keep batched attention's slot range compact."""
        if not self._free:
            raise RuntimeError("no free KV cache slot")
        slot = self._free.pop(0)
        self.lengths[slot] = 0
        self.kept.pop(slot, None)
        return slot

    def take(self, slot: int, length: int) -> None:
        """Take free ``slot`` whose first ``length`` positions still hold what the next owner
        needs (a prefix it shares with the slot's last owner: ``Scheduler``)."""
        self._free.remove(slot)
        self.kept.pop(slot, None)
        self.lengths[slot] = length

    def copy_prefix(self, source: int, target: int, length: int) -> None:
        """Positions ``[0, length)`` of ``source`` into ``target`` (a prefix the two requests'
        tokens share: the same keys and values, computed once)."""
        self.k[:, target, :, :length] = self.k[:, source, :, :length]
        self.v[:, target, :, :length] = self.v[:, source, :, :length]
        self.lengths[target] = length

    def free(self, slot: int, holds: list[int] | None = None) -> None:
        """Return ``slot``; ``holds``: the tokens whose keys and values it keeps until taken
        again (prefix sharing: ``Scheduler``)."""
        assert slot not in self._free, f"slot {slot} freed twice"
        if holds:
            self.kept[slot] = holds
        self.lengths[slot] = 0
        self._free.append(slot)
        self._free.sort()

    def truncate(self, slot: int, length: int) -> None:
        """Forget positions ``>= length`` (speculative rollback): a position move, no copy."""
        assert 0 <= length <= self.lengths[slot]
        self.lengths[slot] = length

    def write(
        self,
        layer: int,
        slots: torch.Tensor,
        positions: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
    ) -> None:
        """Store k, v ([tokens, kv_heads, head_dim]) at (slot, position) for each token."""
        heads = self.kv_heads_index[None, :]
        self.k[layer][slots[:, None], heads, positions[:, None]] = k
        self.v[layer][slots[:, None], heads, positions[:, None]] = v
