"""Personal data in a question: what must never be published to the edge.

Detectors (each returns the kinds found, most specific first):
- ``email``: an address with a dotted domain;
- ``card``: 13–19 digits (spaces or dashes allowed between groups) passing the Luhn check;
- ``national_id``: US SSN (``123-45-6789``), UK National Insurance number (``QQ123456C``), an
  IBAN (country code, check digits, 11–30 alphanumerics, mod-97 valid), or any other run of 9+
  digits (account, passport and tax numbers look like this);
- ``phone``: ``+`` and 8–15 digits, or 10–15 digits written with phone separators;
- ``url_secret``: a URL carrying credentials (``user:pass@``) or a query parameter named like a
  secret (token, key, secret, password, signature, code, session, auth...).

Short numbers (amounts, years, "10 pounds", "4 digits") are not personal and pass.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlsplit

KINDS = ("email", "card", "national_id", "phone", "url_secret")

_EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+", re.UNICODE)
_CARD = re.compile(r"(?<![\d])(?:\d[ -]?){12,18}\d(?![\d])")
_SSN = re.compile(r"(?<!\d)\d{3}-\d{2}-\d{4}(?!\d)")
_NINO = re.compile(r"\b[A-CEGHJ-PR-TW-Z]{2}\s?\d{2}\s?\d{2}\s?\d{2}\s?[A-D]\b", re.IGNORECASE)
_IBAN = re.compile(r"\b[A-Z]{2}\d{2}(?:\s?[A-Z0-9]){11,30}\b", re.IGNORECASE)
_LONG_DIGITS = re.compile(r"(?<!\d)\d{9,}(?!\d)")
_PHONE_PLUS = re.compile(r"\+\s?\d(?:[\s().-]?\d){7,14}(?!\d)")
_PHONE = re.compile(r"(?<!\d)\(?\d{2,4}\)?(?:[\s.-]\d{2,4}){2,4}(?!\d)")
_URL = re.compile(r"\b(?:https?|ftp)://[^\s<>\"']+", re.IGNORECASE)
_SECRET_PARAM = re.compile(
    r"(token|key|secret|passw|pwd|sig|signature|auth|session|sid|code|credential|otp)",
    re.IGNORECASE,
)


def luhn_ok(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2 == 1:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


def _iban_ok(text: str) -> bool:
    compact = re.sub(r"\s", "", text).upper()
    if not 15 <= len(compact) <= 34:
        return False
    rearranged = compact[4:] + compact[:4]
    number = "".join(str(int(c, 36)) for c in rearranged)
    return int(number) % 97 == 1


def _url_has_secret(url: str) -> bool:
    try:
        parts = urlsplit(url)
    except ValueError:
        return True  # unparseable URL: do not publish it
    if parts.username or parts.password:
        return True
    for name, _ in parse_qsl(parts.query, keep_blank_values=True):
        if _SECRET_PARAM.search(name):
            return True
    return bool(parts.fragment and _SECRET_PARAM.search(parts.fragment))


def find_pii(text: str) -> list[str]:
    """The kinds of personal data in ``text`` (empty when none)."""
    found: list[str] = []
    urls = _URL.findall(text)
    if any(_url_has_secret(u) for u in urls):
        found.append("url_secret")
    rest = _URL.sub(" ", text)  # digits inside URLs are judged as URLs only
    if _EMAIL.search(rest):
        found.append("email")
    for match in _CARD.finditer(rest):
        digits = re.sub(r"\D", "", match.group())
        if 13 <= len(digits) <= 19 and luhn_ok(digits):
            found.append("card")
            break
    if (
        _SSN.search(rest)
        or _NINO.search(rest)
        or any(_iban_ok(m.group()) for m in _IBAN.finditer(rest))
        or (_LONG_DIGITS.search(rest) and "card" not in found)
    ):
        found.append("national_id")
    if _PHONE_PLUS.search(rest):
        found.append("phone")
    else:
        for match in _PHONE.finditer(rest):
            if 10 <= len(re.sub(r"\D", "", match.group())) <= 15:
                found.append("phone")
                break
    return found


def has_pii(text: str) -> bool:
    return bool(find_pii(text))
