"""Optional in-domain fine-tuning of the embedder on labelled phrasings (CPU is enough).

Phrasings with the same label (the same cached answer) are pulled together and phrasings of other
labels pushed apart with sentence-transformers' ``MultipleNegativesRankingLoss``: each batch holds
one (anchor, positive) pair per label, from distinct labels, so every other pair in the batch is a
true negative. The tuned model is saved as a sentence-transformers folder; ``model_digest`` names
it (sha256 over its files) for the release manifest.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer


def finetune(
    model: SentenceTransformer,
    texts: Sequence[str],
    labels: Sequence[str],
    steps: int = 150,
    batch_size: int = 64,
    learning_rate: float = 8e-5,
    seed: int = 0,
) -> SentenceTransformer:
    """Fine-tune ``model`` in place and return it (in eval mode)."""
    import torch
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    by_label: dict[str, list[str]] = {}
    for text, label in zip(texts, labels, strict=True):
        by_label.setdefault(label, []).append(text)
    usable = [label for label, group in by_label.items() if len(group) >= 2]
    if len(usable) < 2:
        raise ValueError("fine-tuning needs at least two labels with two phrasings or more each")
    batch = min(batch_size, len(usable))
    rng = random.Random(seed)
    torch.manual_seed(seed)
    loss = MultipleNegativesRankingLoss(model, scale=20.0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)
    model.train()
    for _ in range(steps):
        anchors, positives = [], []
        for label in rng.sample(usable, batch):
            anchor, positive = rng.sample(by_label[label], 2)
            anchors.append(anchor)
            positives.append(positive)
        features = [model.preprocess(anchors), model.preprocess(positives)]
        value = loss(features, torch.empty(0))
        optimizer.zero_grad()
        value.backward()
        optimizer.step()
    model.eval()
    return model


def model_digest(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
        digest.update(path.relative_to(folder).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()
