"""Mining's embedding as a Ray Data job: the night's wordings, a block per batch, one embedder
per actor (``encode_chunks``, the lean fp32 forward), the vectors back in order as they come
(``clustering.embed``'s ``encode``)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from precompute.fleet import (
    Fleet,
    FleetError,
    bound_class,
    last_line,
    map_batches,
    pool_size,
    reserve_gpus,
)

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

    from precompute.clustering import Encoder
    from precompute.config import PrecomputeSettings


class _Embedder:
    """One embedder per actor; a batch is a chunk of texts, its vectors the chunk's, in order."""

    def __init__(self, spec: str, cache_dir: Path | None) -> None:
        from semantic.loading import load_embedder

        self.model = load_embedder(spec, cache_dir=cache_dir)

    def __call__(self, batch: pa.Table) -> dict[str, Any]:
        import numpy as np

        from semantic.batch import encode_chunks

        texts = batch.column("text").to_pylist()
        vectors = np.concatenate(list(encode_chunks(self.model, texts)))
        return {"vector": vectors}


@dataclass
class RayEncoder:
    """Embeds texts on the fleet, a chunk at a time, in order (``clustering.embed``'s
    ``encode``); ``where`` says what it ran on once it has."""

    fleet: Fleet
    spec: str
    cache_dir: Path | None
    chunk: int
    where: str = ""

    def __call__(self, texts: Sequence[str], progress: bool = False) -> Iterator[np.ndarray]:
        import numpy as np
        import pyarrow as pa
        import ray.data
        from tqdm import tqdm

        from semantic.loading import resolve_embedder_path

        if not texts:  # nothing to embed: GPUs asked for ahead (``release_encoder``) handed back
            reserve_gpus(self.fleet, 0)
            return
        cache_dir = self.cache_dir if self.fleet.local else None  # a fleet's: its machines' own
        if self.fleet.local:
            resolve_embedder_path(self.spec, cache_dir)  # converted once, here, not per actor
        blocks = [
            pa.table({"text": pa.array(list(texts[i : i + self.chunk]), pa.string())})
            for i in range(0, len(texts), self.chunk)
        ]
        pool = self.fleet.actors(len(blocks))
        dataset = map_batches(
            ray.data.from_arrow(blocks),
            bound_class(_Embedder, spec=self.spec, cache_dir=cache_dir),
            batch_size=self.chunk,  # a block (one chunk) per call
            batch_format="pyarrow",
            **pool,
        )
        del blocks  # in the object store now: not held here too while the night is embedded
        self.where = self.fleet.where(pool_size(pool))
        came = 0
        batches = iter(dataset.iter_batches(batch_size=None, batch_format="numpy"))
        bar = tqdm(total=len(texts), desc="embedding", unit="wording", disable=not progress)
        reserve_gpus(self.fleet, pool_size(pool))
        try:
            while True:
                try:
                    batch = next(batches)
                except StopIteration:
                    break
                except Exception as error:  # past Ray's retries: one line, as generation's
                    where = self.where
                    raise FleetError(f"embedding on {where} failed: {last_line(error)}") from error
                vectors = np.ascontiguousarray(batch["vector"], dtype=np.float32)
                came += len(vectors)
                bar.update(len(vectors))
                yield vectors
        finally:
            bar.close()
            reserve_gpus(self.fleet, 0)
        if came != len(texts):
            raise FleetError(f"the embedding job returned {came} vectors for {len(texts)} texts")


def encoder(fleet: Fleet, spec: str, cache_dir: Path | None) -> RayEncoder:
    """Blocks of ``TOKENIZE_CHUNK`` texts, the chunks ``encode_chunks`` cuts in one process:
    the same rows in each forward, so the same vectors; small enough (4,096) that every actor
    stays busy to the end of the night's wordings."""
    from semantic.batch import TOKENIZE_CHUNK

    return RayEncoder(fleet, spec, cache_dir, TOKENIZE_CHUNK)


def release_encoder(settings: PrecomputeSettings, spec: str) -> RayEncoder | None:
    """What embeds a release's rows (the build, ``build.build_release``'s ``encode``): the
    fleet's GPU workers where the stage runs on a cluster that has them (a Ray Job on the
    fleet, or ``EDGEQA_RAY_ADDRESS``): the generation pool the night has up, idle for the 5
    minutes before the autoscaler lets it go (5M rows: seconds on 80 GPUs, ~20 minutes on the
    CPU worker's cores). None elsewhere (a laptop, a local Ray on CPUs): the build's own
    embedder, no actors to start for the same cores. Ray is joined only where one is named."""
    import os

    from precompute.fleet import connect

    if not (settings.ray_address or os.environ.get("RAY_ADDRESS")) or settings.device == "cpu":
        return None
    fleet = connect(settings)
    if not fleet.gpus:
        return None
    # asked for now, so the generation pool is kept through the rows' gathering; the job hands
    # it back (and a failed build: ``handed_back``)
    reserve_gpus(fleet, fleet.workers)
    return encoder(fleet, spec, settings.cache_dir)


def wordings_encoder(settings: PrecomputeSettings, spec: str, here: bool = False) -> Encoder:
    """What embeds the night's wordings with embedder ``spec``: a Ray job on the fleet
    (``connect``), or, ``here``, the embedder in this process (a run handed a model loaded
    here: a test's, a benchmark's)."""
    from precompute.clustering import local_encoder
    from precompute.fleet import connect
    from semantic.loading import load_embedder

    if here:
        return local_encoder(load_embedder(spec, cache_dir=settings.cache_dir))
    return encoder(connect(settings), spec, settings.cache_dir)
