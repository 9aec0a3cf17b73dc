"""The exact tier's answer objects: one JSON object per published phrasing, served by the CDN at
``<profile>/releases/<version>/a/<key>.json`` (``release.object_path``), and the one rule every
client applies before showing one (``answer_object_problem``, mirrored in ``web/edgeqa.js``).

An object carries its question, its answer, where it belongs (key, profile, version), its dates
and a Merkle proof (``proofs.py``) that leads it to the release's signed ``answers_root``.
"""

from __future__ import annotations

import json
from typing import Any

from base.proofs import proves


def canonical_json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode()


def answer_fields(row: dict[str, Any], version: str, profile: str) -> list[str]:
    """The values of ``proofs.LEAF_FIELDS`` for one row, as its answer object spells them."""
    return [row["key"], profile, version, row["expires_at"].isoformat(), row["answer"]]


def answer_object(row: dict[str, Any], version: str, profile: str, proof: list[str]) -> bytes:
    """The exact-tier object served by the CDN for one phrasing's key; ``proof`` leads it to
    the release's ``answers_root`` (``proofs.py``)."""
    return canonical_json(
        {
            "key": row["key"],
            "question": row["question"],
            "answer": row["answer"],
            "version": version,
            "profile": profile,
            "generated_at": row["generated_at"].isoformat(),
            "expires_at": row["expires_at"].isoformat(),
            "proof": proof,
        }
    )


def answer_object_problem(
    obj: Any, key: str, profile: str, version: str, now_s: float, root: str | None = None
) -> str | None:
    """Why an answer object fetched from the CDN must not be shown as the answer for ``key``
    (``malformed``, ``proof``, ``key``, ``profile``, ``version``, ``expired``), or None when it
    may. Every client applies this rule (``web/edgeqa.js`` mirrors it, on the vectors in
    ``tests/vectors/answer_objects.json`` and ``proofs.json``): a forged, cached or misplaced
    object, or one past its ``expires_at``, sends the question on to the next layer. ``root``:
    the signed ``answers_root`` of ``version`` (``signing.py``); the object must prove itself
    against it."""
    from datetime import datetime

    if not isinstance(obj, dict) or not isinstance(obj.get("answer"), str):
        return "malformed"
    if root is not None and not proves(obj, root):
        return "proof"
    for name, expected in (("key", key), ("profile", profile), ("version", version)):
        if obj.get(name) != expected:
            return name
    try:
        expires = datetime.fromisoformat(str(obj["expires_at"]))
    except (KeyError, ValueError):
        return "malformed"
    if expires.tzinfo is None:
        return "malformed"
    return "expired" if expires.timestamp() <= now_s else None
