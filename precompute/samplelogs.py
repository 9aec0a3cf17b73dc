"""Realistic sample request logs, for the demo and the tests.

Support questions of a retail bank (written for edgeqa), each asked in several wordings as people
do: the most common one, near-duplicates of it ("how can I...", "how to..."), and a paraphrase
further away. Most questions are asked with Zipf popularity by a pool of users over a window of
days; a few are asked by only 7 or 10 people, spread over their near-duplicate wordings so that no
wording alone is typed by k=5 of them (the question publishes; k counts people per question); and
a few people add a rare aside to a hot question ("... asap", a name), which must never be
published as text. Plus what the mining rules must exclude: questions carrying personal data,
multi-turn follow-ups, failed requests, and a long tail of questions only one user asked. Users are
stored as salted hashes, as the origin does; the bank's customers ask from its app, logged in, so
every row is a signed user's (``signed``: the deployment's backend signed their token), as the
crowd rule wants (``EDGEQA_MIN_SIGNED_USERS``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from datetime import UTC, date, datetime, timedelta
from typing import Any

from base.keys import key, normalize
from base.logs import LogWriter
from base.store import Store
from base.users import hash_user

# each question: its most common wording, two near-duplicates of it, then a paraphrase
INTENTS: tuple[tuple[str, ...], ...] = (
    (
        "How do I reset my online banking password?",
        "How can I reset my online banking password?",
        "how to reset my online banking password",
        "I forgot my password, how do I reset it?",
    ),
    (
        "How long does a bank transfer take?",
        "How long do bank transfers take?",
        "how long will my bank transfer take",
        "When will my transfer arrive?",
    ),
    (
        "How do I freeze my card?",
        "how can I freeze my card",
        "how to freeze my card",
        "how can I freeze my debit card",
    ),
    (
        "What should I do if my card is stolen?",
        "what do I do if my card is stolen",
        "What should I do if my card was stolen?",
        "my card was stolen what do i do",
    ),
    (
        "How do I change my address?",
        "how can I change my address",
        "how to change my address",
        "how can i update my home address",
    ),
    (
        "Why was my card declined?",
        "why did my card get declined",
        "Why is my card declined?",
        "my card payment was declined why",
    ),
    (
        "How do I order a new card?",
        "how can I order a new card",
        "how to order a new card",
        "how can I get a replacement card",
    ),
    (
        "What are your opening hours?",
        "what are your opening hours please",
        "what are the opening hours",
        "when are you open",
    ),
    (
        "How do I set up a direct debit?",
        "how can i set up a direct debit",
        "how to set up a direct debit",
        "how can i create a direct debit",
    ),
    (
        "Is there a fee for international transfers?",
        "is there a fee for an international transfer",
        "Are there fees for international transfers?",
        "do international transfers cost anything",
    ),
    (
        "How do I activate my new card?",
        "how can I activate my new card",
        "how to activate my new card",
        "how can I activate my card",
    ),
    (
        "What is the daily ATM withdrawal limit?",
        "What is my daily ATM withdrawal limit?",
        "what's the daily ATM withdrawal limit",
        "how much cash can I take out per day",
    ),
    (
        "How do I close my account?",
        "how can I close my account",
        "how to close my account",
        "I want to close my account",
    ),
    (
        "Can I get a paper statement?",
        "could I get a paper statement",
        "Can I request a paper statement?",
        "how do i request a printed statement",
    ),
    (
        "How do I dispute a transaction?",
        "how can I dispute a transaction",
        "how to dispute a transaction",
        "how can I dispute a card payment",
    ),
    (
        "What is my sort code?",
        "what is my sort code please",
        "whats my sort code",
        "where can I find my sort code",
    ),
)
# Chinese support questions of the same bank (written for edgeqa), each in 3-4 wordings,
# the first the most common. Pairs that differ by a number or a negation only (three vs two
# wrong PINs, one- vs three-year deposits, can vs cannot use a card abroad) must never answer
# each other. The embedded LLM writes no usable Chinese: the demo publishes ZH_ANSWERS, the
# operator's answers (precompute/curated.py), for them.
ZH_INTENTS: tuple[tuple[str, ...], ...] = (
    (
        "怎么重置网银登录密码？",
        "网银密码忘了怎么办",
        "我忘记登录密码了，怎么重新设置？",
        "手机银行密码怎么重置",
    ),
    (
        "跨行转账多久能到账？",
        "跨行转账一般要多长时间",
        "转给别的银行的钱什么时候能到？",
        "跨行汇款到账要多久",
    ),
    (
        "怎么冻结我的银行卡？",
        "银行卡怎么临时冻结",
        "帮我把借记卡冻结一下",
        "如何暂时锁定我的卡",
    ),
    (
        "银行卡被偷了怎么办？",
        "我的卡被人偷了，该怎么处理",
        "钱包连卡一起被偷了怎么办",
        "卡被盗了要怎么挂失",
    ),
    (
        "怎么修改我的联系地址？",
        "账户上的家庭住址在哪里改",
        "我搬家了，怎么更新地址",
        "如何变更预留的通讯地址",
    ),
    (
        "为什么我的卡被拒付了？",
        "刷卡付款被拒绝是什么原因",
        "付款时银行卡显示交易被拒怎么回事",
    ),
    (
        "网点的营业时间是几点到几点？",
        "支行几点开门",
        "你们营业厅什么时候上班",
    ),
    (
        "境外汇款要收手续费吗？",
        "往国外转账收费吗",
        "跨境汇款的手续费是多少",
    ),
    (
        "密码输错三次会锁卡吗？",
        "连续输错三次密码卡会被锁吗",
        "输错3次密码会不会被冻结",
    ),
    (
        "密码输错两次会锁卡吗？",
        "连续输错两次密码卡会被锁吗",
        "输错2次密码会不会被冻结",
    ),
    (
        "一年期定期存款利率是多少？",
        "定期存一年利息是多少",
        "1年定期的年利率多少",
        "存一年定期利率怎么算",
    ),
    (
        "三年期定期存款利率是多少？",
        "定期存三年利息是多少",
        "3年定期的年利率多少",
        "存三年定期利率怎么算",
    ),
    (
        "我的卡能在国外用吗？",
        "出国旅游银行卡可以刷吗",
        "这张卡支持境外消费吗",
        "借记卡在国外能用吗",
    ),
    (
        "我的卡为什么不能在国外用？",
        "在国外刷卡一直不成功是什么原因",
        "出国后银行卡用不了怎么办",
        "为什么借记卡在国外不能用",
    ),
)
ZH_ANSWERS: tuple[str, ...] = (
    "在登录页点击“忘记密码”，用预留手机号接收验证码并验证身份后，即可设置新的网银登录密码。新密码请勿与支付密码相同。",
    "跨行转账通过网上银行或手机银行提交后，一般实时或两小时内到账；选择普通到账或在非工作时间提交的，通常在下一个工作日到账。",
    "登录手机银行，进入“卡片管理”，选择要冻结的卡并点击“临时冻结”即可；也可以拨打客服热线办理。解冻在同一页面操作。",
    "请立即在手机银行或拨打客服热线办理挂失，冻结卡片防止盗刷；如有可疑交易请及时报警并保留凭证，再到网点补办新卡。",
    "登录手机银行，进入“我的”—“个人信息”即可修改联系地址；部分账户需要携带身份证件到任一网点办理。",
    "交易被拒常见原因有：余额不足、超出单笔或单日限额、卡片已冻结或过期、密码错误，或风控系统拦截了可疑交易。可在手机银行查看原因或联系客服。",
    "大多数网点周一至周五营业，周末部分网点也提供服务。具体营业时间请在手机银行的“网点查询”中查看所在网点。",
    "境外汇款一般收取汇款手续费和电报费，具体金额按汇款金额和币种计算；收款行和中转行也可能另行扣费。提交前页面会显示预计费用。",
    "当日连续输错三次密码，银行卡会被暂时锁定，次日零点自动解锁；如需立即使用，可携带身份证件到网点重置密码。",
    "连续输错两次密码不会锁卡，但再输错一次就会被当日锁定。如果记不清密码，建议先通过手机银行重置密码。",
    "一年期定期存款的利率以办理当日银行公布的挂牌利率为准，可在手机银行“存款”页面或网点查询；到期利息等于本金乘以年利率。",
    "三年期定期存款的利率以办理当日银行公布的挂牌利率为准，通常高于一年期；利息按本金乘以年利率再乘以三年计算。",
    "带有银联、Visa或万事达标识的银行卡可以在境外使用。出国前请在手机银行开通境外交易功能，并了解境外取现和消费的手续费。",
    "卡片在境外无法使用，常见原因是未开通境外交易功能、当地商户不受理该卡组织，或交易被风控拦截。可在手机银行开通境外交易或联系客服。",
)
NEAR_DUPLICATES = 3  # the first wordings of each question, which cluster together
# what one person adds to a hot question: never published (fewer than k typed it)
ASIDES = (" asap", " quickly", "?? urgent", ", I am Anna Kowalczyk")

PII_TEMPLATES = (
    "My email is {name}@example.com, why can't I log in?",
    "Please call me back on +44 7700 900{n:03d}",
    "Is my card 4111 1111 1111 1111 blocked?",
    "My social security number is 123-45-{n:04d}, can you check my account?",
    "Why does https://bank.example.com/reset?token=abc{n}def not work?",
    "My account number is 12345{n:04d}99, what is my balance?",
)

FOLLOW_UPS = ("and what about my savings account?", "can you explain that again?", "why?")


def spread_askers(
    wordings: Sequence[str], people: Sequence[str], max_per_wording: int
) -> list[tuple[str, str]]:
    """(wording, person): one question asked once by each of ``people``, round robin over its
    ``wordings``, so that no wording is typed by more than ``max_per_wording`` of them."""
    if len(people) > len(wordings) * max_per_wording:
        raise ValueError(
            f"{len(people)} people cannot ask {len(wordings)} wordings {max_per_wording} each"
        )
    return [(wordings[i % len(wordings)], person) for i, person in enumerate(people)]


def generate_rows(
    until: date,
    days: int = 7,
    intents: int | None = None,
    users: int = 400,
    asks: int = 3000,
    zipf_s: float = 1.1,
    spread_intents: int | None = None,
    aside_rows: int = 12,
    pii_rows: int = 30,
    multi_turn_rows: int = 40,
    failed_rows: int = 10,
    tail_questions: int = 60,
    salt: bytes = b"edgeqa-sample-salt",
    seed: int = 0,
    questions: Sequence[Sequence[str]] = INTENTS,
) -> list[dict[str, Any]]:
    """Log rows (the origin's columns) for ``days`` days ending ``until``, shuffled.

    ``questions``: the wordings of each question (``INTENTS``; ``ZH_INTENTS`` for Chinese).
    ``asks`` go to the first ``intents`` questions but the last ``spread_intents`` of them
    (default: a quarter), with Zipf popularity over questions, and within a question over its
    wordings (the first most often). Each of the ``spread_intents`` is asked by 7 or 10 people
    of the pool, spread over its near-duplicate wordings (at most 4 each: no wording reaches k=5
    on its own). ``aside_rows``: one person each adds an aside to a Zipf question's wording."""
    rng = random.Random(seed)
    chosen = list(questions)[: len(questions) if intents is None else intents]
    spread = len(chosen) // 4 if spread_intents is None else spread_intents
    zipf, spread_questions = chosen[: len(chosen) - spread], chosen[len(chosen) - spread :]
    weights = [1.0 / (rank + 1) ** zipf_s for rank in range(len(zipf))]
    order = list(range(len(zipf)))
    rng.shuffle(order)  # popularity independent of the question's position
    pool = [f"user-{i:05d}" for i in range(users)]
    start = datetime.combine(until - timedelta(days=days - 1), datetime.min.time(), UTC)
    span = days * 86400 - 1

    def row(query: str, user: str, turns: int = 1, tier: str = "generated", status: int = 200):
        ts = start + timedelta(seconds=rng.randint(0, span))
        try:
            normalized, k = normalize(query), key(query)
        except ValueError:
            normalized, k = "", ""
        return {
            "ts": ts,
            "request_id": f"{rng.getrandbits(64):016x}",
            "user": hash_user(user, salt),
            "signed": True,  # logged in to the bank's app: its backend signed the user's token
            "tenant": "demo",
            "query": query,
            "normalized": normalized,
            "key": k,
            "turns": turns,
            "tier": tier,
            "status": status,
            "latency_ms": round(rng.uniform(5, 900), 1),
            "ttft_ms": round(rng.uniform(5, 400), 1),
            "profile": "",
        }

    rows = []
    if zipf:
        for index in rng.choices(order, weights=weights, k=asks):
            wordings = zipf[index]
            (query,) = rng.choices(wordings, weights=[1 / (i + 1) for i in range(len(wordings))])
            rows.append(row(query, rng.choice(pool)))
        for n in range(aside_rows):
            query = rng.choice(zipf)[0].rstrip("?").lower() + ASIDES[n % len(ASIDES)]
            rows.append(row(query, rng.choice(pool)))
    for wordings in spread_questions:
        # 7 or 10 people: 3-2-2 or 4-3-3 over the wordings, so the first is the most typed on
        # every night (a tie would be broken by asks, which change with the window)
        people = rng.sample(pool, min(rng.choice((7, 10)), len(pool)))
        for query, person in spread_askers(wordings[:NEAR_DUPLICATES], people, 4):
            rows.append(row(query, person))
    for n in range(pii_rows):
        template = PII_TEMPLATES[n % len(PII_TEMPLATES)]
        # asked by many users, so only the PII filter can stop it
        rows.append(row(template.format(name=f"alex{n % 3}", n=n % 3), pool[n % users]))
    for n in range(multi_turn_rows):
        rows.append(row(FOLLOW_UPS[n % len(FOLLOW_UPS)], pool[n % users], turns=2 + n % 3))
    for n in range(failed_rows):
        rows.append(row("x" * 10, pool[n % users], tier="rejected", status=400))
    for n in range(tail_questions):
        rows.append(row(f"Can I open account type number {n} in branch {n % 7}?", pool[n % users]))
    rng.shuffle(rows)
    return rows


def curated_answers(
    questions: Sequence[Sequence[str]] = ZH_INTENTS, answers: Sequence[str] = ZH_ANSWERS
) -> str:
    """The operator's answers (``precompute/curated.py``'s JSON Lines) to every wording of
    ``questions``."""
    import json

    return "".join(
        json.dumps({"question": wording, "answer": answer}, ensure_ascii=False) + "\n"
        for wordings, answer in zip(questions, answers, strict=True)
        for wording in wordings
    )


def write_logs(store: Store, rows: Sequence[dict[str, Any]], max_rows: int = 500) -> int:
    """Write rows through the same ``LogWriter`` the services use."""
    with LogWriter(store, source="sample", max_rows=max_rows, flush_interval_s=0) as writer:
        for r in rows:
            writer.write(**r)
    return writer.rows_written
