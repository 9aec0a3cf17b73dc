"""Which language profile a question belongs to: one definition, mirrored in ``web/edgeqa.js``.

A question is routed by the script most of its letters are in: CJK (Han, kana, hangul) to the
``zh`` profile, anything else to ``en``. The web client, the Python client, the edge, the origin
and the nightly job all decide with this rule (shared cases: ``tests/vectors/languages.json``),
so a question is mined, published and looked up under the same profile.
"""

from __future__ import annotations

from collections import Counter

from policy.scripts import LETTER, is_cjk

LANGUAGES = ("en", "zh")
DEFAULT_LANGUAGE = "en"


def language_of(text: str) -> str:
    """The language profile ``text`` is looked up and mined under: ``zh`` when CJK letters are
    at least as many as any other script's, else ``en``."""
    if text.isascii():  # no CJK letter: the common case, decided without a look at each letter
        return DEFAULT_LANGUAGE
    counts: Counter[str] = Counter()
    for letter in LETTER.findall(text):
        counts["zh" if is_cjk(ord(letter)) else "other"] += 1
    return "zh" if counts["zh"] and counts["zh"] >= counts["other"] else DEFAULT_LANGUAGE


def parse_languages(value: str) -> tuple[str, ...]:
    """``"en,zh"`` as a tuple of known languages, in order, each once; ``ValueError`` naming an
    unknown one."""
    languages: list[str] = []
    for item in value.split(","):
        name = item.strip().lower()
        if not name:
            continue
        if name not in LANGUAGES:
            raise ValueError(f"unknown language {name!r} (known: {', '.join(LANGUAGES)})")
        if name not in languages:
            languages.append(name)
    if not languages:
        raise ValueError("names no language")
    return tuple(languages)
