"""The writing system of a text: which script most of its letters are in (``script_of``), and
whether a letter is CJK (``is_cjk``). Language routing (``base/languages.py``) and the degenerate
answer rule (``policy/answers.py``) decide with it."""

from __future__ import annotations

import re
from collections import Counter

LETTER = re.compile(r"[^\W\d_]")


def is_cjk(code: int) -> bool:
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
    for letter in LETTER.findall(text):
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
        elif is_cjk(code):
            counts["cjk"] += 1
        else:
            counts["other"] += 1
    if not counts:
        return None
    return counts.most_common(1)[0][0]
