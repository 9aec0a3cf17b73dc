"""Writes proofs.json: signed pointers and answer objects with Merkle proofs, and what a client
must conclude from each (base/pointers.py signed_root and client_verdict,
base/answer_objects.py answer_object_problem; web/edgeqa.js signedRoot, pointerVerdict and
answerObjectProblem).

The hashes follow docs/release-format.md#browser-proofs and are computed here with hashlib and
cryptography alone, so the file does not depend on the implementation it tests. The signing key
is derived from a fixed phrase, and Ed25519 is deterministic: the file is the same on every run.
Run: python tests/vectors/make_proofs.py
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

PROFILE = "bank"
VERSION = "20261130T000000Z-abc12345"
NOW = "2026-12-01T00:00:00+00:00"
NOW_S = 1796083200.0
QUESTIONS = [
    ("How do I freeze my card?", "In the app: Cards, then Freeze.", "2026-12-07T00:00:00+00:00"),
    ("How do I reset my PIN?", "At any ATM, with your card.", "2026-12-08T00:00:00+00:00"),
    ("Where is my statement?", "Under Documents.", "2026-12-07T12:00:00+00:00"),
    ("我的卡被冻结了怎么办？", "请在应用中解冻。", "2026-12-09T00:00:00+00:00"),
    ("Was ist meine IBAN?", "Unter Konto → Details.", "2026-11-30T12:00:00+00:00"),  # expired
]


def _key(private: Ed25519PrivateKey) -> str:
    raw = private.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    return base64.b64encode(raw).decode()


def _leaf(obj: dict[str, Any]) -> bytes:
    fields = [obj[n] for n in ("key", "profile", "version", "expires_at", "answer")]
    return hashlib.sha256(
        b"\x00" + b"".join(hashlib.sha256(f.encode()).digest() for f in fields)
    ).digest()


def _node(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def _signed(private: Ed25519PrivateKey, statement: dict[str, Any]) -> dict[str, str]:
    text = json.dumps(statement, sort_keys=True, separators=(",", ":"))
    public = base64.b64decode(_key(private))
    return {
        "alg": "ed25519",
        "key_id": hashlib.sha256(public).hexdigest()[:16],
        "signature": base64.b64encode(private.sign(text.encode())).decode(),
        "statement": text,
    }


def main() -> None:
    trusted = Ed25519PrivateKey.from_private_bytes(hashlib.sha256(b"edgeqa vectors").digest())
    other = Ed25519PrivateKey.from_private_bytes(hashlib.sha256(b"someone else").digest())
    objects = []
    for question, answer, expires in QUESTIONS:
        key = hashlib.sha256(question.lower().encode()).hexdigest()
        objects.append(
            {
                "key": key,
                "question": question,
                "answer": answer,
                "version": VERSION,
                "profile": PROFILE,
                "generated_at": "2026-11-29T00:00:00+00:00",
                "expires_at": expires,
            }
        )
    # five leaves: (0 1) (2 3) 4 -> ((01)(23)) 4 -> root; leaf 4 moves up unchanged twice
    leaves = [_leaf(o) for o in objects]
    n01, n23 = _node(leaves[0], leaves[1]), _node(leaves[2], leaves[3])
    n0123 = _node(n01, n23)
    root = _node(n0123, leaves[4]).hex()
    proofs = [
        ["r" + leaves[1].hex(), "r" + n23.hex(), "r" + leaves[4].hex()],
        ["l" + leaves[0].hex(), "r" + n23.hex(), "r" + leaves[4].hex()],
        ["r" + leaves[3].hex(), "l" + n01.hex(), "r" + leaves[4].hex()],
        ["l" + leaves[2].hex(), "l" + n01.hex(), "r" + leaves[4].hex()],
        ["l" + n0123.hex()],
    ]
    for obj, proof in zip(objects, proofs, strict=True):
        obj["proof"] = proof

    statement = {
        "answers_root": root,
        "format": "edgeqa-release-statement/1",
        "manifest_sha256": hashlib.sha256(b"a manifest").hexdigest(),
        "profile": PROFILE,
        "version": VERSION,
    }
    good = {"version": VERSION, "manifest_sha256": statement["manifest_sha256"]}
    pointers: list[dict[str, Any]] = []

    def pointer(
        name: str,
        value: Any,
        expected: str | None,
        problem: str | None = "unsigned",
        newest: dict[str, Any] | None = None,
    ) -> None:
        """``root``: what signed_root gives; ``problem``: client_verdict's, at ``now`` after
        verifying ``newest`` ({sequence, manifest_sha256}) before."""
        case = {"name": name, "pointer": value, "root": expected, "problem": problem}
        pointers.append({**case, "newest": newest})

    # a release's own statement (signed before pointers had one): no sequence, never fresh
    pointer("signed", {**good, "signed": _signed(trusted, statement)}, root, "stale")
    pointer("unsigned", dict(good), None)
    pointer("signed by another key", {**good, "signed": _signed(other, statement)}, None)
    pointer(
        "another profile's statement",
        {**good, "signed": _signed(trusted, {**statement, "profile": "shop"})},
        None,
    )
    pointer(
        "an older version's statement under a newer pointer",
        {**good, "version": "20261201T000000Z-def67890", "signed": _signed(trusted, statement)},
        None,
    )
    edited = _signed(trusted, statement)
    edited["statement"] = edited["statement"].replace(root, "0" * 64)
    pointer("statement edited after signing", {**good, "signed": edited}, None)
    pointer(
        "not a release statement",
        {**good, "signed": _signed(trusted, {**statement, "format": "something else"})},
        None,
    )
    pointer("signature not base64", {**good, "signed": {**edited, "signature": "!!"}}, None)
    pointer("signed is a string", {**good, "signed": "yes"}, None)

    # pointer statements (base/pointers.py): a sequence and an expiry
    sequence = 1796000000000  # milliseconds since 1970
    fresh = {
        **statement,
        "format": "edgeqa-pointer/1",
        "sequence": sequence,
        "not_after": "2026-12-02T00:00:00+00:00",
    }
    seen = {"sequence": sequence, "manifest_sha256": good["manifest_sha256"]}
    other_sha = hashlib.sha256(b"another manifest").hexdigest()

    def signed_pointer(**changes: Any) -> dict[str, Any]:
        return {**good, "signed": _signed(trusted, {**fresh, **changes})}

    pointer("a fresh signed pointer", signed_pointer(), root, None)
    pointer("seen before", signed_pointer(), root, None, seen)
    pointer("newer than one seen", signed_pointer(), root, None, {**seen, "sequence": 7})
    pointer("expired", signed_pointer(not_after="2026-11-30T23:59:59+00:00"), root, "stale")
    pointer(
        "older than one seen",
        signed_pointer(),
        root,
        "rollback",
        {**seen, "sequence": 1 + sequence},
    )
    pointer(
        "as old as one seen, another release",
        signed_pointer(),
        root,
        "rollback",
        {**seen, "manifest_sha256": other_sha},
    )
    pointer(
        "a release statement after a pointer statement",
        {**good, "signed": _signed(trusted, statement)},
        root,
        "rollback",
        {**seen, "sequence": 1},
    )
    pointer("sequence not an integer", signed_pointer(sequence=1.5), None)
    pointer("sequence a string", signed_pointer(sequence=str(sequence)), None)
    pointer("sequence zero", signed_pointer(sequence=0), None)
    pointer("sequence past 2**53", signed_pointer(sequence=2**53), None)
    pointer("expiry without a time zone", signed_pointer(not_after="2026-12-02T00:00:00"), None)
    pointer("expiry not a time", signed_pointer(not_after="tomorrow"), None)
    pointer("no expiry", signed_pointer(not_after=None), None)
    pointer("for another manifest", signed_pointer(manifest_sha256=other_sha), None)

    cases: list[dict[str, Any]] = []

    def case(name: str, obj: Any, key: str, problem: str | None) -> None:
        cases.append({"name": name, "object": obj, "key": key, "problem": problem})

    for i, obj in enumerate(objects[:4]):
        case(f"object {i}", obj, obj["key"], None)
    case("object 4, proved but expired", objects[4], objects[4]["key"], "expired")
    forged = {**objects[0], "answer": "Send your PIN to this number."}
    case("answer replaced", forged, objects[0]["key"], "proof")
    case(
        "expiry pushed out",
        {**objects[4], "expires_at": "2027-12-01T00:00:00+00:00"},
        objects[4]["key"],
        "proof",
    )
    case("another object's proof", {**objects[0], "proof": proofs[1]}, objects[0]["key"], "proof")
    case("proof cut short", {**objects[0], "proof": proofs[0][:2]}, objects[0]["key"], "proof")
    unproved = {k: v for k, v in objects[0].items() if k != "proof"}
    case("no proof", unproved, objects[0]["key"], "proof")
    case(
        "proof step not hex",
        {**objects[0], "proof": ["r" + "g" * 64, *proofs[0][1:]]},
        objects[0]["key"],
        "proof",
    )
    case("a proved object under another key", objects[1], objects[0]["key"], "key")
    extra = copy.deepcopy(objects[0])
    extra["note"] = "fields outside the leaf do not matter"
    case("an extra field", extra, objects[0]["key"], None)

    out = {
        "comment": "Signed pointers and proved answer objects (tests/vectors/make_proofs.py)",
        "profile": PROFILE,
        "public_keys": [_key(trusted)],
        "now": NOW,
        "now_s": NOW_S,
        "pointers": pointers,
        "root": root,
        "version": VERSION,
        "objects": cases,
    }
    path = Path(__file__).with_name("proofs.json")
    path.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
