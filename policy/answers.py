"""Degenerate answers: what generation produced that must never be published or cached.

``answer_problem`` returns the first problem found, in the order of ``PROBLEMS``:
- ``empty``: nothing but spaces and punctuation;
- ``truncated``: cut off at ``max_tokens`` (``finish_reason`` ``length``);
- ``repetitive``: a loop — one n-gram (2–24 words; Chinese, Japanese and Korean count each
  character as a word) occurring 3+ times and covering more than 30% of the answer (the embedded
  model's "La femme de France, le capital de la femme de France, ..."); a word repeated in a
  real answer ("your card ... your card") covers far less;
- ``refusal``: nothing but a refusal or an apology ("I'm sorry, I can't help with that.",
  "As an AI, I cannot ...", 抱歉，我无法回答); an apology followed by an answer passes;
- ``language``: answered in another script than the question's (a Chinese question answered in
  Latin letters, an English one in Chinese), or, both in Latin letters, in another language by
  their stop words (an English question answered in French). Questions about translation or a
  language by name ("how do you say ... in Japanese") are not judged;
- ``link``: sends the reader elsewhere — a URL, a domain name (``evil.example``, also spelled
  out: "evil dot com"), an e-mail address, a social handle (``@name``), a phone number of any
  kind (toll-free too), or an instruction to visit a website, follow a link or write on a
  messaging app ("visit our website", "click the link", 加微信). A question's text is written by
  its askers: a forged crowd that publishes "... the answer is: visit evil.example" gets the
  model to repeat it, and a published or cached answer reaches everyone who asks. Passed only
  where the deployment allows it (``EDGEQA_ALLOW_ANSWER_LINKS``: ``allow_links``); an
  instruction naming a place without an address ("visit a branch", "call the number on your
  card") passes.

``uncacheable`` adds the question's time-sensitivity (``policy/timeliness.py``): what the
origin checks before writing a generated answer to its online cache. ``CHECKS`` names every check
a published entry has passed (the release rows' ``checks`` column).
"""

from __future__ import annotations

import re
from collections import Counter

from policy.pii import fold, has_phone_number
from policy.scripts import script_of
from policy.timeliness import time_sensitive

PROBLEMS = ("empty", "truncated", "repetitive", "refusal", "language", "link")
# what a published entry passed: mining's checks of the question, then generation's of the answer
CHECKS = ("pii", "time_sensitive", *PROBLEMS)
CACHE_SKIP_REASONS = ("time_sensitive", *PROBLEMS)

_LOOP_SHARE = 0.3  # of the answer's words, covered by one repeated n-gram
_LOOP_MIN_COUNT = 3
_LOOP_MAX_N = 24
_LOOP_MIN_WORDS = 8

# a word, or one CJK character (those scripts do not separate words by spaces)
_WORD = re.compile(r"[\u3040-\u30ff\u3400-\u9fff\uac00-\ud7af]|[^\W_]+")
_SENTENCE = re.compile(r"[^.!?。！？\n]+[.!?。！？]*")
_REFUSAL = re.compile(
    r"^(?:(?:i'?m|i am) (?:so |very |really )?sorry\b|(?:my )?apologies\b|unfortunately\b"
    r"|(?:sorry|抱歉|对不起|很抱歉|不好意思)"
    r"|as an ai\b|as a (?:language model|chatbot|virtual assistant)\b"
    r"|i (?:can'?t|cannot|can not|am unable|'m unable|am not able|'m not able|won'?t"
    r"|don'?t (?:have|know)|do not (?:have|know))\b|that'?s (?:not something|beyond)"
    r"|我(?:无法|不能|没办法|不知道|不清楚)|作为(?:一个)?(?:ai|人工智能|语言模型))"
)
_TRANSLATION = re.compile(
    r"\b(?:translat\w*|say|spell|pronounce|in (?:english|french|spanish|german|italian|"
    r"portuguese|dutch|chinese|mandarin|cantonese|japanese|korean|russian|arabic|hindi))\b"
    r"|翻译|怎么说|用英语|英文|中文|日语|韩语|法语|德语|西班牙语"
)
# the commonest function words; a word in several lists counts for each a fraction
_STOP_WORDS = {
    "en": "the of and to is are was were what how why when which who that this it in for on with"
    " you your can do does i my be have has not or at by from will would should there their they",
    "fr": "le la les un une des de du et est sont que qui dans pour sur avec vous votre ce cette"
    " il elle ne pas au aux ou mais comme plus se sa son",
    "es": "el la los las un una de del y es son que en por para con su como pero más se al lo"
    " usted está están muy",
    "de": "der die das den dem ein eine und ist sind nicht mit von zu für auf ich sie es wie"
    " auch sich dass bei aus oder",
    "it": "il lo la gli le un una di del della e è sono che per con non come più anche ma si"
    " nel alla",
    "pt": "o a os as um uma de do da dos das e é são que em para com não como mais por se ao"
    " você seu sua",
    "nl": "de het een en is zijn van in op met voor niet dat die je u uw ook maar bij aan",
}


