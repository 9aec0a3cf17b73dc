"""The semantic tier's guard: a match is refused when the two questions differ in a way that an
embedding glosses over but that changes the answer.

- numbers: when both questions carry numbers, the multisets must be equal ("limit for 100" is not
  "limit for 200"); number words up to twenty count as digits;
- negation: between near-identical wordings, both negated or neither ("can I cancel" is not "why
  can't I cancel");
- named entities and codes: when both questions name some (a capitalised word inside a sentence,
  an acronym, a currency code or symbol), each must appear in the other (case-insensitively), so
  "Apple Pay" never answers "Google Pay" and "EUR" never answers "USD", while "apple pay" still
  matches "Apple Pay".

Each check can be switched off (``Guard(numbers=False, ...)``); the release's manifest records
which were on when its threshold was calibrated.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

_NUMBER_WORDS = {
    w: str(i)
    for i, w in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
        "fifteen sixteen seventeen eighteen nineteen twenty".split()
    )
}
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_WORD = re.compile(r"[^\W_]+(?:['’][^\W_]+)?", re.UNICODE)
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
_CURRENCY = re.compile(r"[$€£¥₹₽₩]|\b(?:usd|eur|gbp|jpy|chf|cad|aud|inr|cny|btc|eth)\b", re.I)
_SENTENCE_END = re.compile(r"[.!?。？！]\s+")


def numbers(text: str) -> list[str]:
    found = [n.replace(",", "") for n in _NUMBER.findall(text)]
    found += [_NUMBER_WORDS[w] for w in _WORD.findall(text.lower()) if w in _NUMBER_WORDS]
    return sorted(found)


def negated(text: str) -> bool:
    for word in _WORD.findall(text.lower().replace("’", "'")):
        if word in _NEGATIONS or word.endswith("n't"):
            return True
    return False


def entities(text: str) -> set[str]:
    """Capitalised words not opening a sentence, acronyms, currency codes and symbols."""
    found = {m.group().lower() for m in _CURRENCY.finditer(text)}
    for sentence in _SENTENCE_END.split(text):
        words = _WORD.findall(sentence)
        for i, word in enumerate(words):
            if word in ("I", "I'm", "I've", "I'd", "I'll"):
                continue
            acronym = len(word) >= 2 and word.isupper() and word.isalpha()
            capital = i > 0 and word[0].isupper() and unicodedata.category(word[0]) == "Lu"
            if acronym or capital:
                found.add(word.lower())
    return found


def _words(text: str) -> set[str]:
    return set(_WORD.findall(text.lower().replace("’", "'")))


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
NEGATION_OVERLAP = 0.6  # content-word Jaccard from which a negation mismatch refuses


def _content(text: str) -> set[str]:
    words = set()
    for raw in _words(text):
        word = raw
        if word.endswith("n't"):
            stem = word[:-3]
            word = {"wo": "will", "ca": "can", "sha": "shall"}.get(stem, stem)
        if word not in _STOP and word not in _NEGATIONS:
            words.add(word[:-1] if len(word) > 3 and word.endswith("s") else word)  # works/work
    return words


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
                a_words, b_words = _words(query), _words(matched)
                if any(e not in b_words for e in a_entities) or any(
                    e not in a_words for e in b_entities
                ):
                    return "entities"
        return None

    def as_dict(self) -> dict[str, bool]:
        return {"numbers": self.numbers, "negations": self.negations, "entities": self.entities}
