"""The missed-hint a client sends the origin after a miss at the edge: its form, on the vectors
the web client is checked against too (``web/test/missed.test.mjs``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from edge_index.tiers import Missed, missed_hint, parse_missed

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
