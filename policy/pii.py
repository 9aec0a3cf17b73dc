"""Personal data in a question: what must never be published to the edge.

Kinds (``find_pii`` returns those found, in this order):
- ``email``: an address with a dotted domain whose last label starts with a letter (``a@b.T``
  and ``react@18.2.0`` are code); ``git@host`` is a service account and passes;
- ``card``: 13–19 digits passing the Luhn check, whole or in groups of 3–6 digits (how cards are
  printed) joined by spaces, ``-``, ``.`` or ``/``;
- ``national_id``: a Chinese resident ID (18 characters, the last may be ``X``; check character
  and birth date valid; any spacing), an IBAN (mod-97 valid; spaces or dashes), a UK National
  Insurance number, a Brazilian CPF, a number of 6+ digits after a label such as "account
  number" or "passport", and any other long number: a run of 9+ digits, or 9+ digits in groups
  joined by one kind of separator (US SSNs ``123-45-6789`` and ``123 45 6789``, spaced account,
  passport and tax numbers);
- ``phone``: ``+`` and 8–15 digits, or digits with phone separators shaped like a phone number:
  a parenthesised area code, a trunk ``0`` (``020 7946 0958``, ``06 12 34 56 78``,
  ``010-12345678``, ``(0755) 1234 5678``), North American ``212-555-0147``, China's country code
  without its ``+`` (``86 10 1234 5678``), a Chinese mobile (``138 0013 8000``, ``138-0013-8000``,
  or 11 digits ``1[3-9]...`` written together, in a Chinese sentence or not);
- ``url_secret``: a URL carrying credentials (``user:pass@``) or a query parameter named like a
  secret (token, key, secret, password, signature, code, session, auth...);
- ``jwt``: a JSON Web Token (``eyJ...`` header, payload, signature: three base64url segments);
- ``cloud_key``: an AWS access key id (``AKIA``/``ASIA`` and 16 more) or a 40-character secret
  after a label such as ``aws_secret_access_key``; the documentation's ``...EXAMPLE`` keys pass.

Every detector reads the folded text (``fold``): Unicode NFKC (full-width ``４１１１`` and ``＠``
become ``4111`` and ``@``, no-break and ideographic spaces become spaces), every decimal digit of
any script as its ASCII digit, zero-width and bidi controls dropped, Unicode dashes as ``-``.

Not personal, and passing: short numbers (amounts, years, quantities, "4 digits", ZIP codes),
dates (``2024-03-15``, ``15/03/2024``), times, versions (``3.12.1``, ``10.0.19045.3803``),
decimals, IPv4 addresses (a decision: the ones asked about are private, loopback or well-known
service addresses, and a question is published only once k distinct users typed it), lists of
years, round or evenly spaced numbers (``100 200 300``), round amounts in thousands, toll-free
and UK non-geographic numbers (``1-800-...``, ``0800 ...``, ``0300 ...``), Chinese service
lines (``400-820-8820``, ``4008208820``: companies'; short ones such as ``95588`` are short
numbers), ZIP+4, ISBNs
(labelled or hyphenated ``978-...``, checksum valid), hex digests and UUIDs, CVE ids, DOIs, Unix
timestamps in a question that says so, and long operands of arithmetic (``2^32 = 4294967296``).
Any other bare run of 9+ digits is an identifier ("is 2147483647 prime?" is not published):
missing an account number costs more than one cached question.

Every pattern is linear in the text's length: each either starts only where a token starts or
has bounded repetitions (an e-mail's local part is at most 64 characters, RFC 5321).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from itertools import pairwise
from urllib.parse import parse_qsl, urlsplit

KINDS = ("email", "card", "national_id", "phone", "url_secret", "jwt", "cloud_key")

# a match that was judged is replaced by this: not a digit, separator or word character, so the
# text on either side never joins into one number
_MASK = "\x00"

# format characters NFKC keeps; invisible, so "4111\u200b1111 ..." must read as "41111111 ..."
_INVISIBLE = re.compile(
    "[\u00ad\u061c\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff]"
)
_DASHES = re.compile("[\u2010-\u2015\u2212\ufe58]")  # NFKC keeps these
_OTHER_DIGIT = re.compile(r"(?![0-9])\d")  # a decimal digit of another script (Nd)
_DIGIT = re.compile("[0-9]")

_URL = re.compile(r"\b(?:https?|ftp)://[^\s<>\"']+", re.IGNORECASE)
_SECRET_PARAM = re.compile(
    r"(token|key|secret|passw|pwd|sig|signature|auth|session|sid|code|credential|otp)",
    re.IGNORECASE,
)
# RFC 5321 bounds (local part 64, label 63) keep this linear: without them a long word run
# with no "@" is re-scanned from every position
_EMAIL = re.compile(r"([\w.+-]{1,64})@[\w-]{1,63}(?:[.。][\w-]{1,63})*[.。][^\W\d_][\w-]{1,62}")
_JWT = re.compile(r"(?<![\w-])eyJ[\w-]{10,}+\.[\w-]{2,}+\.[\w-]*+", re.ASCII)
_AWS_KEY_ID = re.compile(r"(?<![A-Za-z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Za-z0-9])")
_AWS_SECRET = re.compile(
    r"(?i:(?:aws)?[ _-]?secret[ _-]?(?:access[ _-]?)?key)[\s\"':=]{0,6}(?:is\s+)?[\"']?"
    r"[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])"
)

_ISBN_LABELLED = re.compile(
    r"\bISBN(?:-?1[03])?[: ]{0,3}(97[89](?:[ -]?[0-9]){10}|[0-9](?:[ -]?[0-9]){8}[ -]?[0-9X])"
    r"(?![0-9A-Za-z])",
    re.IGNORECASE,
)
_ISBN_HYPHENATED = re.compile(
    r"(?<![0-9-])97[89]-[0-9]{1,5}-[0-9]{1,7}-[0-9]{1,7}-[0-9](?![0-9]|-[0-9])"
)
# 6-digit region (first digit 1-8), birth date, 3-digit sequence, check character
_CN_ID = re.compile(r"(?<![0-9A-Za-z])[1-8](?:[ -]?[0-9]){16}[ -]?[0-9Xx](?![0-9A-Za-z])")
_CPF = re.compile(r"(?<![0-9])[0-9]{3}\.[0-9]{3}\.[0-9]{3}-[0-9]{2}(?![0-9])")  # Brazil's
_IBAN = re.compile(r"(?<![0-9A-Za-z])[A-Z]{2}[0-9]{2}(?:[ -]?[A-Z0-9]){11,30}", re.IGNORECASE)
_NINO = re.compile(
    r"(?<![0-9A-Za-z])[A-CEGHJ-PR-TW-Z]{2}[ -]?[0-9]{2}[ -]?[0-9]{2}[ -]?[0-9]{2}[ -]?[A-D]"
    r"(?![0-9A-Za-z])",
    re.IGNORECASE,
)

# a number: digit groups joined by single separators; "-" and "/" only tight ("10 - 5" is math)
_RUN = re.compile(r"(?<![0-9])[0-9]++(?:(?:[ \t]{1,3}|[-/.])[0-9]++)*+")
_GROUP = re.compile(r"[0-9]+")
_SEPARATOR = re.compile(r"[^0-9]+")

_IPV4 = re.compile(r"(?<![0-9.])(?:[0-9]{1,3}\.){3}[0-9]{1,3}(?![0-9]|\.[0-9])")
_DATE = re.compile(
    r"(?<![0-9])(?:([0-9]{4})([-/.])([0-9]{1,2})\2([0-9]{1,2})"
    r"|([0-9]{1,2})([-/.])([0-9]{1,2})\6([0-9]{4}))(?![0-9])"
)
_HEX = re.compile(
    r"(?<![0-9A-Za-z])(?:[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}"
    r"|(?=[0-9]*+[a-fA-F])[0-9a-fA-F]{20,}+)(?![0-9A-Za-z])"
)
_CVE = re.compile(r"\bCVE-[0-9]{4}-[0-9]{4,7}\b", re.IGNORECASE)
_DOI = re.compile(r"\b10\.[0-9]{4,9}/[^\s\"<>]++")
_ZIP4 = re.compile(r"(?<![0-9+-])[0-9]{5}-[0-9]{4}(?![0-9]|-[0-9])")
_TOLL_FREE = re.compile(
    r"(?<![0-9])(?:(?:1[ .-]?)?(?:\(8(?:00|33|44|55|66|77|88)\) ?|8(?:00|33|44|55|66|77|88)[ .-])"
    r"[0-9]{3}[ .-][0-9]{4}|0[38][0-9]{2} [0-9]{3} [0-9]{4}"
    r"|[48]00[ -]?[0-9]{3}[ -]?[0-9]{4})(?![0-9])"  # Chinese service lines: 400-820-8820
)

_CN_MOBILE = re.compile(r"(?<![0-9])1[3-9][0-9]{9}(?![0-9])")  # written without spaces
_PHONE_PLUS = re.compile(r"(?<![0-9+)])(?<![0-9)] )\+ ?[0-9](?:[ .()/-]{0,2}[0-9]){7,14}(?![0-9])")
_PHONE_SEP = r"(?: ?[.-] ?| {1,2})"
_PHONE = re.compile(
    rf"(?<![0-9])(?:\([0-9]{{2,5}}\) ?|[0-9]{{1,5}}{_PHONE_SEP})"
    rf"(?:[0-9]{{2,8}}{_PHONE_SEP}){{0,4}}[0-9]{{2,8}}(?![0-9])"
)

_LABELLED_NUMBER = re.compile(
    r"\b(?:(?:account|acct|a/c|passport|ssn|nhs)(?: ?(?:number|num|no\.?|id|#))?"
    r"|(?:licen[cs]e|policy|member(?:ship)?|customer|client|student|patient|employee|tax"
    r"|national insurance|social security) ?(?:number|num|no\.?|id|#))"
    r" *(?:is|:|=|#)? *[0-9]{6,}(?![0-9])",
    re.IGNORECASE,
)
_TIME_WORD = re.compile(r"\b(?:unix|epoch|time ?stamps?)\b", re.IGNORECASE)
_OPERATOR_BEFORE = re.compile(r"[0-9)] *[-+*/×÷^=] *$")
_OPERATOR_AFTER = re.compile(r"^ *[-+*/×÷^=] *[0-9(]")


def fold(text: str) -> str:
    """``text`` as the detectors read it: NFKC, digits of any script as ASCII, no invisibles."""
    if text.isascii():  # NFKC leaves ASCII as it is
        return text
    text = unicodedata.normalize("NFKC", text)
    text = _INVISIBLE.sub("", text)
    text = _DASHES.sub("-", text)
    return _OTHER_DIGIT.sub(lambda m: str(unicodedata.decimal(m.group())), text)


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


def _isbn_ok(text: str) -> bool:
    chars = re.sub(r"[^0-9Xx]", "", text).upper()
    if len(chars) == 13 and chars.isdigit():
        return sum(int(c) * (3 if i % 2 else 1) for i, c in enumerate(chars)) % 10 == 0
    if len(chars) == 10 and chars[:9].isdigit():
        values = [int(c) for c in chars[:9]] + [10 if chars[9] == "X" else int(chars[9])]
        return sum(v * (10 - i) for i, v in enumerate(values)) % 11 == 0
    return False


def _cn_id_ok(text: str) -> bool:
    chars = re.sub(r"[ -]", "", text).upper()
    year, month, day = int(chars[6:10]), int(chars[10:12]), int(chars[12:14])
    if not (1900 <= year <= 2099 and 1 <= month <= 12 and 1 <= day <= 31):
        return False
    weights = (7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2)
    total = sum(int(c) * w for c, w in zip(chars[:17], weights, strict=True))
    return "10X98765432"[total % 11] == chars[17]


def _date_ok(match: re.Match[str]) -> bool:
    if match.group(1):
        year, month, day = int(match.group(1)), int(match.group(3)), int(match.group(4))
        return 1900 <= year <= 2099 and 1 <= month <= 12 and 1 <= day <= 31
    a, b, year = int(match.group(5)), int(match.group(7)), int(match.group(8))
    day_month = (1 <= a <= 31 and 1 <= b <= 12) or (1 <= a <= 12 and 1 <= b <= 31)
    return 1900 <= year <= 2099 and day_month


def _iban_ok(match: re.Match[str]) -> bool:
    # the pattern may run on into the next words ("... 0130 00 and"): try every prefix that ends
    # where a group ends, as mod 97 alone would accept one random string in 97
    text, start = match.string, match.start()
    compact = ""
    for i in range(start, match.end()):
        if text[i] in " -":
            continue
        compact += text[i].upper()
        boundary = i + 1 == len(text) or not text[i + 1].isalnum()
        if boundary and 15 <= len(compact) <= 34:
            rearranged = compact[4:] + compact[:4]
            if int("".join(str(int(c, 36)) for c in rearranged)) % 97 == 1:
                return True
    return False


def _url_kinds(url: str) -> set[str]:
    try:
        parts = urlsplit(url)
    except ValueError:
        return {"url_secret"}  # unparseable URL: do not publish it
    kinds: set[str] = set()
    if parts.username or parts.password:
        kinds.add("url_secret")
    if _email_in(parts.path):
        kinds.add("email")
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if _SECRET_PARAM.search(name):
            kinds.add("url_secret")
        if _email_in(value):
            kinds.add("email")
    if parts.fragment and _SECRET_PARAM.search(parts.fragment):
        kinds.add("url_secret")
    return kinds


def _email_in(text: str) -> bool:
    return "@" in text and any(_personal_address(m) for m in _EMAIL.finditer(text))


def _personal_address(match: re.Match[str]) -> bool:
    return match.group(1).lower() != "git"  # git@github.com: the service's SSH account


def _looks_like_list(groups: list[str]) -> bool:
    """Numbers someone lists, not one number in groups: years, round or evenly spaced values;
    or a round amount written in thousands."""
    if len(groups) < 2 or any(len(g) > 9 for g in groups):
        return False
    values = [int(g) for g in groups]
    if all(len(g) == 4 and 1900 <= v <= 2099 for g, v in zip(groups, values, strict=True)):
        return True
    if len(groups) < 3:
        return False
    if all(g.endswith("0") for g in groups):
        return True
    if len(groups[0]) <= 3 and groups[-1] == "000" and all(len(g) == 3 for g in groups[1:]):
        return True  # a round amount in thousands: 1 500 000 000
    step = values[1] - values[0]
    return step != 0 and all(b - a == step for a, b in pairwise(values))


def _split(run: str) -> tuple[list[str], list[tuple[str, int, int]]]:
    """A number's digit groups, and its segments: (separator, first, last group) alike-joined."""
    groups = _GROUP.findall(run)
    kinds = [next((c for c in "-./" if c in s), " ") for s in _SEPARATOR.findall(run)]
    if not kinds:
        return groups, [("", 0, 0)]
    segments = []
    first = 0
    for i in range(1, len(kinds) + 1):
        if i == len(kinds) or kinds[i] != kinds[first]:
            segments.append((kinds[first], first, i))
            first = i
    return groups, segments


