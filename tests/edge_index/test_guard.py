"""The guard refuses matches that differ in numbers, negation or named entities."""

from __future__ import annotations

import pytest

from edge_index.guard import Guard, entities, negated, numbers


@pytest.mark.parametrize(
    ("query", "matched", "refused"),
    [
        ("What is the limit for 100 pounds?", "What is the limit for 200 pounds?", "numbers"),
        ("Transfer two hundred... I mean 2 cards", "Transfer 3 cards", "numbers"),
        ("Can I cancel my transfer?", "Why can't I cancel my transfer?", "negation"),
        ("My card does not work abroad", "My card works abroad", "negation"),
        ("Can I use Google Pay?", "Can I use Apple Pay?", "entities"),
        ("How do I send money in EUR?", "How do I send money in USD?", "entities"),
    ],
)
def test_refused(query: str, matched: str, refused: str) -> None:
    assert Guard().check(query, matched) == refused
    assert Guard(numbers=False, negations=False, entities=False).check(query, matched) is None


@pytest.mark.parametrize(
    ("query", "matched"),
    [
        ("how do i freeze my card", "How do I freeze my card?"),
        ("can i use apple pay", "Can I use Apple Pay?"),  # lower case still matches
        ("Why was I charged a 5 pound fee?", "Why was I charged a fee?"),  # only one has numbers
        ("My card still hasn't arrived", "Where is my new card?"),  # different wording
        ("What is the limit for 100 pounds?", "what's the limit for 100 pounds"),
    ],
)
def test_allowed(query: str, matched: str) -> None:
    assert Guard().check(query, matched) is None


def test_parts() -> None:
    assert numbers("send 1,000 to two friends") == ["1000", "2"]
    assert negated("I can't log in") and negated("never arrived") and not negated("it arrived")
    assert entities("Can I use Apple Pay in the UK with $5?") == {"apple", "pay", "uk", "$"}
    assert entities("I want to pay") == set()
