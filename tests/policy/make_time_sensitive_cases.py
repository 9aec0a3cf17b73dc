"""Writes time_sensitive_cases.jsonl: labelled questions for the time-sensitivity detector.

Positives are questions whose right answer changes with the time they are asked: relative dates
("tomorrow", "last night", 昨天), the present moment ("right now", "currently", 现在), the latest
of something ("latest version", "breaking news", 最新), market prices (shares, currencies,
crypto, fuel; 股价, 汇率), the weather (天气), sports scores and results (比分), and countdowns
("how long until", 还有几天). Negatives are ordinary questions whose answer does not change:
banking and app FAQs (durations, fees, how-tos, opening hours in general), general knowledge,
history (results of a named year), science (the temperature of the sun), words that look
temporal but are not ("current account", "latest time I can transfer", 最近的网点 "the nearest
branch"). Templates are filled from small lists of subjects; each line:
``{"text": ..., "kind": "weather" | ... | null, "lang": "en" | "zh", "split": "dev" | "holdout"}``
(``holdout``: questions written after the detector, and not used to tune it).
Labels are decided here, from what the question asks, independently of
``policy/timeliness.py``. Run: python tests/policy/make_time_sensitive_cases.py
"""

from __future__ import annotations

import json
import random
from pathlib import Path

RNG = random.Random(20261202)

CITIES = ["London", "Paris", "Tokyo", "New York", "Berlin", "Sydney", "Madrid", "Toronto"]
CITIES_ZH = ["北京", "上海", "广州", "深圳", "杭州", "成都", "武汉", "西安"]
TEAMS = ["Arsenal", "the Lakers", "Real Madrid", "the Yankees", "Liverpool", "the Warriors"]
TEAMS_ZH = ["国足", "湖人", "皇马", "广州队", "中国女排", "山东泰山"]
STOCKS = ["Apple", "Tesla", "Microsoft", "Nvidia", "Amazon", "Alibaba"]
STOCKS_ZH = ["茅台", "腾讯", "阿里巴巴", "比亚迪", "宁德时代", "工商银行"]
CURRENCIES = [("dollars", "euros"), ("pounds", "dollars"), ("euros", "yen"), ("GBP", "USD")]
CURRENCIES_ZH = ["美元", "欧元", "英镑", "日元", "港币"]
EVENTS = ["Christmas", "New Year", "the World Cup final", "Black Friday", "the summer holidays"]
EVENTS_ZH = ["春节", "国庆节", "中秋节", "高考", "元旦", "双十一"]
PRODUCTS = ["iPhone", "Android", "the banking app", "Windows", "Python", "Chrome"]
PRODUCTS_ZH = ["微信", "手机银行", "安卓系统", "苹果手机", "支付宝", "鸿蒙系统"]


def pick(items: list) -> object:
    return RNG.choice(items)


