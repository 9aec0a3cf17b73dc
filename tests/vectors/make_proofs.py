"""Writes proofs.json and answer_objects.json: signed pointers, a release's key index (buckets
with Merkle proofs) and its answer objects addressed by their content, and what a client must
conclude from each (base/pointers.py signed_root and client_verdict; base/answer_objects.py
bucket_problem, bucket_entry and answer_object_problem; web/edgeqa.js signedRoot,
pointerVerdict, bucketProblem, bucketEntry and answerObjectProblem; both clients' exact tier).

Everything is computed here from the text of docs/release-format.md with hashlib and
cryptography alone, so the files do not depend on the implementation they test:

- an answer object's bytes: canonical JSON (sorted keys, no spaces, UTF-8 unescaped) of
  {answer, expires_at, generated_at, key, profile}; it lives at <profile>/a/<sha[:2]>/<sha>.json,
  sha the hex SHA-256 of those bytes;
- a bucket: <profile>/releases/<version>/k/<key[:3]>.json, canonical JSON of {bucket, entries,
  profile, proof, version}, entries a "<key> <sha256>\\n" line per key, sorted by key;
- a bucket's leaf: SHA-256(0x00 || SHA-256(profile) || SHA-256(version) || SHA-256(bucket) ||
  SHA-256(entries)); a node: SHA-256(0x01 || left || right); the leaves in bucket order, a
  level's odd last node moved up; a proof: the siblings from the leaf up, "l<hex>" or "r<hex>";
- the signed answers_root: the root over the release's buckets.

The questions' keys follow docs/key-spec.md: each normalized form is written by hand. The
signing key is derived from a fixed phrase, and Ed25519 is deterministic: the files are the same
on every run. Run: python tests/vectors/make_proofs.py
"""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

PROFILE = "bank"
VERSION = "20261130T000000Z-abc12345"
OTHER_VERSION = "20261201T000000Z-def67890"
NOW = "2026-12-01T00:00:00+00:00"
NOW_S = 1796083200.0
GENERATED = "2026-11-29T00:00:00+00:00"
QUESTIONS = [
    # (question, its normalized form (docs/key-spec.md), answer, expires_at)
    (
        "How do I freeze my card?",
        "how do i freeze my card",
        "In the app: Cards, then Freeze.",
        "2026-12-07T00:00:00+00:00",
    ),
    (
        "How do I reset my PIN?",
        "how do i reset my pin",
        "At any ATM, with your card.",
        "2026-12-08T00:00:00+00:00",
    ),
    (
        "Where is my statement?",
        "where is my statement",
        "Under Documents.",
        "2026-12-07T12:00:00+00:00",
    ),
    (
        "我的卡被冻结了怎么办？",
        "我的卡被冻结了怎么办",
        "请在应用中解冻。",
        "2026-12-09T00:00:00+00:00",
    ),
    (
        "Was ist meine IBAN?",
        "was ist meine iban",
        "Unter Konto → Details.",
        "2026-11-30T12:00:00+00:00",  # expired
    ),
    (
        "When can I replace my debit card?",  # the same bucket as "How do I reset my PIN?"
        "when can i replace my debit card",
        "Any time, under Cards.",
        "2026-12-10T00:00:00+00:00",
    ),
]
# not in the release: one whose bucket the release has (the key is not listed in it), one whose
# bucket it has not (no such file on the CDN)
UNLISTED = ("Is it possible to order a lost card?", "is it possible to order a lost card")
NO_BUCKET = ("Name one planet of the solar system.", "name one planet of the solar system")
FORGED = "Send your PIN to this number."


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def sha(text: str | bytes) -> str:
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()


def answer_object(key: str, answer: str, expires: str, profile: str = PROFILE) -> str:
    return canonical(
        {
            "answer": answer,
            "expires_at": expires,
            "generated_at": GENERATED,
            "key": key,
            "profile": profile,
        }
    )


def object_path(digest: str, profile: str = PROFILE) -> str:
    return f"{profile}/a/{digest[:2]}/{digest}.json"


def bucket_path(bucket: str, version: str = VERSION) -> str:
    return f"{PROFILE}/releases/{version}/k/{bucket}.json"


