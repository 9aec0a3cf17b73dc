"""Writes keys.json: the shared key-spec vectors checked by the Python and JavaScript suites.

Each case is (input, normalized) written by hand from the spec in docs/key-spec.md; the key is
sha256 of the normalized text's UTF-8 computed here with hashlib alone, so the file does not depend
on the implementation it tests. Run: python tests/vectors/make_keys.py
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

CASES: list[tuple[str, str, str]] = [
    # (what it covers, input, normalized)
    ("ascii plain", "What is the capital of France", "what is the capital of france"),
    ("ascii question mark", "What is the capital of France?", "what is the capital of france"),
    ("ascii upper case", "WHAT IS THE CAPITAL OF FRANCE?", "what is the capital of france"),
    ("leading and trailing spaces", "   hello world   ", "hello world"),
    ("inner space runs", "hello     world", "hello world"),
    ("tabs", "hello\tworld", "hello world"),
    ("mixed whitespace run", "hello \t\n \r\n world", "hello world"),
    ("vertical tab and form feed", "a\x0bb\x0cc", "a b c"),
    ("no-break space", "hello\u00a0world", "hello world"),
    ("ideographic space", "hello\u3000world", "hello world"),
    ("narrow no-break and em space", "a\u202fb\u2003c", "a b c"),
    ("line and paragraph separators", "a\u2028b\u2029c", "a b c"),
    ("next line control", "a\x85b", "a b"),
    ("ogham space mark", "a\u1680b", "a b"),
    ("trailing run of marks", "Really?!?!", "really"),
    ("trailing marks with spaces", "is it true ? ! . ", "is it true"),
    ("trailing dots", "and then...", "and then"),
    ("trailing ellipsis char", "and then\u2026", "and then"),
    ("trailing tilde", "see you~~", "see you"),
    ("trailing ideographic full stop", "你好。", "你好"),
    ("chinese question", "北京是中国的首都吗？", "北京是中国的首都吗"),
    ("chinese with spaces", "  你好 ， 世界！ ", "你好 , 世界"),
    ("chinese full-width exclamation", "太好了！！！", "太好了"),
    ("japanese", "東京の人口は？", "東京の人口は"),
    ("full-width latin", "ＷＨＡＴ　ＩＳ　ＡＩ？", "what is ai"),
    ("full-width digits", "１２３４５", "12345"),
    ("half-width katakana", "ｶﾀｶﾅ", "カタカナ"),
    ("ligature", "ﬁnance ﬂow", "finance flow"),
    ("superscript", "x² + y²", "x2 + y2"),
    ("circled digit", "step ①", "step 1"),
    ("roman numeral", "chapter Ⅻ", "chapter xii"),
    ("emoji kept", "I love 🍕!", "i love 🍕"),
    ("emoji only", "🍕🍕", "🍕🍕"),
    ("emoji with skin tone and zwj", "👩🏽‍💻 jobs?", "👩🏽‍💻 jobs"),
    ("inner punctuation kept", "e.g. what's 3.14?", "e.g. what's 3.14"),
    ("inner question mark kept", "why? because!", "why? because"),
    ("url-like inner dots", "is example.com safe?", "is example.com safe"),
    ("leading punctuation kept", "?? why", "?? why"),
    ("comma at end kept", "apples, pears,", "apples, pears,"),
    ("hyphen at end kept", "well -", "well -"),
    ("accented upper", "ÉCOLE ÀÉÎÕÜ", "école àéîõü"),
    ("combining sequence composed", "cafe\u0301?", "caf\u00e9"),
    ("german sharp s kept", "Straße", "straße"),
    ("greek final sigma", "ΟΔΟΣ", "οδος"),
    ("turkish dotted capital i", "İstanbul", "i\u0307stanbul"),
    ("cyrillic", "Привет, Мир!", "привет, мир"),
    ("arabic", "ما هو الذكاء الاصطناعي؟", "ما هو الذكاء الاصطناعي؟"),
    ("korean", "서울 날씨는?", "서울 날씨는"),
    ("full-width question after space", "ok ？", "ok"),
    ("nfkc makes dots", "wait\u2024\u2024", "wait"),
    ("zero width space is not whitespace", "a\u200bb", "a\u200bb"),
    ("single char", "A", "a"),
    ("digits and units", "Is 100 km/h fast?", "is 100 km/h fast"),
]

INVALID: list[tuple[str, str, str]] = [
    ("empty", "", "empty"),
    ("only spaces", "   \t\n ", "empty"),
    ("only marks", "?!...", "empty"),
    ("only full-width marks and ideographic spaces", "\u3000？！。\u3000", "empty"),
    ("too long ascii", "a" * 2049, "too_long"),
    ("too long after nfkc", "\ufdfa" * 200, "too_long"),
]

MAX_QUERY_CHARS = 2048


def main() -> None:
    boundary = "b" * MAX_QUERY_CHARS
    vectors = [
        {
            "name": name,
            "input": text,
            "normalized": normalized,
            "key": hashlib.sha256(normalized.encode("utf-8")).hexdigest(),
        }
        for name, text, normalized in [*CASES, ("exactly the limit", boundary, boundary)]
    ]
    document = {
        "spec": "docs/key-spec.md",
        "max_query_chars": MAX_QUERY_CHARS,
        "vectors": vectors,
        "invalid": [{"name": n, "input": t, "error": e} for n, t, e in INVALID],
    }
    path = Path(__file__).with_name("keys.json")
    path.write_text(json.dumps(document, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {len(vectors)} vectors and {len(INVALID)} invalid cases to {path}")


if __name__ == "__main__":
    main()
