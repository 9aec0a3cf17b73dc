"""Clusters of row numbers (mining's rule 5), held as two flat arrays: what clustering makes
and the k step reads (``clustering.greedy_clusters``, ``mining._qualifying``)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import overload

import numpy as np


class Clusters(Sequence[list[int]]):
    """Clusters of row numbers, each head first, held as two flat arrays (every cluster's rows
    one after another, and where each one ends): 8 bytes a row, where a Python list of ints a
    cluster took ~130 (500,000 clusters: ~65 MB). Read back a cluster at a time as a list."""

    def __init__(self) -> None:
        from array import array

        self._rows, self._ends = array("q"), array("q")

    @classmethod
    def singletons(cls, n: int) -> Clusters:
        """Each of ``n`` rows a cluster of its own."""
        from array import array

        clusters = cls()
        clusters._rows, clusters._ends = array("q", range(n)), array("q", range(1, n + 1))
        return clusters

    @classmethod
    def of_labels(cls, labels: np.ndarray) -> Clusters:
        """Rows grouped by their label (``labels[row]``): each cluster's rows ascending, the
        clusters in the order of their first rows (as the greedy pass opens them: a cluster's
        first row is its most asked)."""
        from array import array

        clusters = cls()
        if not len(labels):
            return clusters
        _, label = np.unique(labels, return_inverse=True)
        first = np.full(int(label.max()) + 1, len(labels), dtype=np.int64)
        np.minimum.at(first, label, np.arange(len(labels), dtype=np.int64))
        order = np.argsort(first[label], kind="stable")  # rows ascending within a cluster
        sizes = np.bincount(label)[np.argsort(first, kind="stable")]
        clusters._rows = array("q", order.astype(np.int64).tobytes())
        clusters._ends = array("q", np.cumsum(sizes).astype(np.int64).tobytes())
        return clusters

    def append(self, members: Sequence[int]) -> None:
        self._rows.extend(members)
        self._ends.append(len(self._rows))

    def __len__(self) -> int:
        return len(self._ends)

    @overload
    def __getitem__(self, at: int) -> list[int]: ...

    @overload
    def __getitem__(self, at: slice) -> list[list[int]]: ...

    def __getitem__(self, at: int | slice) -> list[int] | list[list[int]]:
        if isinstance(at, slice):
            return [self[i] for i in range(*at.indices(len(self)))]
        end = self._ends[at]  # IndexError past the last, as a list
        at = at % len(self)
        return self._rows[self._ends[at - 1] if at else 0 : end].tolist()

    def __iter__(self) -> Iterator[list[int]]:
        start = 0
        for end in self._ends:
            yield self._rows[start:end].tolist()
            start = end

    def rows(self) -> np.ndarray:
        """Every cluster's rows, one cluster after another."""
        return (
            np.frombuffer(self._rows, dtype=np.int64).copy()
            if self._rows
            else np.zeros(0, np.int64)
        )

    def sizes(self) -> np.ndarray:
        """Each cluster's number of rows, in order."""
        ends = np.frombuffer(self._ends, dtype=np.int64) if self._ends else np.zeros(0, np.int64)
        return np.diff(ends, prepend=0)

    def select(self, keep: np.ndarray) -> Clusters:
        """The clusters ``keep`` (a bool per cluster) says, in order: from the flat arrays."""
        from array import array

        sizes = self.sizes()[keep]
        chosen = Clusters()
        chosen._rows = array("q", self.rows()[np.repeat(keep, self.sizes())].tobytes())
        chosen._ends = array("q", np.cumsum(sizes).tobytes())
        return chosen
