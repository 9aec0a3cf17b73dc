"""The missed-hint a client sends the origin after a miss at the edge: its form, on the vectors
the web client is checked against too (``web/test/missed.test.mjs``), and its one home."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from base import missed
from base.missed import Missed, missed_hint, parse_missed

VECTORS = Path(__file__).parents[1] / "vectors" / "missed.json"


CASES = json.loads(VECTORS.read_text("utf-8"))["cases"]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_shared_vectors(case: dict[str, Any]) -> None:
    profile, version, hint = case["profile"], case["version"], case["hint"]
    assert missed_hint(profile, version) == hint
    if hint is not None:  # what a client sends, the origin reads back
        assert parse_missed(hint) == Missed(profile, version)
        assert str(parse_missed(hint)) == hint
    elif isinstance(profile, str) and isinstance(version, str):
        with pytest.raises(ValueError, match="x-edgeqa-missed must be <profile>/<version>"):
            parse_missed(f"{profile}/{version}")


@pytest.mark.parametrize("value", ["", "p", "p/", "/v", "p/v/w", " p/v", "p/v ", "p//v", "p\\v"])
def test_malformed_values_are_refused(value: str) -> None:
    with pytest.raises(ValueError, match="x-edgeqa-missed"):
        parse_missed(value)


def test_the_client_and_the_origin_take_the_contract_from_base() -> None:
    """One definition beside the key spec: the client writes the hint and the origin reads it
    with these very functions, and the edge index keeps no copy of them."""
    from edge_index import tiers
    from edgeqa import client
    from origin.server import protocol

    assert json.loads(VECTORS.read_text("utf-8"))["spec"].startswith("base/missed.py")
    assert (client.MISSED_HEADER, client.missed_hint) == (missed.MISSED_HEADER, missed_hint)
    assert (protocol.MISSED_HEADER, protocol.parse_missed) == (missed.MISSED_HEADER, parse_missed)
    assert not {"MISSED_HEADER", "Missed", "missed_hint", "parse_missed"} & set(vars(tiers))