def _card_in(run: str) -> bool:
    groups, segments = _split(run)
    if any(13 <= len(g) <= 19 and luhn_ok(g) for g in groups):
        return True
    if len(segments) > 1:  # "4111 1111-1111 1111": Luhn keeps mixed separators precise enough
        segments.append(("", 0, len(groups) - 1))
    for _, first, last in segments:
        part = groups[first : last + 1]
        if len(part) < 2 or _looks_like_list(part):
            continue
        if all(len(g) == 1 for g in part):  # spelled out digit by digit
            digits = "".join(part)
            if 13 <= len(digits) <= 19 and luhn_ok(digits):
                return True
            continue
        # groups of 3-6 digits, as cards are printed; the last may be shorter
        for i in range(len(part)):
            if not 3 <= len(part[i]) <= 6:
                continue
            digits = ""
            for group in part[i:]:
                digits += group
                if len(group) > 6 or len(digits) > 19:
                    break
                if len(digits) >= 13 and luhn_ok(digits):
                    return True
                if len(group) < 3:
                    break
    return False


def _id_in(match: re.Match[str], timestamps: bool) -> bool:
    groups, segments = _split(match.group())
    context = match.string
    if len(groups) == 1:
        number = groups[0]
        if len(number) < 9 or _is_round(number) or (timestamps and _is_timestamp(number)):
            return False
        before = context[max(0, match.start() - 12) : match.start()]
        after = context[match.end() : match.end() + 12]
        return not (_OPERATOR_BEFORE.search(before) or _OPERATOR_AFTER.search(after))
    fractions = {last for sep, first, last in segments if sep == "." and last == first + 1}
    for i, number in enumerate(groups):
        if len(number) >= 9 and i not in fractions and not _is_round(number):
            if not (timestamps and _is_timestamp(number)):
                return True
    for sep, first, last in segments:
        part = groups[first : last + 1]
        if (
            sum(len(g) for g in part) >= 9
            and not (sep == "." and len(part) == 2)  # a decimal
            and all(len(g) >= 2 for g in part[1:-1])  # "10.0.19045.3803" is a version
            and max(len(g) for g in part) >= 3
            and not _looks_like_list(part)
        ):
            return True
    return False


