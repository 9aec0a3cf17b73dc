"""The PII filter: personal data is caught, ordinary questions with numbers pass."""

from __future__ import annotations

import pytest

from edge_index.pii import find_pii, luhn_ok


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("my email is jane.doe+bank@example.co.uk", "email"),
        ("is 4111 1111 1111 1111 blocked?", "card"),
        ("card 5500-0000-0000-0004 declined", "card"),
        ("ssn 123-45-6789 please", "national_id"),
        ("my NI number is AB 12 34 56 C", "national_id"),
        ("IBAN GB82 WEST 1234 5698 7654 32", "national_id"),
        ("account 123456789012", "national_id"),
        ("call me on +44 7700 900123", "phone"),
        ("call (212) 555-0147 after 5", "phone"),
        ("see https://x.example.com/reset?token=abc123", "url_secret"),
        ("https://bob:hunter2@example.com/", "url_secret"),
        ("link https://example.com/cb#access_token=xyz", "url_secret"),
    ],
)
def test_personal_data_is_found(text: str, kind: str) -> None:
    assert kind in find_pii(text)


@pytest.mark.parametrize(
    "text",
    [
        "I withdrew 10 pounds instead of 30",
        "What is the daily limit, 500 or 1000?",
        "Why did my transfer of $1,250.50 take 3 days in 2024?",
        "How long does a bank transfer take?",
        "see https://example.com/help?page=2&lang=en",
        "Is there a 4 digit PIN?",
        "card ending 1234 was declined",
        "4111 1111 1111 1112 is not a valid card",  # fails Luhn, 16 digits but one group
    ],
)
def test_ordinary_questions_pass(text: str) -> None:
    found = find_pii(text)
    if "4111" in text:
        assert "card" not in found
    else:
        assert found == []


def test_luhn() -> None:
    assert luhn_ok("4111111111111111")
    assert not luhn_ok("4111111111111112")
    assert luhn_ok("79927398713")