def entries(pairs: list[tuple[str, str]]) -> str:
    return "".join(f"{key} {digest}\n" for key, digest in sorted(pairs))


def bucket_leaf(profile: str, version: str, bucket: str, text: str) -> bytes:
    fields = (profile, version, bucket, text)
    return hashlib.sha256(
        b"\x00" + b"".join(hashlib.sha256(f.encode()).digest() for f in fields)
    ).digest()


def _node(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def merkle(leaves: list[bytes]) -> tuple[str, list[list[str]]]:
    """The root over ``leaves`` and each leaf's proof, level by level as the spec reads."""
    proofs: list[list[str]] = [[] for _ in leaves]
    at = list(range(len(leaves)))  # each leaf's index in the current level
    level = list(leaves)
    while len(level) > 1:
        for i, index in enumerate(at):
            sibling = index ^ 1
            if sibling < len(level):
                proofs[i].append(("l" if sibling < index else "r") + level[sibling].hex())
            at[i] = index // 2
        up = [_node(level[j], level[j + 1]) for j in range(0, len(level) - 1, 2)]
        level = up + ([level[-1]] if len(level) % 2 else [])
    return (level[0] if level else hashlib.sha256(b"").digest()).hex(), proofs


def bucket_file(
    profile: str, version: str, bucket: str, text: str, proof: list[str]
) -> dict[str, Any]:
    return {
        "bucket": bucket,
        "entries": text,
        "profile": profile,
        "proof": proof,
        "version": version,
    }


def _key(private: Ed25519PrivateKey) -> str:
    raw = private.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    return base64.b64encode(raw).decode()


def _signed(private: Ed25519PrivateKey, statement: dict[str, Any]) -> dict[str, str]:
    text = json.dumps(statement, sort_keys=True, separators=(",", ":"))
    public = base64.b64decode(_key(private))
    return {
        "alg": "ed25519",
        "key_id": hashlib.sha256(public).hexdigest()[:16],
        "signature": base64.b64encode(private.sign(text.encode())).decode(),
        "statement": text,
    }


def release() -> dict[str, Any]:
    """The release: its objects, buckets (files, in bucket order) and root."""
    objects = {}  # key -> (object text, sha)
    for _, normalized, answer, expires in QUESTIONS:
        key = sha(normalized)
        text = answer_object(key, answer, expires)
        objects[key] = (text, sha(text))
    by_bucket: dict[str, list[tuple[str, str]]] = {}
    for key, (_, digest) in objects.items():
        by_bucket.setdefault(key[:3], []).append((key, digest))
    names = sorted(by_bucket)
    texts = [entries(by_bucket[b]) for b in names]
    root, proofs = merkle(
        [bucket_leaf(PROFILE, VERSION, b, t) for b, t in zip(names, texts, strict=True)]
    )
    buckets = {
        b: bucket_file(PROFILE, VERSION, b, t, p)
        for b, t, p in zip(names, texts, proofs, strict=True)
    }
    return {"objects": objects, "buckets": buckets, "root": root}


def pointers(
    trusted: Ed25519PrivateKey, other: Ed25519PrivateKey, root: str
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The pointer cases, and the fresh signed pointer the release is read under."""
    statement = {
        "answers_root": root,
        "format": "edgeqa-release-statement/1",
        "manifest_sha256": hashlib.sha256(b"a manifest").hexdigest(),
        "profile": PROFILE,
        "version": VERSION,
    }
    good = {"version": VERSION, "manifest_sha256": statement["manifest_sha256"]}
    cases: list[dict[str, Any]] = []

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
        cases.append({**case, "newest": newest})

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
        {**good, "version": OTHER_VERSION, "signed": _signed(trusted, statement)},
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
    return cases, signed_pointer()


def bucket_cases(built: dict[str, Any]) -> list[dict[str, Any]]:
    """bucket_problem of each (file, the bucket it is read as) under PROFILE, VERSION and the
    release's root."""
    buckets: dict[str, dict[str, Any]] = built["buckets"]
    names = list(buckets)
    first, second = buckets[names[0]], buckets[names[1]]  # second: two keys
    cases: list[dict[str, Any]] = []

    def case(name: str, file: Any, bucket: str, problem: str | None) -> None:
        cases.append({"name": name, "bucket": bucket, "file": file, "problem": problem})

    for b, file in buckets.items():
        case(f"bucket {b}", file, b, None)
    case("an extra field", {**second, "note": "outside the leaf"}, second["bucket"], None)
    b, text = second["bucket"], second["entries"]
    # valid buckets of other releases: each proves itself to its own release's root
    case("another version's bucket", bucket_file(PROFILE, OTHER_VERSION, b, text, []), b, "version")
    case("another profile's bucket", bucket_file("shop", VERSION, b, text, []), b, "profile")
    case("another bucket of the release", first, b, "bucket")
    case("renamed, its leaf not", {**first, "bucket": b}, b, "proof")
    key, digest = text.splitlines()[0].split(" ")
    forged = sha(answer_object(key, FORGED, "2027-01-01T00:00:00+00:00"))
    case(
        "an entry pointed at another object",
        {**second, "entries": text.replace(digest, forged)},
        b,
        "proof",
    )
    case("an entry removed", {**second, "entries": text.split("\n", 1)[1]}, b, "proof")
    added = entries(
        [*(tuple(line.split(" ")) for line in text.splitlines()), (b + "0" * 61, forged)]
    )
    case("an entry added", {**second, "entries": added}, b, "proof")
    case("the last newline cut", {**second, "entries": text[:-1]}, b, "proof")
    case("another bucket's proof", {**second, "proof": first["proof"]}, b, "proof")
    case("proof cut short", {**second, "proof": second["proof"][:-1]}, b, "proof")
    case("a step too many", {**second, "proof": [*second["proof"], second["proof"][0]]}, b, "proof")
    case(
        "sides swapped",
        {**second, "proof": [("l" if s[0] == "r" else "r") + s[1:] for s in second["proof"]]},
        b,
        "proof",
    )
    case(
        "a step in upper case",
        {**second, "proof": [second["proof"][0].upper(), *second["proof"][1:]]},
        b,
        "proof",
    )
    case("a step not hex", {**second, "proof": ["r" + "g" * 64, *second["proof"][1:]]}, b, "proof")
    case("65 steps", {**second, "proof": [second["proof"][0]] * 65}, b, "proof")
    case("no proof", {k: v for k, v in second.items() if k != "proof"}, b, "proof")
    case("proof a string", {**second, "proof": "".join(second["proof"])}, b, "proof")
    case("entries not text", {**second, "entries": text.splitlines()}, b, "malformed")
    case("no version", {k: v for k, v in second.items() if k != "version"}, b, "malformed")
    case("profile not text", {**second, "profile": 7}, b, "malformed")
    case("a list", [second], b, "malformed")
    case("null", None, b, "malformed")
    return cases


def entry_cases(built: dict[str, Any]) -> list[dict[str, Any]]:
    """bucket_entry of each (entries text, key)."""
    second = list(built["buckets"].values())[1]
    text = second["entries"]
    lines = [line.split(" ") for line in text.splitlines()]
    (k1, d1), (k2, d2) = lines
    cases: list[dict[str, Any]] = []

    def case(name: str, entries_text: str, key: Any, digest: str | None) -> None:
        cases.append({"name": name, "entries": entries_text, "key": key, "sha256": digest})

    case("the first line", text, k1, d1)
    case("the last line", text, k2, d2)
    case("a key not listed", text, k1[:3] + "0" * 61, None)
    case("the bucket's digits alone", text, k1[:3], None)
    case("a key in upper case", text, k1.upper(), None)
    case("a key and a character more", text, k1 + "0", None)
    case("a digest is no key", text, d1, None)
    case("the empty key", text, "", None)
    case("a key not text", text, None, None)
    case("a key inside a line is no entry", f"0{k1} {d2}\n{k2} {d2}\n", k1, None)
    case("after a line that holds it inside", f"0{k1} {d2}\n{k1} {d1}\n", k1, d1)
    case("a digest cut short", f"{k1} {d1[:63]}\n", k1, None)
    return cases


def lookups(built: dict[str, Any]) -> list[dict[str, Any]]:
    """A client asking each question of the CDN (``files``, with ``changes`` made: a path to its
    new text, or None: removed) under the fresh pointer at NOW: the answer shown, or where the
    exact tier gave up (``stage``: bucket, entry or object) and why (``problem``: the function's
    reason, ``missing`` when the file is not there, ``unlisted`` when the bucket lists no such
    key)."""
    objects, buckets = built["objects"], built["buckets"]
    cases: list[dict[str, Any]] = []

    def case(
        name: str,
        question: tuple[str, str],
        changes: dict[str, str | None] | None = None,
        stage: str | None = None,
        problem: str | None = None,
        answer: str | None = None,
    ) -> None:
        cases.append(
            {
                "name": name,
                "question": question[0],
                "key": sha(question[1]),
                "changes": changes or {},
                "stage": stage,
                "problem": problem,
                "answer": answer,
            }
        )

    for question, normalized, answer, expires in QUESTIONS:
        if expires > NOW:
            case(question, (question, normalized), answer=answer)
        else:
            case(f"{question} (expired)", (question, normalized), stage="object", problem="expired")
    case("a key its bucket does not list", UNLISTED, stage="entry", problem="unlisted")
    case("a key of no bucket", NO_BUCKET, stage="bucket", problem="missing")

    q0 = (QUESTIONS[0][0], QUESTIONS[0][1])
    key0 = sha(q0[1])
    text0, digest0 = objects[key0]
    b0 = key0[:3]
    bucket0 = buckets[b0]
    path0, object0 = bucket_path(b0), object_path(digest0)
    q1key = sha(QUESTIONS[1][1])
    forged = answer_object(key0, FORGED, "2027-01-01T00:00:00+00:00")
    forged_path = object_path(sha(forged))

    case("the object replaced", q0, {object0: forged}, "object", "digest")
    case("another key's object in its place", q0, {object0: objects[q1key][0]}, "object", "digest")
    shop = answer_object(key0, QUESTIONS[0][2], QUESTIONS[0][3], profile="shop")
    case("another profile's object in its place", q0, {object0: shop}, "object", "digest")
    case("the object with a newline added", q0, {object0: text0 + "\n"}, "object", "digest")
    case("the object removed", q0, {object0: None}, "object", "missing")
    case("the bucket removed", q0, {path0: None}, "bucket", "missing")
    case("the bucket not JSON", q0, {path0: "{"}, "bucket", "malformed")
    other_version = bucket_file(PROFILE, OTHER_VERSION, b0, bucket0["entries"], [])
    case(
        "another version's bucket in its place",
        q0,
        {path0: canonical(other_version)},
        "bucket",
        "version",
    )
    other_bucket = next(f for b, f in buckets.items() if b != b0)
    case("another bucket in its place", q0, {path0: canonical(other_bucket)}, "bucket", "bucket")
    tampered = {**bucket0, "entries": bucket0["entries"].replace(digest0, sha(forged))}
    case(
        "the bucket's entry pointed at a forged object",
        q0,
        {path0: canonical(tampered), forged_path: forged},
        "bucket",
        "proof",
    )
    case(
        "the bucket with another's proof",
        q0,
        {path0: canonical({**bucket0, "proof": other_bucket["proof"]})},
        "bucket",
        "proof",
    )
    return cases


def object_cases() -> dict[str, Any]:
    """answer_objects.json: answer_object_problem of each object's bytes, fetched for ``key``
    under ``profile`` with the digest its bucket named, at ``now``."""
    key = sha(QUESTIONS[0][1])
    base = {
        "answer": "In the app.",
        "expires_at": "2026-12-07T00:00:00+00:00",
        "generated_at": "2026-11-30T00:00:00+00:00",
        "key": key,
        "profile": PROFILE,
    }
    cases: list[dict[str, Any]] = []

    def case(name: str, data: str | bytes, problem: str | None, digest: str | None = None) -> None:
        """``text``: the bytes, as UTF-8 (``hex`` where they are not UTF-8)."""
        raw = data.encode() if isinstance(data, str) else data
        found = {"name": name, "sha256": sha(raw) if digest is None else digest, "problem": problem}
        if isinstance(data, str):
            found["text"] = data
        else:
            found["hex"] = data.hex()
        cases.append(found)

    def obj(**changes: Any) -> str:
        return canonical({k: v for k, v in {**base, **changes}.items() if v is not ...})

    case("valid", obj(), None)
    case("valid, Z suffix", obj(expires_at="2026-12-07T00:00:00Z"), None)
    case("valid, other offset", obj(expires_at="2026-12-01T09:00:00+08:00"), None)
    case("an answer not ASCII (its UTF-8 hashed)", obj(answer="请在应用中解冻 → Karte"), None)
    case("an extra field", obj(note="not read"), None)
    spaced = json.dumps(dict(reversed(list(base.items()))), ensure_ascii=False, indent=1)
    case("not canonical: the bytes are hashed as they are", spaced, None)
    case("a byte order mark first", "\ufeff" + obj(), None)
    case("expires now", obj(expires_at="2026-12-01T00:00:00+00:00"), "expired")
    case("expired yesterday", obj(expires_at="2026-11-30T00:00:00+00:00"), "expired")
    case("expired, offset", obj(expires_at="2026-12-01T07:59:59+08:00"), "expired")
    case("another key", obj(key=sha("another question")), "key")
    case("no key", obj(key=...), "key")
    case("another profile", obj(profile="shop"), "profile")
    case("bytes not the digest", obj(answer=FORGED), "digest", sha(obj()))
    case("a newline added", obj() + "\n", "digest", sha(obj()))
    case("the digest in upper case", obj(), "digest", sha(obj()).upper())
    case("no digest", obj(), "digest", "")
    case("no answer", obj(answer=...), "malformed")
    case("answer not text", obj(answer=42), "malformed")
    case("answer null", obj(answer=None), "malformed")
    case("no expiry", obj(expires_at=...), "malformed")
    case("naive expiry", obj(expires_at="2026-12-07T00:00:00"), "malformed")
    case("garbage expiry", obj(expires_at="next week"), "malformed")
    case("expiry not text", obj(expires_at=1796601600), "malformed")
    case("not an object", canonical(["In the app."]), "malformed")
    case("null", "null", "malformed")
    case("not JSON", "In the app.", "malformed")
    case("cut short", obj()[:-1], "malformed")
    case("no bytes", "", "malformed")
    case("not UTF-8", obj().encode().replace(b"In the app.", b"In the \xff app."), "malformed")
    return {
        "comment": (
            "Answer objects' bytes and whether a client may show them for key under profile, the "
            "digest its bucket named (base/answer_objects.py answer_object_problem, web/edgeqa.js "
            "answerObjectProblem; tests/vectors/make_proofs.py)"
        ),
        "key": key,
        "profile": PROFILE,
        "now": NOW,
        "now_s": NOW_S,
        "cases": cases,
    }


def main() -> None:
    trusted = Ed25519PrivateKey.from_private_bytes(hashlib.sha256(b"edgeqa vectors").digest())
    other = Ed25519PrivateKey.from_private_bytes(hashlib.sha256(b"someone else").digest())
    built = release()
    assert (
        len(built["buckets"]) == 5
        and len(list(built["buckets"].values())[1]["entries"].splitlines()) == 2
    )
    pointer_cases, fresh = pointers(trusted, other, built["root"])
    files = {f"{PROFILE}/current.json": canonical(fresh)}
    for b, file in built["buckets"].items():
        files[bucket_path(b)] = canonical(file)
    for text, digest in built["objects"].values():
        files[object_path(digest)] = text
    out = {
        "comment": (
            "Signed pointers, a release's key index and its answer objects, and what a client "
            "concludes of each (tests/vectors/make_proofs.py)"
        ),
        "profile": PROFILE,
        "version": VERSION,
        "root": built["root"],
        "public_keys": [_key(trusted)],
        "now": NOW,
        "now_s": NOW_S,
        "pointers": pointer_cases,
        "files": files,
        "buckets": bucket_cases(built),
        "entries": entry_cases(built),
        "lookups": lookups(built),
    }
    folder = Path(__file__).parent
    (folder / "proofs.json").write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    answers = json.dumps(object_cases(), indent=1, ensure_ascii=False)
    (folder / "answer_objects.json").write_text(answers + "\n")


if __name__ == "__main__":
    main()