def _is_round(number: str) -> bool:
    # 100000000, 250000000000: a quantity; an account number ending in half zeros is rare
    return len(number) - len(number.rstrip("0")) >= len(number) // 2


def _is_timestamp(number: str) -> bool:
    # seconds or milliseconds since 1970, 2001-09 to 2033-05
    return len(number) in (10, 13) and number[0] == "1"


def _phone_in(match: re.Match[str]) -> bool:
    groups = _GROUP.findall(match.group())
    parenthesised = match.group().startswith("(")
    for i in range(len(groups)):
        for j in range(i + 2, len(groups) + 1):
            if _phone_shaped(groups[i:j], parenthesised and i == 0):
                return True
    return False


def _phone_shaped(groups: list[str], parenthesised: bool) -> bool:
    digits = sum(len(g) for g in groups)
    if _looks_like_list(groups):
        return False
    first = groups[0]
    if parenthesised:
        return 9 <= digits <= 13
    if first.startswith("00"):  # international prefix
        return 11 <= digits <= 17
    if first.startswith("0") and len(first) >= 2:  # trunk prefix
        return 10 <= digits <= 13
    if first == "86" and len(groups) > 2:  # China's country code without the "+": 86 10 1234 5678
        return 12 <= digits <= 13
    lengths = [len(g) for g in groups]
    if lengths == [1, 3, 3, 4] and first == "1":
        groups, lengths = groups[1:], lengths[1:]
    if lengths == [3, 3, 4] and groups[0][0] in "23456789" and groups[1][0] in "23456789":
        return True  # North American
    return lengths == [3, 4, 4] and re.fullmatch(r"1[3-9][0-9]", groups[0]) is not None


