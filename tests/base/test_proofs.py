"""Browser proofs and release signers: the shared vectors (pointers, the key index's buckets and
the answer objects they name), the tree, and signing through KMS."""

from __future__ import annotations

import base64
import json
from datetime import datetime
from hashlib import sha256
from pathlib import Path
from typing import Any

import pytest

from base.answer_objects import (
    answer_object,
    answer_object_problem,
    bucket_entries,
    bucket_entry,
    bucket_file,
    bucket_leaf,
    bucket_of,
    bucket_path,
    bucket_problem,
    canonical_json,
    object_path,
)
from base.keys import key
from base.pointers import client_verdict, signed_root
from base.proofs import leaf, proof_root, tree
from base.signing import (
    KmsSigner,
    LocalSigner,
    SignatureError,
    generate_keypair,
    parse_public_keys,
    sign_statement,
    statement,
    verify_statement,
)

VECTORS = json.loads((Path(__file__).parents[1] / "vectors" / "proofs.json").read_text())


@pytest.mark.parametrize("case", VECTORS["pointers"], ids=lambda c: c["name"])
def test_a_pointer_yields_a_root_only_when_signed_for_this_profile_and_version(
    case: dict[str, Any],
) -> None:
    found = signed_root(case["pointer"], VECTORS["profile"], tuple(VECTORS["public_keys"]))
    assert found == case["root"]


@pytest.mark.parametrize("case", VECTORS["pointers"], ids=lambda c: c["name"])
def test_a_client_reads_the_cdn_only_under_a_fresh_pointer_no_older_than_one_it_saw(
    case: dict[str, Any],
) -> None:
    seen = case["newest"]
    newest = (seen["sequence"], seen["manifest_sha256"]) if seen else None
    now = datetime.fromisoformat(VECTORS["now"])
    keys = tuple(VECTORS["public_keys"])
    signed, problem = client_verdict(case["pointer"], VECTORS["profile"], keys, newest, now)
    assert problem == case["problem"]
    assert (signed.answers_root if signed else None) == case["root"]


def _cdn(changes: dict[str, str | None]) -> dict[str, bytes]:
    """The vectors' CDN, a path to its bytes, with ``changes`` made (None: the file removed)."""
    files = {path: text.encode() for path, text in VECTORS["files"].items()}
    for path, text in changes.items():
        if text is None:
            files.pop(path, None)
        else:
            files[path] = text.encode()
    return files


def _look_up(files: dict[str, bytes], wanted: str) -> tuple[str | None, str | None, str | None]:
    """What a client reading ``files`` for key ``wanted`` under the vectors' release concludes,
    by the rule of docs/release-format.md: (stage, problem, answer)."""
    profile, version, root = VECTORS["profile"], VECTORS["version"], VECTORS["root"]
    bucket = bucket_of(wanted)
    data = files.get(f"{profile}/releases/{version}/{bucket_path(bucket)}")
    if data is None:
        return "bucket", "missing", None
    try:
        found = json.loads(data)
    except ValueError:
        return "bucket", "malformed", None
    problem = bucket_problem(found, bucket, profile, version, root)
    if problem is not None:
        return "bucket", problem, None
    digest = bucket_entry(found, wanted)
    if digest is None:
        return "entry", "unlisted", None
    data = files.get(f"{profile}/{object_path(digest)}")
    if data is None:
        return "object", "missing", None
    problem = answer_object_problem(data, wanted, profile, digest, VECTORS["now_s"])
    if problem is not None:
        return "object", problem, None
    return None, None, json.loads(data)["answer"]


@pytest.mark.parametrize("case", VECTORS["lookups"], ids=lambda c: c["name"])
def test_an_answer_is_shown_only_through_a_proved_bucket_and_its_object_s_digest(
    case: dict[str, Any],
) -> None:
    assert key(case["question"]) == case["key"]  # the key spec's key
    found = _look_up(_cdn(case["changes"]), case["key"])
    assert found == (case["stage"], case["problem"], case["answer"])


@pytest.mark.parametrize("case", VECTORS["buckets"], ids=lambda c: c["name"])
def test_a_bucket_is_read_only_when_it_is_the_one_asked_for_and_proves_itself(
    case: dict[str, Any],
) -> None:
    profile, version, root = VECTORS["profile"], VECTORS["version"], VECTORS["root"]
    assert bucket_problem(case["file"], case["bucket"], profile, version, root) == case["problem"]