# the top-level domains a name in running text is read as a web address by: every two-letter
# (country) code, the common generic ones and the reserved ones (RFC 2606: evil.example)
_GENERIC_TLDS = frozenset(
    "com net org info biz io co app dev xyz online site website top shop store ai tv cc ly gg"
    " gov edu mil int pro club live link click page web tech cloud email mobi name news blog"
    " bank help support space fun icu vip win bet casino crypto finance money loan"
    " example test invalid localhost local onion".split()
)
# two letters that are file types, not country codes: "Node.js" is no address
_NOT_TLDS = frozenset("js ts rb db gz xz go cs hs kt jl".split())
_URL_START = re.compile(r"\b[a-z][a-z0-9+.-]{1,15}://|\bwww\d?\.", re.IGNORECASE)
# labels, then a lower-case top-level domain: "Ph.D." and "card.It" (a missing space) are not
_DOMAIN = re.compile(
    r"(?<![\w@.-])(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+([a-z]{2,24})(?![\w-]|\.\w)"
)
# "evil dot com", "evil[.]com", "evil (dot) com": read against the generic top-level domains
_SPELLED_DOMAIN = re.compile(
    r"\w\s*(?:\[\s*(?:\.|dot)\s*\]|\(\s*(?:\.|dot)\s*\)|\s+dot\s+)\s*([a-z]{2,24})\b"
)
_EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
_HANDLE = re.compile(r"(?<![\w@])@[a-z0-9_]{3,30}\b")
# an instruction to go to a website or a messaging app, within a few words of it
_ELSEWHERE = re.compile(
    r"\b(?:visit|go(?: over)? to|head(?: over)? to|navigate to|browse to|log ?on to"
    r"|sign up (?:at|on)|click|tap|open|follow|check out|contact|message|write|text|join"
    r"|download)\b[^.!?\n]{0,40}?\b(?:web ?site|site|web ?page|url|link|portal|telegram"
    r"|whatsapp|discord|wechat|skype|instagram|facebook|twitter|tiktok|snapchat)\b"
    r"|网址|网站|链接|微信号|加微信|加我微信|qq群|加qq|公众号|电报群"
)


def _links_elsewhere(folded: str, text: str) -> bool:
    """Whether an answer (``folded``: NFKC; ``text``: also case-folded) sends its reader
    elsewhere (see ``link`` in the module)."""
    return (
        _URL_START.search(text) is not None
        or any(
            m.group(1) in _GENERIC_TLDS or (len(m.group(1)) == 2 and m.group(1) not in _NOT_TLDS)
            for m in _DOMAIN.finditer(folded)
        )
        or any(m.group(1) in _GENERIC_TLDS for m in _SPELLED_DOMAIN.finditer(text))
        or ("@" in text and (_EMAIL.search(text) or _HANDLE.search(text)) is not None)
        or _ELSEWHERE.search(text) is not None
        or has_phone_number(folded)
    )