def _sweep(
    pattern: re.Pattern[str], text: str, judge: Callable[[re.Match[str]], bool]
) -> tuple[str, bool]:
    """``text`` with every match that ``judge`` accepts masked, and whether there was one."""
    hit = False

    def mask(match: re.Match[str]) -> str:
        nonlocal hit
        if judge(match):
            hit = True
            return _MASK
        return match.group()

    return pattern.sub(mask, text), hit


def _always(match: re.Match[str]) -> bool:
    return True


def find_pii(text: str) -> list[str]:
    """The kinds of personal data in ``text`` (empty when none), in the order of ``KINDS``.

    Detectors run most specific first; what one claims (or exempts) is masked, so each number
    counts once: a card is not also a long number, a phone not also an account.
    """
    found: set[str] = set()
    rest = fold(text)

    def claim(kind: str, pattern: re.Pattern[str], judge: Callable[[re.Match[str]], bool]) -> None:
        nonlocal rest
        rest, hit = _sweep(pattern, rest, judge)
        if hit:
            found.add(kind)

    def exempt(pattern: re.Pattern[str], judge: Callable[[re.Match[str]], bool]) -> None:
        nonlocal rest
        rest, _ = _sweep(pattern, rest, judge)

    claim("jwt", _JWT, _always)
    claim("cloud_key", _AWS_KEY_ID, lambda m: "EXAMPLE" not in m.group())
    claim("cloud_key", _AWS_SECRET, lambda m: "EXAMPLE" not in m.group())
    for url in _URL.findall(rest):
        found |= _url_kinds(url)
    rest = _URL.sub(_MASK, rest)  # digits inside URLs are judged as URLs only
    if "@" in rest:  # the pattern is linear, but most text has no "@" at all
        claim("email", _EMAIL, _personal_address)
    if not _DIGIT.search(rest):  # every detector below needs a digit; most questions have none
        return [kind for kind in KINDS if kind in found]

    exempt(_ISBN_LABELLED, lambda m: _isbn_ok(m.group(1)))
    exempt(_ISBN_HYPHENATED, lambda m: _isbn_ok(m.group()))
    claim("national_id", _CN_ID, lambda m: _cn_id_ok(m.group()))
    claim("national_id", _CPF, _always)
    claim("national_id", _IBAN, _iban_ok)
    claim("national_id", _NINO, _always)
    claim("card", _RUN, lambda m: _card_in(m.group()))

    claim("phone", _PHONE_PLUS, _always)
    exempt(_IPV4, lambda m: all(int(part) <= 255 for part in m.group().split(".")))
    exempt(_DATE, _date_ok)
    exempt(_HEX, _always)
    exempt(_CVE, _always)
    exempt(_DOI, _always)
    exempt(_ZIP4, _always)
    exempt(_TOLL_FREE, _always)
    claim("phone", _PHONE, _phone_in)
    claim("national_id", _LABELLED_NUMBER, _always)
    timestamps = _TIME_WORD.search(rest) is not None  # once: the text may hold many numbers
    claim("phone", _CN_MOBILE, lambda m: _id_in(m, timestamps))
    claim("national_id", _RUN, lambda m: _id_in(m, timestamps))
    return [kind for kind in KINDS if kind in found]


def has_pii(text: str) -> bool:
    return bool(find_pii(text))


def has_phone_number(text: str) -> bool:
    """Whether ``text`` holds a phone number of any kind, toll-free and service lines included
    (which ``find_pii`` passes: nobody's personal number): what a published answer must not send
    its reader to (``policy/answers.py``, ``link``)."""
    rest = _URL.sub(_MASK, fold(text))
    if not _DIGIT.search(rest):
        return False
    for pattern in (_IPV4, _DATE, _HEX, _CVE, _DOI, _ZIP4):
        rest = pattern.sub(_MASK, rest)
    return any(
        pattern.search(rest) is not None for pattern in (_PHONE_PLUS, _TOLL_FREE, _CN_MOBILE)
    ) or any(_phone_in(match) for match in _PHONE.finditer(rest))
