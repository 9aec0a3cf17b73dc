"""The guard refuses matches that differ in numbers, negation or named entities."""

from __future__ import annotations

import pytest

from semantic.guard import Guard, content_tokens, entities, negated, numbers, remove_tokens


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


# issue 17: the guard in Chinese; each pair is (query, matched, the check that refuses it)
@pytest.mark.parametrize(
    ("query", "matched", "refused"),
    [
        # numbers: Chinese numerals, composed, mixed with digits, financial forms
        ("转账三次", "转账两次", "numbers"),
        ("限额五千", "限额一万", "numbers"),
        ("一天能转两万五吗", "一天能转两万吗", "numbers"),
        ("我要存一百零五元", "我要存一百五十元", "numbers"),
        ("第三期还款", "第二期还款", "numbers"),
        ("转账1.5万要多久", "转账1万要多久", "numbers"),
        ("额度3千", "额度3万", "numbers"),
        ("支票写壹万贰仟元", "支票写壹万元", "numbers"),
        ("开两张卡", "开三张卡", "numbers"),
        ("为什么扣了我十五元", "为什么扣了我五十元", "numbers"),
        ("存款利率百分之二", "存款利率百分之三", "numbers"),
        ("我的卡能绑定几个账户，三个还是四个", "我的卡能绑定几个账户，三个还是五个", "numbers"),
        # negation: near-identical wordings, one negated
        ("我的卡不能用", "我的卡能用吗", "negation"),
        ("为什么不能转账", "能不能转账", "negation"),
        ("没有限额", "有没有限额", "negation"),
        ("我无法登录网银", "我怎么登录网银", "negation"),
        ("不要手续费吗", "要手续费吗", "negation"),
        ("信用卡不可以取现", "信用卡可以取现吗", "negation"),
        ("我没收到验证码", "我收到验证码了吗", "negation"),
        ("别取消我的订单", "取消我的订单", "negation"),
        ("这张卡未激活", "这张卡激活了吗", "negation"),
        ("Apple Pay不能用", "Apple Pay能用吗", "negation"),
        # entities: Latin words, codes and known names inside Chinese sentences
        ("我想用Apple Pay付款", "我想用Google Pay付款", "entities"),
        ("Apple Pay能在中国用吗", "Google Pay能在中国用吗", "entities"),
        ("怎么用USD汇款", "怎么用EUR汇款", "entities"),
        ("美元怎么汇款", "欧元怎么汇款", "entities"),
        ("工商银行的卡怎么挂失", "建设银行的卡怎么挂失", "entities"),
        ("支付宝怎么绑卡", "微信怎么绑卡", "entities"),
        ("A股怎么开户", "B股怎么开户", "entities"),
        ("用visa卡付款", "用mastercard付款", "entities"),
    ],
)
def test_refused_in_chinese(query: str, matched: str, refused: str) -> None:
    assert Guard().check(query, matched) == refused
    assert Guard().check(matched, query) == refused
    assert Guard(numbers=False, negations=False, entities=False).check(query, matched) is None