def _stop_word_weights() -> dict[str, dict[str, float]]:
    """Each stop word's weight per language: 1 / the number of languages that use it."""
    languages_of: dict[str, list[str]] = {}
    for language, words in _STOP_WORDS.items():
        for word in words.split():
            languages_of.setdefault(word, []).append(language)
    return {w: {lang: 1.0 / len(langs) for lang in langs} for w, langs in languages_of.items()}


_WEIGHTS = _stop_word_weights()


def _words(text: str) -> list[str]:
    return _WORD.findall(text)


def _repetitive(words: list[str]) -> bool:
    total = len(words)
    if total < _LOOP_MIN_WORDS:
        return False
    for n in range(2, min(_LOOP_MAX_N, total // _LOOP_MIN_COUNT) + 1):
        grams = Counter(tuple(words[i : i + n]) for i in range(total - n + 1))
        gram, count = grams.most_common(1)[0]
        if count < _LOOP_MIN_COUNT or count * n <= _LOOP_SHARE * total:
            continue  # too few, or too short to cover the share even without overlaps
        covered: set[int] = set()
        for i in range(total - n + 1):
            if tuple(words[i : i + n]) == gram:
                covered.update(range(i, i + n))
        if len(covered) > _LOOP_SHARE * total:
            return True
    return False


def _refusal(text: str) -> bool:
    sentences = [s.strip() for s in _SENTENCE.findall(text) if s.strip()]
    refusals = [s for s in sentences if _REFUSAL.search(s)]
    if not refusals:
        return False
    rest = [w for s in sentences if s not in refusals for w in _words(s)]
    return len(rest) < 6  # an apology, then an answer, passes


def _language(words: list[str], minimum: float) -> str | None:
    """The Latin-script language whose stop words ``words`` use most, when clearly so."""
    scores: dict[str, float] = {}
    for word in words:
        for language, weight in _WEIGHTS.get(word, {}).items():
            scores[language] = scores.get(language, 0.0) + weight
    ranked = sorted(scores.items(), key=lambda item: -item[1])[:2]
    if not ranked or ranked[0][1] < minimum:
        return None
    if len(ranked) > 1 and ranked[0][1] < 2 * ranked[1][1]:
        return None  # no clear winner
    return ranked[0][0]


def _other_language(question: str, answer: str) -> bool:
    if _TRANSLATION.search(question):
        return False
    asked, answered = script_of(question), script_of(answer)
    if asked is None or answered is None:
        return False
    if asked != answered:
        return True
    if asked != "latin":
        return False
    asked_in = _language(_words(question), minimum=1.0)
    answered_in = _language(_words(answer), minimum=2.0)
    return asked_in is not None and answered_in is not None and asked_in != answered_in


def answer_problem(
    question: str, answer: str, finish_reason: str | None, allow_links: bool = False
) -> str | None:
    """What makes ``answer`` (to ``question``) unfit to publish or cache, or None.
    ``allow_links``: an answer that sends the reader elsewhere passes (``link``)."""
    folded = fold(answer)
    text = folded.casefold()
    words = _words(text)
    if not words:
        return "empty"
    if finish_reason == "length":
        return "truncated"
    if _repetitive(words):
        return "repetitive"
    if _refusal(text):
        return "refusal"
    if _other_language(fold(question).casefold(), text):
        return "language"
    if not allow_links and _links_elsewhere(folded, text):
        return "link"
    return None


def checks_passed(allow_links: bool = False) -> str:
    """A published row's ``checks`` (``CHECKS``, comma-separated): ``link`` only when it ran."""
    return ",".join(c for c in CHECKS if c != "link" or not allow_links)


def uncacheable(
    question: str, answer: str, finish_reason: str | None, allow_links: bool = False
) -> str | None:
    """Why the origin must not write ``answer`` to its online cache (``CACHE_SKIP_REASONS``),
    or None."""
    if time_sensitive(question):
        return "time_sensitive"
    return answer_problem(question, answer, finish_reason, allow_links)