# (kind, templates); {c} city, {t} team, {s} stock, {a}/{b} currencies, {e} event, {p} product
POSITIVE_EN = {
    "relative_date": [
        "Is the branch open today?",
        "What's happening in {c} this weekend?",
        "Will my transfer arrive by tomorrow if I send it tonight?",
        "What time does the sun set in {c} today?",
        "What was the top story yesterday?",
        "Are there any train strikes in {c} next week?",
        "What holidays are there this month?",
        "Did {t} play last night?",
        "What happened in {c} yesterday afternoon?",
        "Is today a bank holiday?",
        "What concerts are on in {c} tonight?",
        "Which films come out this Friday?",
        "What's the ISA allowance this year?",
        "What events are on in {c} next month?",
        "Is there a full moon tonight?",
        "What was announced at the conference two days ago?",
    ],
    "now": [
        "What time is it in {c}?",
        "What is the current time in {c}?",
        "Is the app down right now?",
        "What is the current interest rate on savings?",
        "Who is currently leading the polls?",
        "Is {c} airport open right now?",
        "What is the current inflation rate?",
        "What day is it today?",
        "Is the branch on the high street open now?",
        "What are the current mortgage rates?",
        "Who is the current prime minister of the UK?",
        "Are flights to {c} currently delayed?",
        "What is my balance at the moment?",
        "How busy is the {c} branch right now?",
    ],
    "latest": [
        "What is the latest version of {p}?",
        "What's the latest news about {s}?",
        "Any breaking news from {c}?",
        "What are the most recent updates to {p}?",
        "What are today's headlines?",
        "What's the newest {p} release?",
        "Has the new {p} been released yet?",
        "What's trending on social media?",
        "What are the latest COVID rules in {c}?",
        "Give me the latest results of the election",
        "What is the most recent earthquake?",
        "Are there live updates on the {c} protests?",
    ],
    "price": [
        "What is the {s} stock price?",
        "How much is one bitcoin worth?",
        "What's the price of gold per ounce?",
        "How much is 100 {a} in {b}?",
        "What is the exchange rate from {a} to {b}?",
        "How much is petrol in {c}?",
        "What is {s} trading at?",
        "What's the price of a barrel of oil?",
        "How much is a share of {s}?",
        "How is the stock market doing?",
        "What's the Nasdaq at?",
        "Convert 50 {a} to {b}",
        "What are gas prices like in {c}?",
        "What is the market cap of {s}?",
    ],
    "weather": [
        "What's the weather in {c}?",
        "Will it rain in {c} tomorrow?",
        "Is it snowing in {c}?",
        "What is the temperature in {c}?",
        "What's the weather forecast for the weekend?",
        "How hot is it in {c} today?",
        "Is it going to be sunny this afternoon?",
        "What's the air quality in {c}?",
        "How is the weather looking for {e}?",
        "Do I need an umbrella in {c} today?",
        "What is the UV index in {c}?",
    ],
    "score": [
        "What's the score in the {t} game?",
        "Who won the {t} match last night?",
        "Who is winning the election?",
        "What was the final score of {t}'s game?",
        "Who won the Super Bowl?",
        "What are the Premier League standings?",
        "Live score for {t}",
        "Who is leading the Tour de France?",
        "Did {t} win yesterday?",
        "Who won the F1 race?",
    ],
    "countdown": [
        "How long until {e}?",
        "How many days until {e}?",
        "How many days are left until {e}?",
        "How long till the clocks go back?",
        "When is the next bank holiday?",
        "How many weeks until {e}?",
        "Countdown to {e}",
        "How many sleeps until {e}?",
        "When is the next full moon?",
    ],
}

POSITIVE_ZH = {
    "relative_date": [
        "{c}今天限行吗？",
        "明天银行上班吗？",
        "昨天{c}发生了什么？",
        "这个周末{c}有什么活动？",
        "下周有哪些新电影上映？",
        "今晚有什么比赛？",
        "今年的个税起征点是多少？",
        "上个月的CPI是多少？",
        "今天是农历几号？",
        "后天{c}有演唱会吗？",
        "本周的理财产品收益率是多少？",
    ],
    "now": [
        "现在几点了？",
        "{c}现在几点？",
        "目前的贷款利率是多少？",
        "现在还能预约开户吗？",
        "当前的通货膨胀率是多少？",
        "现任美国总统是谁？",
        "手机银行现在能用吗？",
        "现在营业厅开门吗？",
        "目前{c}机场航班正常吗？",
    ],
    "latest": [
        "{p}最新版本是多少？",
        "有什么最新消息？",
        "今天的新闻头条是什么？",
        "最近有什么热搜？",
        "{s}最新公告是什么？",
        "最新的防疫政策是什么？",
        "最近一次地震在哪里？",
        "{p}最近更新了什么功能？",
    ],
    "price": [
        "{s}股价多少？",
        "今天美元兑人民币汇率是多少？",
        "一{m}等于多少人民币？",
        "金价多少钱一克？",
        "{c}油价多少？",
        "比特币现在多少钱？",
        "{s}的股票涨了吗？",
        "大盘行情怎么样？",
        "黄金价格是多少？",
        "{c}房价多少钱一平？",
    ],
    "weather": [
        "{c}天气怎么样？",
        "{c}明天会下雨吗？",
        "今天气温多少度？",
        "{c}空气质量怎么样？",
        "周末天气预报",
        "{c}会下雪吗？",
        "今天出门要带伞吗？",
        "{c}今天几度？",
    ],
    "score": [
        "{t}比赛比分是多少？",
        "{t}昨晚赢了吗？",
        "世界杯比赛结果",
        "中超积分榜",
        "谁赢了今天的比赛？",
        "{t}的比赛谁赢了？",
        "NBA比分直播",
    ],
    "countdown": [
        "距离{e}还有几天？",
        "离{e}还有多少天？",
        "{e}倒计时",
        "下一个法定节假日是什么时候？",
        "还有多久到{e}？",
        "离{e}还剩几天？",
    ],
}