@pytest.mark.parametrize("case", VECTORS["entries"], ids=lambda c: c["name"])
def test_a_bucket_names_a_key_s_object_only_on_the_key_s_own_line(case: dict[str, Any]) -> None:
    assert bucket_entry({"entries": case["entries"]}, case["key"]) == case["sha256"]


def test_the_tree_builds_the_vectors_buckets() -> None:
    """The release of the vectors, made again by the publisher's functions: the same objects,
    the same bucket files byte for byte, the same root."""
    profile, version = VECTORS["profile"], VECTORS["version"]
    prefix = f"{profile}/releases/{version}/"
    files = VECTORS["files"]
    buckets = {p[len(prefix) :]: json.loads(t) for p, t in files.items() if p.startswith(prefix)}
    names = sorted(b["bucket"] for b in buckets.values())
    entries = {b["bucket"]: b["entries"] for b in buckets.values()}
    pairs = [line.split(" ") for name in names for line in entries[name].splitlines()]
    for found_key, digest in pairs:  # each object, rebuilt from its fields, is its own address
        data = files[f"{profile}/{object_path(digest)}"].encode()
        obj = json.loads(data)
        row = {
            **obj,
            "expires_at": datetime.fromisoformat(obj["expires_at"]),
            "generated_at": datetime.fromisoformat(obj["generated_at"]),
        }
        assert answer_object(row, profile) == canonical_json(obj) == data
        assert sha256(data).hexdigest() == digest and obj["key"] == found_key
    for name in names:
        lines = [tuple(line.split(" ")) for line in entries[name].splitlines()]
        assert bucket_entries(lines) == entries[name] and lines == sorted(lines)
        assert all(bucket_of(k) == name for k, _ in lines)
    leaves = [bucket_leaf(profile, version, name, entries[name]) for name in names]
    root, proofs = tree(leaves)
    assert root == VECTORS["root"]
    for name, proof in zip(names, proofs, strict=True):
        made = bucket_file(profile, version, name, entries[name], proof)
        assert made.decode() == files[f"{prefix}{bucket_path(name)}"]
    for size in (1, 2, 3, 6, 7, 8, 9, 33):  # odd levels at every depth
        leaves_n = [leaf([str(i), "p", "v", "e"]) for i in range(size)]
        root_n, proofs_n = tree(leaves_n)
        assert all(proof_root(x, p) == root_n for x, p in zip(leaves_n, proofs_n, strict=True))
        if size > 1:
            assert proof_root(leaves_n[0], proofs_n[1]) != root_n


class _FakeKms:
    """A KMS client answering GetPublicKey and Sign as AWS does for an ECC_NIST_EDWARDS25519 key
    (moto does not emulate that key spec), with the private key held here."""

    def __init__(self, private_key: str, spec: str = "ECC_NIST_EDWARDS25519") -> None:
        self._signer, self.spec = LocalSigner(private_key), spec
        self.calls: list[dict[str, Any]] = []

    def get_public_key(self, KeyId: str) -> dict[str, Any]:
        der = bytes.fromhex("302a300506032b6570032100")
        der += base64.b64decode(self._signer.public_key)
        return {"KeyId": KeyId, "KeySpec": self.spec, "PublicKey": der}

    def sign(self, **request: Any) -> dict[str, Any]:
        self.calls.append(request)
        return {"KeyId": request["KeyId"], "Signature": self._signer.sign(request["Message"])}


def test_a_kms_key_signs_the_statement_and_its_der_public_key_verifies() -> None:
    private, public = generate_keypair()
    kms = _FakeKms(private)
    signer = KmsSigner("alias/edgeqa-releases", client=kms)
    assert signer.public_key == public
    text = statement("bank", "v1", "ab" * 32, "cd" * 32)
    signed = sign_statement(text, signer)
    (call,) = kms.calls
    assert call["Message"] == text and len(text) <= 4096  # KMS signs at most 4 KiB
    assert call["SigningAlgorithm"] == "ED25519_SHA_512" and call["MessageType"] == "RAW"
    # readers may be given the key as KMS prints it (DER) or raw
    der = base64.b64encode(kms.get_public_key("k")["PublicKey"]).decode()
    assert parse_public_keys(f"{der}, {public}") == (public, public)
    assert verify_statement(signed, parse_public_keys(der))["answers_root"] == "cd" * 32
    with pytest.raises(SignatureError, match="not ECC_NIST_EDWARDS25519"):
        KmsSigner("k", client=_FakeKms(private, spec="ECC_NIST_P256"))
