"""Merkle proofs: how a browser checks the key index of a release against its signature.

The manifest's signature (``signing.py``) covers every byte of a release for the edge and the
origin, which read the manifest and its shards. A browser reads only ``current.json``, one
bucket of the release's key index and one answer object (``answer_objects.py``), so every bucket
carries a Merkle proof to the release's ``answers_root``, which the signed pointer names; the
bucket names the sha256 of each of its keys' objects. One signature per release covers millions
of answers; a client checks a bucket with about 15 SHA-256s and an object with one.

- leaf(fields) = SHA-256(0x00 || SHA-256(field 1) || SHA-256(field 2) || ...), each field UTF-8,
  exactly as the document spells it (a bucket's: ``answer_objects.BUCKET_FIELDS``);
- node(l, r) = SHA-256(0x01 || l || r) (the prefixes keep a leaf from passing for a node);
- leaves in bucket order; a level's odd last node moves up unchanged;
- ``proof``: the siblings from the leaf up, each ``"l<hex>"`` (the sibling is on the left) or
  ``"r<hex>"``; the empty release's root is SHA-256 of nothing.

``web/edgeqa.js`` implements the same check; ``tests/vectors/proofs.json`` holds both to it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from typing import Any

MAX_PROOF_STEPS = 64
_SIZE = 32  # a SHA-256
_STEP = re.compile(r"[lr][0-9a-f]{64}")


def leaf(fields: Sequence[str]) -> bytes:
    """The leaf hash of an object's ``LEAF_FIELDS`` values, in that order."""
    parts = b"".join(hashlib.sha256(value.encode()).digest() for value in fields)
    return hashlib.sha256(b"\x00" + parts).digest()


def _node(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


class MerkleTree:
    """The levels of the tree over ``leaves`` (32 bytes a node, one ``bytes`` a level: 64 MB
    at a million leaves), and each leaf's proof made when it is asked for, so a release of
    millions of objects never holds millions of proofs at once."""

    def __init__(self, leaves: Iterable[bytes]) -> None:
        first = bytearray()
        for value in leaves:
            first += value
        level = bytes(first)
        self._levels = [level]
        while len(level) > _SIZE:
            count = len(level) // _SIZE
            up = bytearray()
            for i in range(0, count - 1, 2):
                up += _node(
                    level[i * _SIZE : (i + 1) * _SIZE], level[(i + 1) * _SIZE : (i + 2) * _SIZE]
                )
            if count % 2:
                up += level[-_SIZE:]
            level = bytes(up)
            self._levels.append(level)

    def __len__(self) -> int:
        return len(self._levels[0]) // _SIZE

    @property
    def root(self) -> str:
        """The root (hex); the empty tree's is SHA-256 of nothing."""
        return self._levels[-1].hex() if self._levels[-1] else hashlib.sha256(b"").hexdigest()

    def proof(self, index: int) -> list[str]:
        """Leaf ``index``'s siblings from the leaf up, each ``"l<hex>"`` or ``"r<hex>"``."""
        if not 0 <= index < len(self):
            raise IndexError(f"leaf {index} of a tree of {len(self)}")
        proof, at = [], index
        for level in self._levels[:-1]:
            sibling = at ^ 1
            if sibling < len(level) // _SIZE:
                node = level[sibling * _SIZE : (sibling + 1) * _SIZE]
                proof.append(("l" if sibling < at else "r") + node.hex())
            at //= 2
        return proof


def tree(leaves: Sequence[bytes]) -> tuple[str, list[list[str]]]:
    """The root (hex) over ``leaves`` and each leaf's proof (``MerkleTree``, every proof)."""
    built = MerkleTree(leaves)
    return built.root, [built.proof(i) for i in range(len(built))]


def proof_root(leaf_hash: bytes, proof: Any) -> str | None:
    """The root ``proof`` leads ``leaf_hash`` to; None when the proof is malformed."""
    if not isinstance(proof, list) or len(proof) > MAX_PROOF_STEPS:
        return None
    node = leaf_hash
    for step in proof:
        if not isinstance(step, str) or not _STEP.fullmatch(step):
            return None
        sibling = bytes.fromhex(step[1:])
        node = _node(sibling, node) if step[0] == "l" else _node(node, sibling)
    return node.hex()