NEGATIVE_EN = [
    "How do I freeze my card?",
    "What is the capital of France?",
    "How long does a transfer take?",
    "How long does it take to get a new card?",
    "How long before my refund shows up?",
    "How many days does a cheque take to clear?",
    "How do I reset my online banking password?",
    "What should I do if my card is stolen?",
    "How do I open a current account?",
    "What is the difference between a current account and a savings account?",
    "What's the latest time I can make a same-day transfer?",
    "What is the latest I can cancel a direct debit?",
    "What are your opening hours?",
    "What time does the branch open on Saturdays?",
    "Is the branch open on Sundays?",
    "Is there a fee for international transfers?",
    "How much does a replacement card cost?",
    "What exchange rate do you use for card payments abroad?",
    "How is the exchange rate calculated on my statement?",
    "Can I pay in euros with my debit card?",
    "What is the daily ATM withdrawal limit?",
    "How do I improve my credit score?",
    "What credit score do I need for a mortgage?",
    "How does the stock market work?",
    "What is a stock split?",
    "What is inflation?",
    "How do interest rates affect mortgages?",
    "What is the difference between weather and climate?",
    "How do hurricanes form?",
    "What is the temperature of the sun?",
    "At what temperature does water boil?",
    "What temperature should I wash wool at?",
    "Does it snow in Sydney?",
    "Why is the sky blue?",
    "Who won the World Cup in 2018?",
    "Who won the first Super Bowl?",
    "Who was the first president of the United States?",
    "When did World War II end?",
    "What year did the Berlin Wall fall?",
    "How many days are in a leap year?",
    "How many weeks are there in a year?",
    "What day of the week was 1 January 2000?",
    "How do I set up a direct debit?",
    "How do I change my address?",
    "Why was my card declined?",
    "How do I order a new card?",
    "How do I activate my new card?",
    "Can I get a paper statement?",
    "How do I dispute a transaction?",
    "What is my sort code?",
    "Where can I find my account number?",
    "How do I close my account?",
    "What is compound interest?",
    "How do I convert a PDF to Word?",
    "What is the speed of light?",
    "How many continents are there?",
    "Who wrote Pride and Prejudice?",
    "What is photosynthesis?",
    "How do vaccines work?",
    "How do I make pancakes?",
    "What is the boiling point of ethanol?",
    "How tall is Mount Everest?",
    "How far is the moon from the earth?",
    "What language is spoken in Brazil?",
    "How do I update the banking app?",
    "How do I turn on notifications?",
    "Can I use my card abroad?",
    "What does APR mean?",
    "How do I report a lost card?",
    "Is contactless payment safe?",
    "How long is a football match?",
    "How many players are on a basketball team?",
    "What are the rules of cricket?",
    "How is a tennis match scored?",
    "What is a good price to earnings ratio?",
    "How do I read a weather map?",
    "Why do we have seasons?",
    "How do I say thank you in Japanese?",
    "What time zone is {c} in?",
    "What is {c} famous for?",
    "How do I get from the airport to {c} city centre?",
    "What is the population density of a city?",
    "How do I add a payee?",
    "How do I increase my contactless limit?",
    "Why is my transfer pending?",
    "How do I download my statements?",
    "What documents do I need to open an account?",
    "Can I have two current accounts?",
    "How do I switch my current account to you?",
    "What happens if I miss a credit card payment?",
    "How long does it take to boil an egg?",
    "How long should I keep my bank statements?",
    "How many hours of sleep does an adult need?",
    "When does a cheque expire?",
    "When is interest paid on my savings account?",
    "When will I get my new PIN?",
    "What happens to my direct debits when I switch banks?",
    "What is the minimum balance for a savings account?",
    "How do I check my balance in the app?",
    "Can I get cashback at the till?",
    "What is a stock exchange?",
    "How are bitcoin prices determined?",
    "What affects the price of gold?",
    "Why do petrol prices vary between countries?",
    "How does a weather forecast work?",
    "What causes rain?",
    "What is the average temperature in {c} in July?",
    "Who invented the telephone?",
    "How many goals did Pele score in his career?",
    "What is the offside rule?",
    "How many days until a payment is considered late?",
    "What is the grace period on my credit card?",
    "How do I schedule a payment for a later date?",
    "How do I cancel a standing order?",
    "Is my money protected if the bank fails?",
    "What is the difference between debit and credit cards?",
    "How do I become a member of the loyalty scheme?",
    "How do I set a travel notice?",
    "What is two-factor authentication?",
]

