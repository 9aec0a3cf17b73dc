"""Weights side by side in memory on transparent huge pages, for the kernels to stream."""

from __future__ import annotations

import mmap
import warnings

import torch

_HUGE_PAGE = 2 << 20


def huge_page_copies(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Copies of ``tensors`` side by side in one anonymous mapping advised for transparent huge
    pages (Linux; elsewhere, or where THP is off, plain pages). A decode step streams every
    weight once: through 4 KiB pages the TLB misses cost a third of the step (6.0 ms with huge
    pages, 6.6-9.0 ms without, ``docs/engine.md``)."""
    sizes = [t.numel() * t.element_size() for t in tensors]
    offsets = [0]
    for size in sizes:
        offsets.append(offsets[-1] + -(-size // 64) * 64)
    arena = mmap.mmap(-1, offsets[-1] + _HUGE_PAGE)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            arena.madvise(mmap.MADV_HUGEPAGE)
        except OSError:
            pass
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the mapping is writable
        base = torch.frombuffer(arena, dtype=torch.uint8)
    start = -base.data_ptr() % _HUGE_PAGE
    copies = []
    for t, offset, size in zip(tensors, offsets, sizes, strict=False):
        view = base[start + offset : start + offset + size].view(t.dtype).view(t.shape)
        view.copy_(t)
        copies.append(view)
    return copies
