"""Which language profile a question belongs to: one definition, mirrored in ``web/edgeqa.js``.

A question is routed by the script most of its letters are in: CJK (Han, kana, hangul) to the
``zh`` profile, anything else to ``en``. The web client, the Python client, the edge, the origin
and the nightly job all decide with this rule (shared cases: ``tests/vectors/languages.json``),
so a question is mined, published and looked up under the same profile.
"""

from __future__ import annotations

import re
from collections import Counter

LANGUAGES = ("en", "zh")
DEFAULT_LANGUAGE = "en"

_LETTER = re.compile(r"[^\W\d_]")


def _cjk(code: int) -> bool:
    """Han (with its extensions and compatibility ideographs), kana, hangul."""
    return (
        0x3040 <= code < 0xA000
        or 0xAC00 <= code < 0xD7B0
        or 0xF900 <= code < 0xFB00
        or 0x20000 <= code < 0x32000
    )


def script_of(text: str) -> str | None:
    """The script most of ``text``'s letters are in: ``cjk``, ``latin``, ``cyrillic``,
    ``hebrew``, ``arabic``, ``indic`` or ``other``; None without letters."""
    counts: Counter[str] = Counter()
    for letter in _LETTER.findall(text):
        code = ord(letter)
        if code < 0x250:
            counts["latin"] += 1
        elif 0x400 <= code < 0x530:
            counts["cyrillic"] += 1
        elif 0x590 <= code < 0x600:
            counts["hebrew"] += 1
        elif 0x600 <= code < 0x780:
            counts["arabic"] += 1
        elif 0x900 <= code < 0xE00:
            counts["indic"] += 1
        elif _cjk(code):
            counts["cjk"] += 1
        else:
            counts["other"] += 1
    if not counts:
        return None
    return counts.most_common(1)[0][0]


def language_of(text: str) -> str:
    """The language profile ``text`` is looked up and mined under: ``zh`` when CJK letters are
    at least as many as any other script's, else ``en``."""
    if text.isascii():  # no CJK letter: the common case, decided without a look at each letter
        return DEFAULT_LANGUAGE
    counts: Counter[str] = Counter()
    for letter in _LETTER.findall(text):
        counts["zh" if _cjk(ord(letter)) else "other"] += 1
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
