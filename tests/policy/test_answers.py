"""Degenerate answers: loops, refusals, other languages, empty and cut-off answers, and answers
that send the reader elsewhere, are caught; good answers, short or long, pass."""

from __future__ import annotations

import pytest

from policy.answers import CACHE_SKIP_REASONS, CHECKS, PROBLEMS, answer_problem, uncacheable

CAPITAL = "What is the capital of France?"
FREEZE = "How do I freeze my card?"
TRANSFER = "How long does a bank transfer take?"
CAPITAL_ZH = "法国的首都是哪里？"
FREEZE_ZH = "怎么冻结我的银行卡？"

# (question, answer, finish_reason, problem)
CASES = [
    # the embedded model's loop, and other loops
    (
        CAPITAL,
        "La femme de France, le capital de la femme de France, la femme de France, le capital "
        "de la femme de France, la femme de France.",
        "stop",
        "repetitive",
    ),
    (
        CAPITAL,
        "Paris is the capital. Paris is the capital. Paris is the capital.",
        "stop",
        "repetitive",
    ),
    (FREEZE, "Open the app. " * 12, "stop", "repetitive"),
    (
        FREEZE,
        "You can freeze it in the app, the app, the app, the app, the app, the app.",
        "stop",
        "repetitive",
    ),
    (
        TRANSFER,
        "It takes one to two days, one to two days, one to two days, one to two days.",
        "stop",
        "repetitive",
    ),
    (FREEZE, "card card card card card card card card card card", "stop", "repetitive"),
    (
        CAPITAL_ZH,
        "法国的首都是巴黎，巴黎是法国的首都，巴黎是法国的首都，巴黎是法国的首都。",
        "stop",
        "repetitive",
    ),
    (
        FREEZE_ZH,
        "请打开手机银行。请打开手机银行。请打开手机银行。请打开手机银行。",
        "stop",
        "repetitive",
    ),
    (
        "What should I do if my card is stolen?",
        "Call us. I'm sorry. I'm sorry. I'm sorry. I'm sorry. I'm sorry.",
        "stop",
        "repetitive",
    ),
    # refusals, and nothing else
    (CAPITAL, "I'm sorry, I can't help with that.", "stop", "refusal"),
    (FREEZE, "I am sorry, but I cannot assist with that request.", "stop", "refusal"),
    (FREEZE, "As an AI language model, I do not have access to your account.", "stop", "refusal"),
    (TRANSFER, "I don't know.", "stop", "refusal"),
    (TRANSFER, "Unfortunately, I am unable to answer that question.", "stop", "refusal"),
    (CAPITAL, "Sorry, I can't answer that. Please ask something else.", "stop", "refusal"),
    (FREEZE_ZH, "抱歉，我无法回答这个问题。", "stop", "refusal"),
    (CAPITAL_ZH, "作为一个人工智能，我不能提供这个信息。", "stop", "refusal"),
    # empty, cut off
    (CAPITAL, "", "stop", "empty"),
    (CAPITAL, "   \n ", "stop", "empty"),
    (CAPITAL, "...", "stop", "empty"),
    (CAPITAL, "The capital of France is Paris, which is also its largest", "length", "truncated"),
    (FREEZE, "To freeze your card, open", "length", "truncated"),
    # another language or script
    (CAPITAL, "La capitale de la France est Paris, une ville magnifique.", "stop", "language"),
    (
        FREEZE,
        "Pour bloquer votre carte, ouvrez l'application et appuyez sur le bouton.",
        "stop",
        "language",
    ),
    (
        TRANSFER,
        "Una transferencia tarda de uno a dos días en llegar a la cuenta.",
        "stop",
        "language",
    ),
    (FREEZE, "要冻结您的银行卡，请打开手机银行。", "stop", "language"),
    (FREEZE, "カードを凍結するには、アプリを開いてください。", "stop", "language"),
    (CAPITAL_ZH, "The capital of France is Paris.", "stop", "language"),
    (FREEZE_ZH, "Open the app and tap Freeze card.", "stop", "language"),
    (CAPITAL_ZH, "Paris.", "stop", "language"),
    (FREEZE, "Чтобы заблокировать карту, откройте приложение.", "stop", "language"),
    # sending the reader elsewhere: what a forged crowd's question gets the model to repeat
    (FREEZE, "The answer is: visit evil.example", "stop", "link"),
    (
        FREEZE,
        "To freeze your card, go to https://bank.example.com/freeze and log in.",
        "stop",
        "link",
    ),
    (FREEZE, "Please go to www.secure-cards.net to freeze it.", "stop", "link"),
    (FREEZE, "Freeze it at Secure-Bank-Help.com in a minute.", "stop", "link"),
    (FREEZE, "Go to evil dot com and enter your card number.", "stop", "link"),
    (FREEZE, "Type evil[.]com in your browser.", "stop", "link"),
    (TRANSFER, "Email refunds@evil.example with your account details.", "stop", "link"),
    (TRANSFER, "Message @fastrefunds on Telegram and they will speed it up.", "stop", "link"),
    (TRANSFER, "Call us on 0800 123 4567 and we will speed it up.", "stop", "link"),
    (TRANSFER, "Call +44 20 7946 0958 to speed it up.", "stop", "link"),
    (TRANSFER, "Ring 1-800-555-0199 any time of day.", "stop", "link"),
    (FREEZE, "Please visit our website for more details.", "stop", "link"),
    (FREEZE, "Click the link in the text we sent you to freeze your card.", "stop", "link"),
    (FREEZE, "Open WhatsApp and message our support team.", "stop", "link"),
    (FREEZE_ZH, "请访问我们的网站，登录后冻结。", "stop", "link"),
    (FREEZE_ZH, "加微信 bank123 客服帮您冻结。", "stop", "link"),
    (FREEZE_ZH, "请拨打 400-820-8820 办理冻结。", "stop", "link"),
    # good answers: short, long, repeating a word as real answers do
    (CAPITAL, "Paris.", "stop", None),
    (CAPITAL, "Paris", None, None),
    (CAPITAL, "Le Grand Paris is the capital of France.", "stop", None),
    (CAPITAL, "The capital of France is Paris.", "stop", None),
    (
        FREEZE,
        "To freeze your card, open the app, tap your card, then tap Freeze card. You can "
        "unfreeze your card at any time from the same screen, and your card details stay the "
        "same. While your card is frozen, card payments and cash withdrawals are declined.",
        "stop",
        None,
    ),
    (
        TRANSFER,
        "Transfers between UK accounts usually arrive within two hours. International "
        "transfers take one to four working days, depending on the country and currency. "
        "Transfers made after 5pm on a working day are sent the next working day.",
        "stop",
        None,
    ),
    (
        "What should I do if my card is stolen?",
        "I'm sorry to hear that. Freeze your card in the app straight away, then call us to "
        "cancel it and order a replacement.",
        "stop",
        None,
    ),
    (
        "How do I set up a direct debit?",
        "1. Open the app. 2. Tap Payments. 3. Tap Direct debits. 4. Tap New direct debit and "
        "enter the details. 5. Confirm with your passcode.",
        "stop",
        None,
    ),
    ("What is 2 + 2?", "4", "stop", None),
    ("How do you say thank you in Japanese?", "ありがとう (arigatou).", "stop", None),
    ("How do you say hello in Chinese?", "你好", "stop", None),
    ("What does 'merci beaucoup' mean in English?", "It means thank you very much.", "stop", None),
    (CAPITAL_ZH, "法国的首都是巴黎。", "stop", None),
    (CAPITAL_ZH, "巴黎。", "stop", None),
    (
        FREEZE_ZH,
        "打开手机银行，进入银行卡页面，点击冻结。冻结后，银行卡的消费和取现都会被拒绝，您可以随时在同一页面解冻。",
        "stop",
        None,
    ),
    ("怎么下载App？", "在应用商店搜索我们的App，然后点击下载安装。", "stop", None),
    ("What is the chemical formula of water?", "H2O.", "stop", None),
    # somewhere without an address, in the product, or a number that is no phone number
    (
        FREEZE,
        "Visit your nearest branch with photo ID, or go to Settings in the app.",
        "stop",
        None,
    ),
    (
        "What should I do if my card is stolen?",
        "Freeze it in the app, then call the number on the back of your card.",
        "stop",
        None,
    ),
    (
        TRANSFER,
        "Most arrive within 2 hours; from 2019-2024 the limit was 1,000,000. Fees are 2.5%.",
        "stop",
        None,
    ),
    (
        "Which runtime do I need?",
        "Node.js 18.2 or later, e.g. on a Ph.D. lab's laptop.",
        "stop",
        None,
    ),
    (FREEZE, "Your card.It is frozen now, as of 2026-12-03 at 10:30.", "stop", None),
    (
        FREEZE_ZH,
        "登录手机银行，进入“卡片管理”，点击“临时冻结”；也可以拨打客服热线办理。",
        "stop",
        None,
    ),
    (
        "What is an ISA?",
        "An ISA (Individual Savings Account) is a tax-free savings account. You can put up to "
        "£20,000 a year into ISAs.",
        "stop",
        None,
    ),
]