@pytest.mark.parametrize(
    ("query", "matched"),
    [
        # the same number written another way
        ("转账3次", "转账三次"),
        ("限额五千", "限额5000"),
        ("限额１００００", "限额一万"),  # full-width digits
        ("取1.5万现金", "取一万五现金"),
        ("额度3千够吗", "额度三千够吗"),
        ("一百零五元", "105元"),
        ("二〇二四年的账单", "2024年的账单"),
        ("第3期还款", "第三期还款"),
        ("支票写壹万贰仟元", "支票写一万二千元"),
        # words built on numerals are not numbers
        ("帮我查一下5000元的转账", "查5000元的转账"),
        ("一些转账失败了，3笔", "转账失败了3笔"),
        ("千万别忘记密码", "密码忘了2次怎么办"),  # only one has a number
        ("万一卡丢了怎么办", "卡丢了怎么办"),
        ("手续费十分贵，要10元", "手续费要10元"),
        ("统一收费5元", "收费5元"),
        # A-not-A questions, closing 了没有, and words that only contain a negator
        ("能不能转账", "可以转账吗"),
        ("是不是要手续费", "要手续费吗"),
        ("钱到账了没有？", "钱到账了吗？"),
        ("别人能用我的卡吗", "他人能用我的卡吗"),
        ("转账非常慢", "转账很慢"),
        ("信用卡和借记卡有什么区别", "信用卡和借记卡有什么差异"),
        # negation between different wordings is left to the embedding
        ("我的新卡还没到", "新卡什么时候寄到"),
        # entities: the same name in other letters or words, or only one side names one
        ("我想用apple pay付款", "我想用Apple Pay付款"),
        ("支付宝怎么绑卡", "Alipay怎么绑卡"),
        ("美元怎么汇款", "怎么用USD汇款"),
        ("手机APP怎么登录", "手机app怎么登录"),
        ("手机APP怎么登录", "网银怎么登录"),
        ("How do I say 银行 in English?", "How do I say bank in English?"),
    ],
)
def test_allowed_in_chinese(query: str, matched: str) -> None:
    assert Guard().check(query, matched) is None
    assert Guard().check(matched, query) is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("十五", ["15"]),
        ("二十三", ["23"]),
        ("一百零五", ["105"]),
        ("一千零一", ["1001"]),
        ("三千", ["3000"]),
        ("三百五", ["350"]),
        ("两万五", ["25000"]),
        ("一万二千三百四十五", ["12345"]),
        ("一亿五千万", ["150000000"]),
        ("一万亿", ["1000000000000"]),
        ("第十", ["10"]),
        ("3千", ["3000"]),
        ("1.5万", ["15000"]),
        ("2万5", ["25000"]),
        ("５０００", ["5000"]),
        ("二〇二四", ["2024"]),
        ("叁佰", ["300"]),
        ("三十分钟", ["30"]),
        ("一千万", ["10000000"]),
        ("五千克", ["5"]),
        ("版本1.2.3万", ["1.2.3万"]),
        # not numbers
        ("一下 一些 一起 万一 一定 统一 唯一 一般 三思 零钱", []),
        ("千万别忘了", []),
        ("十分方便", []),
        ("三星和百度", []),
        ("一下午", ["1"]),
    ],
)
def test_chinese_numbers(text: str, expected: list[str]) -> None:
    assert numbers(text) == expected


def test_chinese_parts() -> None:
    assert negated("我的卡不能用") and negated("无法登录") and negated("没有限额")
    assert negated("甭等了") and negated("请勿转账") and negated("为什么不能转账")
    assert not negated("能不能转账") and not negated("可不可以取消") and not negated("有没有限额")
    assert not negated("钱到账了没有？") and not negated("非常好") and not negated("别人的卡")
    assert entities("100美元换成欧元") == {"usd", "eur"}
    assert entities("微信支付和Alipay") == {"wechat", "pay", "alipay"}
    assert entities("Apple Pay能用吗") == {"apple", "pay"}
    assert entities("我的卡3天到") == set()
    assert entities("How do I say 银行 in English?") == {"english"}


def test_identical_symbols_pass() -> None:
    assert Guard().check("I paid $5 in fees", "I paid $5 in fees") is None


def test_content_tokens_are_what_k_anonymity_counts() -> None:
    # words as normalize() folds them, function words left out, no stemming
    assert content_tokens("How do I reset my Online Banking passwords?") == {
        "reset",
        "online",
        "banking",
        "passwords",
    }
    assert content_tokens("I don't have it") == set()  # function words only
    # a name is a token whatever its case; numbers by value and as written; symbols and codes
    assert {"jan", "kowalski"} <= content_tokens("my landlord jan kowalski kept my deposit")
    assert content_tokens("Can I send $1,000 in USD?") >= {"send", "$", "1", "000", "1000", "usd"}
    assert content_tokens("ＵＳＤ ５") == {"usd", "5"}  # full width folded
    # Chinese: each content character and each pair of adjacent ones; function characters not
    assert content_tokens("王小明的卡") == {"王", "小", "明", "王小", "小明", "卡"}
    assert "美元" in content_tokens("用美元付款") and "usd" in content_tokens("用美元付款")
    assert content_tokens("三千") >= {"3000"}


def test_remove_tokens_takes_out_words_and_characters() -> None:
    assert remove_tokens("My landlord Jan Kowalski kept my deposit.", {"jan", "kowalski"}) == (
        "My landlord kept my deposit."
    )
    assert remove_tokens("How do I reset it, asap?", {"asap"}) == "How do I reset it?"
    assert remove_tokens("我的卡丢了王芳", {"王芳"}) == "我的卡丢了"
    assert remove_tokens("王芳的卡", {"王"}) == "芳的卡"
