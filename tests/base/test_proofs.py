"""Browser proofs and release signers: the shared vectors, the tree, and signing through KMS."""

from __future__ import annotations

import base64
import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from base.answer_objects import answer_object_problem
from base.pointers import client_verdict, signed_root
from base.proofs import leaf, object_leaf, proof_root, tree
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


@pytest.mark.parametrize("case", VECTORS["objects"], ids=lambda c: c["name"])
def test_an_answer_object_is_shown_only_when_it_proves_itself(case: dict[str, Any]) -> None:
    problem = answer_object_problem(
        case["object"],
        case["key"],
        VECTORS["profile"],
        VECTORS["version"],
        VECTORS["now_s"],
        root=VECTORS["root"],
    )
    assert problem == case["problem"]


def test_the_tree_builds_the_vectors_proofs() -> None:
    objects = [c["object"] for c in VECTORS["objects"][:5]]
    leaves = [object_leaf(o) for o in objects]
    assert all(found is not None for found in leaves)
    root, proofs = tree(leaves)  # type: ignore[arg-type]
    assert root == VECTORS["root"]
    assert proofs == [o["proof"] for o in objects]
    for size in (1, 2, 3, 6, 7, 8, 9, 33):  # odd levels at every depth
        leaves_n = [leaf([str(i), "p", "v", "e", "a"]) for i in range(size)]
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