NEGATIVE_ZH = [
    "怎么冻结我的银行卡？",
    "法国的首都是哪里？",
    "转账多久能到账？",
    "补办银行卡需要多长时间？",
    "怎么重置网银密码？",
    "银行卡被盗了怎么办？",
    "怎么修改我的地址？",
    "为什么我的卡被拒了？",
    "营业时间是几点到几点？",
    "周末营业吗？",
    "跨境汇款收手续费吗？",
    "ATM每天取现限额是多少？",
    "离我最近的网点在哪里？",
    "最近的ATM在哪？",
    "怎么开通手机银行？",
    "信用卡怎么还款？",
    "怎么提高信用评分？",
    "什么是通货膨胀？",
    "股票是怎么交易的？",
    "天气和气候有什么区别？",
    "台风是怎么形成的？",
    "太阳表面温度有多高？",
    "水的沸点是多少度？",
    "2018年世界杯冠军是谁？",
    "中国第一位皇帝是谁？",
    "第二次世界大战什么时候结束的？",
    "闰年有多少天？",
    "一年有多少个星期？",
    "怎么设置自动扣款？",
    "怎么挂失银行卡？",
    "怎么注销账户？",
    "如何申请纸质对账单？",
    "怎么查询交易明细？",
    "开户需要什么材料？",
    "什么是复利？",
    "光速是多少？",
    "世界上有几个大洲？",
    "《红楼梦》的作者是谁？",
    "什么是光合作用？",
    "珠穆朗玛峰有多高？",
    "巴西说什么语言？",
    "怎么更新手机银行？",
    "银行卡可以在国外使用吗？",
    "年化利率是什么意思？",
    "篮球比赛有几节？",
    "足球比赛多长时间？",
    "乒乓球怎么计分？",
    "市盈率是什么意思？",
    "为什么会有四季？",
    "日语的谢谢怎么说？",
    "{c}有什么好玩的地方？",
    "从机场怎么去{c}市中心？",
    "怎么添加收款人？",
    "怎么提高免密支付额度？",
    "为什么转账一直在处理中？",
    "怎么下载电子回单？",
    "一个人可以开几张银行卡？",
    "外币账户怎么开？",
    "美元账户可以转账到国外吗？",
    "怎么预约大额取现？",
    "忘记支付密码怎么办？",
    "手机号换了怎么办？",
    "怎么绑定微信支付？",
    "存款利息怎么计算？",
    "信用卡逾期会有什么后果？",
    "煮鸡蛋要多长时间？",
    "支票的有效期是多久？",
    "储蓄账户的利息什么时候发放？",
    "新密码多久能收到？",
    "什么是证券交易所？",
    "金价受什么因素影响？",
    "天气预报是怎么做出来的？",
    "下雨是怎么形成的？",
    "电话是谁发明的？",
    "越位是什么意思？",
    "怎么设置定时转账？",
    "怎么取消定期转账？",
    "银行倒闭了存款安全吗？",
    "借记卡和信用卡有什么区别？",
    "什么是双重认证？",
    "{c}七月份的平均气温是多少？",
    "成年人每天需要睡几个小时？",
]

