"""Clustering the night's wordings into questions (mining's rule 5, ``mining.py``): near-duplicates
grouped greedily, most asked first, at the embedder's cluster threshold."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from edge_index.guard import numbers
from precompute.config import MiningConfig
from precompute.questions import Phrasing

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

CLUSTER_Z = 6.8  # all-MiniLM-L6-v2 on banking77: median 0.21 + 6.8 x MAD 0.10 = its 0.9


def estimated_cluster_threshold(vectors: Any, sample: int = 2000) -> float:
    """For an embedder without a measured scale (a folder): the night's pairwise cosines'
    median plus ``CLUSTER_Z`` robust deviations (MAD), clipped to [0.85, 0.99] — most pairs are
    different questions, so this sits where only their far tail reaches."""
    import numpy as np

    picked = vectors[:: max(1, len(vectors) // sample)][:sample]
    if len(picked) < 8:
        return 0.99
    scores = (picked @ picked.T)[np.triu_indices(len(picked), 1)]
    median = float(np.median(scores))
    spread = float(np.median(np.abs(scores - median)))
    return float(min(0.99, max(0.85, median + CLUSTER_Z * spread)))


def cluster(
    phrasings: list[Phrasing], embedder: SentenceTransformer | None, config: MiningConfig
) -> list[list[Phrasing]]:
    """Greedy clustering, most popular first: each unassigned phrasing opens a cluster and takes
    every unassigned neighbour at cosine >= threshold whose numbers match."""
    if not phrasings:
        return []
    order = sorted(phrasings, key=lambda p: (-p.askers, -p.hits, p.key))
    if embedder is None or len(order) == 1:
        return [[p] for p in order]
    import faiss
    import numpy as np

    vectors = embedder.encode(
        [p.normalized for p in order],
        batch_size=config.embed_batch,
        normalize_embeddings=True,
        convert_to_numpy=True,
        show_progress_bar=False,
    ).astype(np.float32)
    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(vectors)
    threshold = config.cluster_threshold
    if threshold is None:
        threshold = estimated_cluster_threshold(vectors)
    lims, _scores, ids = index.range_search(vectors, threshold)
    assigned = [False] * len(order)
    clusters = []
    for i, head in enumerate(order):
        if assigned[i]:
            continue
        assigned[i] = True
        members = [head]
        head_numbers = numbers(head.normalized)
        neighbours = sorted(
            (int(j) for j in ids[lims[i] : lims[i + 1]] if int(j) != i), key=lambda j: j
        )
        for j in neighbours:
            if not assigned[j] and numbers(order[j].normalized) == head_numbers:
                assigned[j] = True
                members.append(order[j])
        clusters.append(members)
    return clusters
