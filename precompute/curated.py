"""Answers an operator supplies (an FAQ), published for the mined questions they answer.

A platform team often has authoritative answers to its commonest questions, or serves a language
its model cannot answer well (the embedded SmolLM2-135M writes no usable Chinese). ``--answers``
(``GenerationConfig.curated_answers``) names a JSON Lines file, local or in a store
(``s3://bucket/path/answers.jsonl``), one ``{"question": ..., "answer": ...}`` per line. A mined
cluster with a phrasing whose key (the key spec: the same question once normalized) is a curated
question's is answered with the curated answer instead of a generated one: its row in the run is
a reused one, ``reused_from: "curated"``, dated at the run. Nothing else changes: the cluster is
mined (k distinct users, no personal data, one turn) like any other, the answer passes the same
checks before it is published (``policy/answers.py``), and a question nobody asked is never
published because it is curated.

The file is pinned: the deployment's settings name the sha256 of the file the operator reviewed
(``EDGEQA_CURATED_ANSWERS_SHA256``; a run cannot bring its own pin), and a file with another
digest — changed in the store after it was reviewed, by whoever may write there — is refused
before a line of it is read, so a tampered file is never published (and never signed by the
nightly job). The file is also refused as a whole, naming the line, when a line is not such an
object, a question is invalid under the key spec, or a question or answer carries personal data
(``pii.py``): what is published must never depend on a half-read file.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from base.errors import EdgeQAError
from base.keys import InvalidQueryError, key
from policy.pii import find_pii
from precompute.generate import reused_row

CURATED = "curated"  # reused_from of a curated answer
MAX_BYTES = 64 * 1024 * 1024
MAX_ANSWER_CHARS = 16_000


class CuratedAnswersError(EdgeQAError, ValueError):
    """The curated answers file cannot be used (it names the line)."""


def read_bytes(uri: str) -> bytes:
    """The file at ``uri``: a path, ``file://...`` or ``s3://bucket/key``."""
    from base.store import open_store

    parsed = urlparse(uri)
    if parsed.scheme == "s3":
        folder, _, name = parsed.path.lstrip("/").rpartition("/")
        return open_store(f"s3://{parsed.netloc}/{folder}").get(name, max_bytes=MAX_BYTES)
    path = Path(parsed.path if parsed.scheme == "file" else uri).expanduser()
    if path.stat().st_size > MAX_BYTES:
        raise CuratedAnswersError(f"{uri} is larger than {MAX_BYTES} bytes")
    return path.read_bytes()


def parse_curated(data: bytes, name: str = "answers") -> dict[str, str]:
    """``{key: answer}`` of a JSON Lines file, read a line at a time (the answer is all a run
    takes: a file at the 64 MB cap is ~100 MB held this way, ~300 MB as a dict per line);
    ``CuratedAnswersError`` naming the first bad line."""
    import io

    curated: dict[str, str] = {}
    for number, raw in enumerate(io.BytesIO(data), 1):
        where = f"{name} line {number}"
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise CuratedAnswersError(f"{name} is not UTF-8 ({where})") from None
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError:
            raise CuratedAnswersError(f"{where} is not JSON") from None
        if not isinstance(item, dict):
            raise CuratedAnswersError(f'{where} must be {{"question": ..., "answer": ...}}')
        question, answer = item.get("question"), item.get("answer")
        if not isinstance(question, str) or not isinstance(answer, str) or not answer.strip():
            raise CuratedAnswersError(f"{where}: question and answer must be non-empty strings")
        if len(answer) > MAX_ANSWER_CHARS:
            raise CuratedAnswersError(f"{where}: the answer exceeds {MAX_ANSWER_CHARS} characters")
        try:
            k = key(question)
        except InvalidQueryError as error:
            raise CuratedAnswersError(f"{where}: {error}") from None
        for field, value in (("question", question), ("answer", answer)):
            kinds = find_pii(value)
            if kinds:
                raise CuratedAnswersError(f"{where}: the {field} carries personal data {kinds}")
        curated[k] = answer
    return curated


def read_curated(uri: str, sha256: str) -> tuple[dict[str, str], str]:
    """The curated answers at ``uri`` and the sha256 of the file (a run depends on it);
    ``CuratedAnswersError`` unless that digest is ``sha256``, the pinned one."""
    if not sha256:
        raise CuratedAnswersError(
            f"{uri} is not pinned: set EDGEQA_CURATED_ANSWERS_SHA256 to the sha256 of the file "
            "you reviewed"
        )
    try:
        data = read_bytes(uri)
    except FileNotFoundError:
        raise CuratedAnswersError(f"no curated answers file at {uri}") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha256.lower():
        raise CuratedAnswersError(
            f"{uri} has sha256 {digest}, not the pinned {sha256.lower()} "
            "(EDGEQA_CURATED_ANSWERS_SHA256): refused, nothing of it is published; if the change "
            "is yours, review the file and pin its new sha256"
        )
    return parse_curated(data, uri), digest


def curated_rows(
    hot: Iterable[Any], curated: dict[str, str], now: datetime
) -> list[dict[str, Any]]:
    """The rows (``generate.answer_schema``) of the mined clusters (``HotQuestion``) a curated
    answer answers: its canonical phrasing's, or else the first other phrasing's."""
    rows = []
    for cluster in hot:
        found = next((curated[p.key] for p in cluster.phrasings if p.key in curated), None)
        if found is None:
            continue
        rows.append(reused_row(cluster, found, now, CURATED))
    return rows
