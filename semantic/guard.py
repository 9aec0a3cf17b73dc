"""The semantic tier's guard: a match is refused when the two questions differ in a way that an
embedding glosses over but that changes the answer.

- numbers: when both questions carry numbers, the multisets must be equal ("limit for 100" is not
  "limit for 200"); number words up to twenty count as digits, and so do Chinese numerals,
  composed (十五, 一百零五, 两万五 = 25000), mixed with digits (3千 = 3000, 1.5万 = 15000),
  financial (壹贰叁) or digit by digit (二〇二四), so "转账3次" is "转账三次" and "限额五千" is
  "限额5000", while "转账三次" is not "转账两次"; words built on a numeral that are not numbers
  (一下, 一些, 一定, 万一, 千万别, 十分 "very", 三思, 零钱...) are left out;
- negation: between near-identical wordings, both negated or neither ("can I cancel" is not "why
  can't I cancel"; "我的卡能用吗" is not "我的卡不能用"). Chinese negators are 不 没 别 未 无 非
  甭 勿 (so 不能, 无法, 没有, 不要...); A-not-A questions (能不能, 是不是, 有没有, 可不可以), a
  closing 了没有, and words that only contain a negator (不过, 别人, 特别, 非常, 未来, 无论...) are
  not negations. Near-identical is measured on content words, which in Chinese are the
  characters themselves (Chinese does not separate words by spaces);
- named entities and codes: when both questions name some (a capitalised word inside a sentence,
  an acronym, a currency code or symbol; in a Chinese sentence every word in Latin letters, and a
  short list of banks, payment services and currencies: 工商银行, 支付宝, 美元...), each must appear
  in the other (case-insensitively), so "Apple Pay" never answers "Google Pay", "EUR" never
  answers "USD" and "用Apple Pay付款" never answers "用Google Pay付款", while "apple pay" still
  matches "Apple Pay" and "支付宝" matches "Alipay".

Every check reads the folded text (``pii.fold``: NFKC, so full-width "３" and "ＵＳＤ" read as "3"
and "USD"). Each check can be switched off (``Guard(numbers=False, ...)``); the release's
manifest records which were on when its threshold was calibrated.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from decimal import Decimal
from itertools import pairwise

from policy.pii import fold

_NUMBER_WORDS = {
    w: str(i)
    for i, w in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
        "fifteen sixteen seventeen eighteen nineteen twenty".split()
    )
}
_HAN = "\u3400-\u9fff"  # CJK ideographs, extension A and the unified block
# a word: letters and digits of a script that separates words, or one Han character
_WORD = re.compile(rf"[{_HAN}]|[^\W_{_HAN}]+(?:['’][^\W_{_HAN}]+)?")
_HAN_CHAR = re.compile(rf"[{_HAN}]")

_ZH_DIGITS = {
    **dict.fromkeys("零〇", 0),
    **dict.fromkeys("一壹", 1),
    **dict.fromkeys("二两兩贰貳", 2),
    **dict.fromkeys("三叁參", 3),
    **dict.fromkeys("四肆", 4),
    **dict.fromkeys("五伍", 5),
    **dict.fromkeys("六陆陸", 6),
    **dict.fromkeys("七柒", 7),
    **dict.fromkeys("八捌", 8),
    **dict.fromkeys("九玖", 9),
}
_ZH_UNITS = {
    **dict.fromkeys("十拾", 10),
    **dict.fromkeys("百佰", 100),
    **dict.fromkeys("千仟", 1000),
}
_ZH_MYRIADS = {**dict.fromkeys("万萬", 10**4), **dict.fromkeys("亿億", 10**8)}
_ZH_NUMERALS = "".join([*_ZH_DIGITS, *_ZH_UNITS, *_ZH_MYRIADS])
# digits, or Chinese numerals, or both mixed: 2024, 1,000, 三千, 两万五, 1.5万
_NUMBER = re.compile(rf"(?:\d++(?:[.,]\d++)*+|[{_ZH_NUMERALS}])++")
_NUMBER_PART = re.compile(r"\d+(?:[.,]\d+)*|.")
_ZH_DIGIT_BEFORE = rf"(?<![0-9{_ZH_NUMERALS}])"
# words built on a numeral that are not numbers; conservative: a real number left out here only
# lets a match through, as when one of the questions has no number
_NOT_NUMBERS = re.compile(
    "一下(?!午)|一些|一起|一定|一般|一直|一样|一切|一旦|一共|一致|一向|一律|一再|一概|一并|一番"
    "|一边|一会|一点儿|一点点|一模一样|一五一十|统一|唯一|同一|不一|万一|万万|第一时间|三思"
    "|三心二意|乱七八糟|七上八下|五花八门|十全十美|零钱|零花|零食|零售|零件|万事达|百度|百科"
    rf"|百货|百姓|三星|{_ZH_DIGIT_BEFORE}千万(?=[别不要记得])|{_ZH_DIGIT_BEFORE}十分(?!钟)"
    "|百分之|千(?=[克瓦])"  # 百分之五 is 5 (as "5%" is 5); 五千克 is 5 kilograms
)
_NEGATIONS = {
    "not",
    "no",
    "never",
    "cannot",
    "without",
    "none",
    "nothing",
    "nobody",
    "neither",
    "nor",
    "nowhere",
    "unable",
}
_ZH_NEGATORS = "不没沒别別未无無非甭勿"
_ZH_NEGATOR = re.compile(f"[{_ZH_NEGATORS}]")
# what holds a negator without negating: A-not-A questions (能不能, 可不可以, 有没有), a closing
# 了没有 ("到账了没有？" asks), and words
_ZH_NOT_NEGATION = re.compile(
    rf"([{_HAN}]{{1,2}})[不没]\1|了没有?(?=[\s?？。!！]*$)"
    "|不过|不断|不少|不久|不管|不仅|不但|不如|不然|不论|不错|不同|不得不|不好意思|对不起|了不起"
    "|差不多|忍不住|别人|别的|特别|区别|类别|级别|分别|告别|性别|识别|差别|个别|未来|无论|非常"
    "|除非|莫非|非洲|没错"
)
_CURRENCY = re.compile(r"[$€£¥₹₽₩]|\b(?:usd|eur|gbp|jpy|chf|cad|aud|inr|cny|btc|eth)\b", re.I)
# entities named in Chinese, as the words their English names give ("支付宝" is "Alipay")
_ZH_ENTITIES = {
    **dict.fromkeys(("工商银行", "工行"), "icbc"),
    **dict.fromkeys(("建设银行", "建行"), "ccb"),
    **dict.fromkeys(("农业银行", "农行"), "abc"),
    **dict.fromkeys(("中国银行", "中行"), "boc"),
    **dict.fromkeys(("招商银行", "招行"), "cmb"),
    "交通银行": "bocom",
    "支付宝": "alipay",
    "微信支付": "wechat pay",
    "微信": "wechat",
    "银联": "unionpay",
    "万事达": "mastercard",
    **dict.fromkeys(("美元", "美金"), "usd"),
    "欧元": "eur",
    "英镑": "gbp",
    "日元": "jpy",
    "人民币": "cny",
    **dict.fromkeys(("港币", "港元"), "hkd"),
}
_ZH_ENTITY = re.compile("|".join(sorted(_ZH_ENTITIES, key=len, reverse=True)))
_SENTENCE_END = re.compile(r"[.!?。？！]\s+")


def _zh_value(run: str) -> str:
    """The value of a number written with Chinese numerals: 十五 -> 15, 一百零五 -> 105,
    两万五 -> 25000, 1.5万 -> 15000, 二〇二四 -> 2024 (digit by digit)."""
    parts = [p.replace(",", "") for p in _NUMBER_PART.findall(run)]
    if not any(p in _ZH_UNITS or p in _ZH_MYRIADS for p in parts):
        return "".join(str(_ZH_DIGITS[p]) if p in _ZH_DIGITS else p for p in parts)
    if any(p.count(".") > 1 for p in parts):  # a version, 1.2.3万: no value, compared as written
        return run.replace(",", "")
    total = section = Decimal(0)  # above the last myriad, and below it
    digit: Decimal | None = None
    unit = 1  # the last unit read: a bare digit after it counts a tenth of it (两万五, 三百五)
    for part in parts:
        if part in _ZH_UNITS:
            unit = _ZH_UNITS[part]
            section += (1 if digit is None else digit) * unit
            digit = None
        elif part in _ZH_MYRIADS:
            myriad = _ZH_MYRIADS[part]
            value = section + (digit or 0)
            if myriad > 10**4:  # 一万亿: a 亿 multiplies all that came before
                total = (total + value) * myriad
            else:
                total += value * myriad
            section, digit, unit = Decimal(0), None, myriad
        elif part in _ZH_DIGITS:
            if part in "零〇":
                unit = 1  # 一百零五: the 五 is 5
            digit = Decimal(_ZH_DIGITS[part])
        else:
            digit = Decimal(part)
    if digit is not None:
        section += digit * unit / 10 if unit >= 10 else digit
    return format((total + section).normalize(), "f")


def numbers(text: str) -> list[str]:
    text = _NOT_NUMBERS.sub(" ", fold(text))
    found = []
    for run in _NUMBER.findall(text):
        found.append(_zh_value(run) if _HAN_CHAR.search(run) else run.replace(",", ""))
    found += [_NUMBER_WORDS[w] for w in _WORD.findall(text.lower()) if w in _NUMBER_WORDS]
    return sorted(found)


def negated(text: str) -> bool:
    text = fold(text).lower().replace("’", "'")
    for word in _WORD.findall(text):
        if word in _NEGATIONS or word.endswith("n't"):
            return True
    return _ZH_NEGATOR.search(_ZH_NOT_NEGATION.sub(" ", text)) is not None


def entities(text: str) -> set[str]:
    """Capitalised words not opening a sentence, acronyms, currency codes and symbols; in a
    Chinese sentence every word in Latin letters (Chinese has no capitals to tell names from
    words), and the banks, payment services and currencies of ``_ZH_ENTITIES``."""
    text = fold(text)
    found = {m.group().lower() for m in _CURRENCY.finditer(text)}
    for m in _ZH_ENTITY.finditer(text):
        found.update(_ZH_ENTITIES[m.group()].split())
    for sentence in _SENTENCE_END.split(text):
        words = _WORD.findall(sentence)
        han = sum(1 for w in words if _HAN_CHAR.match(w))
        chinese = han > 0 and han >= len(words) - han  # "How do I say 银行 in English?" is not
        for i, word in enumerate(words):
            if word in ("I", "I'm", "I've", "I'd", "I'll") or _HAN_CHAR.match(word):
                continue
            acronym = len(word) >= 2 and word.isupper() and word.isalpha()
            capital = i > 0 and word[0].isupper() and unicodedata.category(word[0]) == "Lu"
            latin = chinese and not word.isdigit()
            if acronym or capital or latin:
                found.add(word.lower())
    return found


def _words(text: str) -> set[str]:
    return set(_WORD.findall(fold(text).lower().replace("’", "'")))


_STOP = {
    "a",
    "an",
    "the",
    "i",
    "my",
    "me",
    "you",
    "your",
    "is",
    "are",
    "was",
    "were",
    "be",
    "do",
    "does",
    "did",
    "to",
    "of",
    "in",
    "on",
    "for",
    "and",
    "or",
    "it",
    "this",
    "that",
    "can",
    "could",
    "will",
    "would",
    "how",
    "what",
    "why",
    "when",
    "where",
    "please",
    "have",
    "has",
}
# Chinese function characters, as _STOP: particles, pronouns, question words, modal verbs
_ZH_STOP = set("的了吗呢吧啊呀么嘛我你您他她它们是在请把被和与个这那什怎为何哪会能可以要有")
_NOT_CONTENT = _STOP | _NEGATIONS | _ZH_STOP | set(_ZH_NEGATORS)
NEGATION_OVERLAP = 0.6  # content-word Jaccard from which a negation mismatch refuses


def _content_word(word: str) -> str | None:
    """``word`` (folded, lower case) as a content word, None for a function word."""
    if word.endswith("n't"):
        stem = word[:-3]
        word = {"wo": "will", "ca": "can", "sha": "shall"}.get(stem, stem)
    return None if word in _NOT_CONTENT else word


def _content(text: str) -> set[str]:
    words = set()
    for raw in _words(text):
        word = _content_word(raw)
        if word is not None:
            words.add(word[:-1] if len(word) > 3 and word.endswith("s") else word)  # works/work
    return words


_HAN_RUN = re.compile(rf"[{_HAN}]+")
_SPACE_BEFORE_MARK = re.compile(r"\s+([,.;:?!])")
# a comma left before another mark or at the end ("reset it, asap?" without "asap")
_LOOSE_COMMA = re.compile(r"[,;:，、]+(?=[,.;:?!，、。？！]|$)")


def content_tokens(text: str) -> set[str]:
    """The tokens of ``text`` that say something about who typed it: what the nightly mining's
    token-level k counts (``precompute/mining.py``: a text is published only when each of its
    content tokens was typed by k distinct people). Read as the key spec's ``normalize`` reads
    it (NFKC, lower case; digits of other scripts as ASCII, as ``pii.fold``):

    - each word of a script that separates words by spaces, exactly as written (no stemming:
      "cards" is not "card"), unless it is a function word (``_STOP``, the negations, "don't");
    - each Han character that is not a function character (``_ZH_STOP``, the negators), and each
      pair of adjacent such characters: Chinese has no spaces, and a name is two or three
      characters, each of which may be common on its own (王, 小, 明);
    - every number, by value (``numbers``: "1,000" is "1000", 三千 is "3000"), and every named
      entity (``entities``: "$", "usd" for 美元, a capitalised word), function word or not.
    """
    folded = fold(text).lower().replace("’", "'")
    tokens = {w for w in map(_content_word, _WORD.findall(folded)) if w is not None}
    for run in _HAN_RUN.findall(folded):
        content = [c if c not in _NOT_CONTENT else "" for c in run]
        tokens.update(a + b for a, b in pairwise(content) if a and b)
    tokens.update(numbers(text))
    tokens.update(entities(text))
    return tokens


def remove_tokens(text: str, tokens: set[str]) -> str:
    """``text`` (as ``pii.fold`` reads it, case kept) without the words that are one of
    ``tokens`` (as ``content_tokens`` spells them) and the Han characters that are one or are in
    a pair that is one, spaces tidied. What is left may hold tokens ``text`` did not (two
    characters brought together): read it again with ``content_tokens``."""
    folded = fold(text)
    pieces, last = [], 0
    for match in _WORD.finditer(folded):
        start, end = match.span()
        word = match.group().lower().replace("’", "'")
        if _HAN_CHAR.match(word):
            pairs = {folded[max(start - 1, 0) : end], folded[start : end + 1]}
            drop = word in tokens or bool(pairs & tokens)
        else:
            drop = word in tokens or _content_word(word) in tokens
        pieces.append(folded[last:start] if drop else folded[last:end])
        last = end
    pieces.append(folded[last:])
    tidy = _SPACE_BEFORE_MARK.sub(r"\1", " ".join("".join(pieces).split()))
    return _LOOSE_COMMA.sub("", tidy).lstrip(" ,.;:，、")


@dataclass(frozen=True)
class Guard:
    numbers: bool = True
    negations: bool = True
    entities: bool = True

    def check(self, query: str, matched: str) -> str | None:
        """None when the match may stand, else the name of the check that refused it.

        Numbers and entities refuse only when *both* questions carry some and they differ: "why
        was I charged a fee" may answer "I was charged a 5 pound fee", but "limit for 100" never
        answers "limit for 200". Negation refuses only between near-identical wordings ("can I
        cancel" / "why can't I cancel"); between different wordings the embedding already weighs
        it, and a blunt rule refuses mostly correct matches ("still waiting for my card" /
        "my card hasn't arrived").
        """
        if self.numbers:
            a, b = numbers(query), numbers(matched)
            if a and b and a != b:
                return "numbers"
        if self.negations and negated(query) != negated(matched):
            a_words, b_words = _content(query), _content(matched)
            overlap = len(a_words & b_words) / max(len(a_words | b_words), 1)
            if overlap >= NEGATION_OVERLAP:
                return "negation"
        if self.entities:
            a_entities, b_entities = entities(query), entities(matched)
            if a_entities and b_entities:
                # a symbol ("$") or a name written in Chinese is no word of the other question
                a_named, b_named = _words(query) | a_entities, _words(matched) | b_entities
                if not a_entities <= b_named or not b_entities <= a_named:
                    return "entities"
        return None

    def as_dict(self) -> dict[str, bool]:
        return {"numbers": self.numbers, "negations": self.negations, "entities": self.entities}
