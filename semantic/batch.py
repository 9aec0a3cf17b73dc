"""Many texts embedded at once: the nightly job's wordings and a release's phrasings.

The lean forward (``bert.py``) in fp32 on texts grouped by token length, so no row is padded and
no attention mask is built; any other layout, or a model on a GPU, goes through ``encode``. The
heap a chunk's forwards freed is handed back to the system between chunks (glibc's
``malloc_trim``).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from semantic.bert import BertParts, LeanBert, lean_layout

if TYPE_CHECKING:
    import numpy as np

    from semantic.embedder import Embedder


BATCH_TOKENS = 2048  # tokens per forward: the fastest measured on 2 cores (vs 8,192 and 32,768)
# texts tokenized (and held as ids) at a time: a chunk here, a block of the Ray job
# (``precompute/fleet/embedding.py``); 4,096 as fast as 16,384 in one process (462 vs 457
# wordings/s, 2 cores) and small enough to keep every Ray actor busy to the end
TOKENIZE_CHUNK = 4_096


def encode_many(model: Embedder, texts: Sequence[str], progress: bool = False) -> np.ndarray:
    """Unit-length fp32 embeddings of many texts, row for row (``encode_chunks``, joined)."""
    import numpy as np

    dim = int(model.get_embedding_dimension() or 0)
    chunks = list(encode_chunks(model, texts, progress))
    return np.concatenate(chunks) if chunks else np.zeros((0, dim), dtype=np.float32)


def encode_chunks(
    model: Embedder, texts: Sequence[str], progress: bool = False
) -> Iterator[np.ndarray]:
    """Unit-length fp32 embeddings of many texts, ``TOKENIZE_CHUNK`` rows at a time, in order:
    the night's wordings, a release's phrasings. The lean forward in fp32 (``encode``'s
    arithmetic: cosine to its vectors > 0.99999) on texts grouped by token length, so no row is
    padded and no attention mask is built: 777 wordings/s against ``encode``'s 430 on 2 cores
    (Xeon, AVX-512). Any other layout, or a model on a GPU, goes through ``encode`` (batches
    of 256)."""
    import numpy as np

    dim = int(model.get_embedding_dimension() or 0)
    parts = lean_layout(model)
    lean = parts.fp32 if parts is not None else None
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(texts), desc="embedding", unit="text", leave=False)
    for start in range(0, len(texts), TOKENIZE_CHUNK):
        chunk = list(texts[start : start + TOKENIZE_CHUNK])
        if lean is None or parts is None:
            vectors = model.encode(
                chunk,
                batch_size=256,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
            out = np.asarray(vectors, dtype=np.float32).reshape(len(chunk), dim)
        else:
            out = _encode_by_length(lean, parts, chunk, dim)
        if len(chunk) >= TRIM_AFTER:
            _return_freed_heap()
        if bar is not None:
            bar.update(len(chunk))
        yield out
    if bar is not None:
        bar.close()


# the heap is trimmed after a chunk of at least this many texts (the nightly job's), not after a
# few queries embedded at once on a service's request path, where it would walk a large heap
TRIM_AFTER = 1_024


def _return_freed_heap() -> None:
    """Hand the heap a chunk's forwards freed back to the system (glibc's ``malloc_trim``;
    elsewhere nothing). glibc keeps freed activations' pages for reuse, and the chunks' vectors
    land between them: measured, a million log rows' 402,732 wordings (618 MB of vectors) left
    the process 1.5 GB larger, not 0.6, for the index and the clusters to sit on top of. Dask
    trims its workers' heaps for the same reason; the next chunk allocates afresh at no
    measurable cost."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Any:
    import ctypes

    try:
        trim = ctypes.CDLL("libc.so.6").malloc_trim  # glibc's soname
    except (OSError, AttributeError):  # not glibc (musl, macOS, Windows)
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def _encode_by_length(lean: LeanBert, parts: BertParts, texts: list[str], dim: int) -> np.ndarray:
    import numpy as np
    import torch

    ids = parts.tokenize(texts)
    lengths = np.fromiter((len(row) for row in ids), dtype=np.int64, count=len(ids))
    order = np.argsort(lengths, kind="stable")
    out = np.zeros((len(texts), dim), dtype=np.float32)
    with torch.inference_mode():
        i = 0
        while i < len(order):
            length = int(lengths[order[i]])
            rows = max(1, BATCH_TOKENS // length)
            j = i + 1
            while j < len(order) and j - i < rows and lengths[order[j]] == length:
                j += 1
            picked = order[i:j]
            batch = torch.tensor([ids[k] for k in picked], dtype=torch.long)
            out[picked] = lean(batch).numpy()
            i = j
    return out