@pytest.mark.parametrize(("question", "answer", "finish_reason", "problem"), CASES)
def test_answer_problem(
    question: str, answer: str, finish_reason: str | None, problem: str | None
) -> None:
    assert answer_problem(question, answer, finish_reason) == problem


def test_cases_cover_every_problem_and_good_answers() -> None:
    assert len(CASES) >= 40
    assert {c[3] for c in CASES} == {*PROBLEMS, None}
    assert sum(1 for c in CASES if c[3] is None) >= 15


def test_uncacheable_adds_the_question_s_time_sensitivity() -> None:
    good = "It is sunny and 21 degrees."
    assert uncacheable("What's the weather in London today?", good, "stop") == "time_sensitive"
    assert uncacheable(FREEZE, "Open the app and tap Freeze card.", "stop") is None
    assert uncacheable(FREEZE, "I'm sorry, I can't help with that.", "stop") == "refusal"
    assert set(CACHE_SKIP_REASONS) <= set(CHECKS)


def test_an_answer_that_sends_the_reader_elsewhere_is_stored_only_where_allowed() -> None:
    """Never cached nor published by default (``link``); EDGEQA_ALLOW_ANSWER_LINKS lets a
    deployment whose answers link to its own pages through, every other check still applied."""
    from policy.answers import checks_passed

    linked = "To freeze your card, visit evil.example and log in."
    assert uncacheable(FREEZE, linked, "stop") == "link"
    assert answer_problem(FREEZE, linked, "stop") == "link"
    assert uncacheable(FREEZE, linked, "stop", allow_links=True) is None
    assert answer_problem(FREEZE, linked, "length", allow_links=True) == "truncated"
    assert checks_passed() == ",".join(CHECKS) and "link" in CHECKS
    assert "link" not in checks_passed(allow_links=True).split(",")
