"""Time-sensitive questions are found; ordinary FAQ and general-knowledge questions pass."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from policy.timeliness import KINDS, time_sensitive
from tests.policy.test_pii import _hang_guard

CASES = Path(__file__).with_name("time_sensitive_cases.jsonl")  # make_time_sensitive_cases.py


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("How long until Christmas?", "countdown"),
        ("距离春节还有几天？", "countdown"),
        ("What's the weather in Paris tomorrow?", "weather"),
        ("上海明天会下雨吗？", "weather"),
        ("What is the Tesla stock price?", "price"),
        ("一美元等于多少人民币？", "price"),
        ("Who won the match last night?", "score"),
        ("What is the latest version of the app?", "latest"),
        ("最新消息", "latest"),
        ("What time is it in Tokyo?", "now"),
        ("现在几点了？", "now"),
        ("Is the branch open today?", "relative_date"),
        ("明天银行上班吗？", "relative_date"),
        ("ＷＨＡＴ’Ｓ ＴＨＥ ＷＥＡＴＨＥＲ ＴＯＤＡＹ?", "weather"),  # full-width: folded first
    ],
)
def test_time_sensitive_questions_are_found(text: str, kind: str) -> None:
    assert time_sensitive(text) == kind


@pytest.mark.parametrize(
    "text",
    [
        "How do I freeze my card?",
        "What is the capital of France?",
        "How long does a transfer take?",
        "How do I open a current account?",
        "What's the latest time I can make a transfer?",
        "Who won the World Cup in 2018?",
        "What is the temperature of the sun?",
        "离我最近的网点在哪里？",
        "转账多久能到账？",
        "周末营业吗？",
    ],
)
def test_ordinary_questions_pass(text: str) -> None:
    assert time_sensitive(text) is None


def _measure(cases: list[dict]) -> tuple[float, float]:
    positives = [c for c in cases if c["kind"]]
    negatives = [c for c in cases if not c["kind"]]
    true_positives = sum(1 for c in positives if time_sensitive(c["text"]))
    flagged = sum(1 for c in negatives if time_sensitive(c["text"]))
    return true_positives / len(positives), true_positives / (true_positives + flagged)


def test_labelled_cases_recall_and_precision() -> None:
    cases = [json.loads(line) for line in CASES.read_text("utf-8").splitlines() if line]
    positives = [c for c in cases if c["kind"]]
    assert len(cases) >= 300 and 0.4 <= len(positives) / len(cases) <= 0.6
    assert {c["kind"] for c in positives} == set(KINDS)
    assert {c["lang"] for c in cases} == {"en", "zh"}
    recall, precision = _measure(cases)
    holdout = [c for c in cases if c["split"] == "holdout"]
    holdout_recall, holdout_precision = _measure(holdout)
    print(
        f"time-sensitive recall {recall:.3f} precision {precision:.3f} on {len(cases)} labelled"
        f" cases; held out ({len(holdout)}): recall {holdout_recall:.3f} precision"
        f" {holdout_precision:.3f}"
    )
    missed = [c["text"] for c in positives if not time_sensitive(c["text"])]
    flagged = [c["text"] for c in cases if not c["kind"] and time_sensitive(c["text"])]
    assert recall >= 0.95, missed
    assert precision >= 0.95, flagged


@pytest.mark.skipif(not hasattr(signal, "SIGALRM"), reason="needs SIGALRM")
@pytest.mark.parametrize(
    "unit", ["a", "how ", "how many ", "what is the ", "距离", "下一", "美元", "is it ", "1 "]
)
def test_long_adversarial_text_is_classified_in_linear_time(unit: str) -> None:
    text = (unit * (200_000 // len(unit) + 1))[:200_000]
    with _hang_guard(20):  # about a second here; a quadratic pattern takes minutes
        time_sensitive(text)
