"""The language rule: which profile a question is mined, published and looked up under."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from base.languages import language_of, parse_languages
from policy.scripts import script_of

VECTORS = Path(__file__).parents[1] / "vectors" / "languages.json"


@pytest.mark.parametrize("vector", json.loads(VECTORS.read_text("utf-8"))["vectors"])
def test_shared_vectors(vector: dict[str, str]) -> None:
    assert language_of(vector["text"]) == vector["language"]


def test_scripts() -> None:
    assert script_of("我的卡不能用") == "cjk"
    assert script_of("my card") == "latin"
    assert script_of("Как дела") == "cyrillic"
    assert script_of("1234 ?!") is None


def test_languages_setting_is_checked() -> None:
    assert parse_languages(" ZH, en ,zh") == ("zh", "en")
    with pytest.raises(ValueError, match="unknown language 'fr'"):
        parse_languages("en,fr")
    with pytest.raises(ValueError, match="names no language"):
        parse_languages(" , ")