# written after the detector was: measured apart ("split": "holdout"), never tuned on
HOLDOUT = [
    ("Are the trains running on time this morning?", "relative_date", "en"),
    ("What's on TV tonight?", "relative_date", "en"),
    ("Will the shops be open tomorrow?", "relative_date", "en"),
    ("Who played at Glastonbury last year?", "relative_date", "en"),
    ("What did the Fed decide yesterday?", "relative_date", "en"),
    ("Is there traffic on the M25 right now?", "now", "en"),
    ("Is online banking working at the moment?", "now", "en"),
    ("What is the current bank of England base rate?", "now", "en"),
    ("Who is the CEO of Twitter?", "now", "en"),
    ("Is the website down?", "now", "en"),
    ("What's the newest Pixel phone?", "latest", "en"),
    ("Any news on the rail strike?", "latest", "en"),
    ("What is the latest iOS update?", "latest", "en"),
    ("Show me the most recent Bank of England announcement", "latest", "en"),
    ("How much is an ounce of silver?", "price", "en"),
    ("What's the euro to dollar rate?", "price", "en"),
    ("How much is 1 bitcoin in pounds?", "price", "en"),
    ("What's Amazon's share price?", "price", "en"),
    ("Is it windy in Chicago?", "weather", "en"),
    ("What's the weather going to be like on Saturday?", "weather", "en"),
    ("Will it snow this week?", "weather", "en"),
    ("Who won the Champions League final?", "score", "en"),
    ("What's the cricket score?", "score", "en"),
    ("Who is top of the league?", "score", "en"),
    ("How long until Easter?", "countdown", "en"),
    ("How many days left till my birthday on 3 May?", "countdown", "en"),
    ("When's the next solar eclipse?", "countdown", "en"),
    ("明天早上会不会下雨？", "weather", "zh"),
    ("今天的黄金价格", "relative_date", "zh"),
    ("上证指数现在多少点？", "now", "zh"),
    ("港币兑人民币汇率", "price", "zh"),
    ("最新的iPhone是哪一款？", "latest", "zh"),
    ("昨晚的球赛谁赢了？", "relative_date", "zh"),
    ("距离元宵节还有多少天？", "countdown", "zh"),
    ("北京这周末天气怎么样？", "weather", "zh"),
    ("现在美元能换多少人民币？", "now", "zh"),
    ("今年春节是几月几号？", "relative_date", "zh"),
    ("湖人队最近战绩怎么样？", "latest", "zh"),
    ("How long does it take to open an account?", None, "en"),
    ("How long until my new card arrives in the post?", None, "en"),
    ("What happens if I go over my overdraft limit?", None, "en"),
    ("How do I change the currency of my account?", None, "en"),
    ("What's the best way to save for a house deposit?", None, "en"),
    ("How are mortgage rates set?", None, "en"),
    ("Why does the exchange rate change?", None, "en"),
    ("Can I withdraw dollars at your branches?", None, "en"),
    ("What time does the branch close on weekdays?", None, "en"),
    ("Do you open on bank holidays?", None, "en"),
    ("How many days does a SEPA transfer take?", None, "en"),
    ("Who discovered penicillin?", None, "en"),
    ("Who won the Nobel Prize in Physics in 1921?", None, "en"),
    ("What is the hottest planet in the solar system?", None, "en"),
    ("How do I get a copy of an old statement?", None, "en"),
    ("How do I freeze my account if I go abroad for a year?", None, "en"),
    ("How do I turn off the latest-transactions widget?", None, "en"),
    ("What is a share?", None, "en"),
    ("What does the score on my credit report mean?", None, "en"),
    ("How is interest on my loan calculated?", None, "en"),
    ("Can I send money to Hong Kong?", None, "en"),
    ("What is climate change?", None, "en"),
    ("How do I pay a bill with the app?", None, "en"),
    ("银行卡丢了怎么补办？", None, "zh"),
    ("转账到国外需要几天？", None, "zh"),
    ("怎么修改银行卡的交易限额？", None, "zh"),
    ("什么是汇率？", None, "zh"),
    ("信用卡的免息期有多长？", None, "zh"),
    ("周末可以办理业务吗？", None, "zh"),
    ("长城有多长？", None, "zh"),
    ("怎么开通境外支付？", None, "zh"),
    ("存款利率是怎么确定的？", None, "zh"),
    ("如何关闭短信提醒？", None, "zh"),
    ("理财产品有风险吗？", None, "zh"),
    ("手机银行登录不了怎么办？", None, "zh"),
]


def fill(template: str, zh: bool) -> str:
    a, b = pick(CURRENCIES)  # type: ignore[misc]
    return template.format(
        c=pick(CITIES_ZH if zh else CITIES),
        t=pick(TEAMS_ZH if zh else TEAMS),
        s=pick(STOCKS_ZH if zh else STOCKS),
        a=a,
        b=b,
        m=pick(CURRENCIES_ZH),
        e=pick(EVENTS_ZH if zh else EVENTS),
        p=pick(PRODUCTS_ZH if zh else PRODUCTS),
    )


def cases() -> list[dict]:
    out: list[dict] = []
    seen: set[str] = set()

    def add(text: str, kind: str | None, lang: str) -> None:
        if text not in seen:
            seen.add(text)
            out.append({"text": text, "kind": kind, "lang": lang, "split": "dev"})

    for positives, lang in ((POSITIVE_EN, "en"), (POSITIVE_ZH, "zh")):
        for kind, templates in positives.items():
            for template in templates:
                add(fill(template, lang == "zh"), kind, lang)
    for negatives, lang in ((NEGATIVE_EN, "en"), (NEGATIVE_ZH, "zh")):
        for template in negatives:
            for _ in range(2 if "{" in template else 1):
                add(fill(template, lang == "zh"), None, lang)
    # a second filling of the templates with a subject: the same shapes about other things
    for positives, lang in ((POSITIVE_EN, "en"), (POSITIVE_ZH, "zh")):
        for kind, templates in positives.items():
            for template in templates:
                if "{" in template:
                    add(fill(template, lang == "zh"), kind, lang)
    for text, kind, lang in HOLDOUT:
        add(text, kind, lang)
        out[-1]["split"] = "holdout"
    return out


def main() -> None:
    path = Path(__file__).with_name("time_sensitive_cases.jsonl")
    lines = [json.dumps(c, ensure_ascii=False) for c in cases()]
    path.write_text("\n".join(lines) + "\n", "utf-8")
    positives = sum(1 for line in lines if '"kind": null' not in line)
    print(f"wrote {len(lines)} cases ({positives} time-sensitive) to {path}")


if __name__ == "__main__":
    main()
