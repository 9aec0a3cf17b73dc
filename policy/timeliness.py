"""Time-sensitive questions: an answer that changes with the time it is asked must not be stored.

Neither published (mining excludes the row as ``time_sensitive``) nor written to the origin's
online cache. ``time_sensitive`` returns the first kind found, in the order of ``KINDS``:
- ``countdown``: time left until something ("how long until", "how many days till", "when is
  the next bank holiday", 还有几天, 倒计时, 下一个...什么时候);
- ``weather``: the weather, forecast, temperature or air quality somewhere ("will it rain",
  "what is the temperature in Paris"; 天气, 气温, 下雨); not climate or science ("the
  temperature of the sun", "how do hurricanes form");
- ``price``: market prices (shares, indices, currencies, crypto, commodities, fuel, housing; an
  amount converted between currencies; 股价, 汇率, 金价, 一美元等于多少人民币); not a bank's fees
  or "what exchange rate do you use";
- ``score``: scores, results, standings, "who won" without a year ("who won in 2018" is history;
  比分, 谁赢了, 积分榜);
- ``latest``: the latest or most recent of something, news, headlines, trending, "released yet"
  (最新, 新闻, 热搜, 最近 but not 最近的 "the nearest"); not a cut-off ("the latest time I can
  transfer", "the latest I can cancel");
- ``now``: the present moment ("right now", "currently", "the current rate", "what time is it",
  "who is the prime minister"; 现在, 目前, 当前, 现任); not a "current account";
- ``relative_date``: a date relative to today (today, tonight, tomorrow, yesterday, this/next/
  last week, "two days ago"; 今天, 明天, 昨天, 本周, 下个月, 今年).

Every pattern reads the folded text: ``pii.fold`` (NFKC, digits of any script as ASCII, no
invisibles) and case-folded. Each is linear in the text's length: alternations of literals and
gaps of bounded length, no nested quantifiers.

Measured on ``tests/policy/time_sensitive_cases.jsonl`` (491 English and Chinese questions,
248 time-sensitive, written by ``tests/policy/make_time_sensitive_cases.py``): recall 0.988,
precision 0.992; on its 73 held-out questions (written after the detector, never tuned on):
recall 0.921, precision 0.946.
"""

from __future__ import annotations

import re

from policy.pii import fold

KINDS = ("countdown", "weather", "price", "score", "latest", "now", "relative_date")

_UNITS = r"(?:seconds?|minutes?|hours?|days?|nights?|weeks?|months?|years?|sleeps?)"
_WEEKDAY = r"(?:mon|tues|wednes|thurs|fri|satur|sun)day"
_PERIOD = rf"(?:morning|afternoon|evening|night|week|weekend|month|year|season|quarter|{_WEEKDAY})"
_CURRENCY = (
    r"(?:usd|eur|gbp|jpy|cny|rmb|chf|cad|aud|inr|hkd|dollars?|euros?|pounds?(?: sterling)?"
    r"|yen|yuan|renminbi|rupees?|francs?|pesos?|btc|bitcoins?)"
)
_ASSET = (
    r"(?:bitcoin|btc|ethereum|ether|eth|dogecoin|solana|crypto(?:currency)?|gold|silver|platinum"
    r"|copper|oil|crude|brent|petrol|gas|gasoline|diesel|fuel|house|housing|property|egg)"
)
# "until Christmas", not "until my card arrives" (how long a process takes: not a countdown)
_UNTIL = (
    r"(?:(?:until|till|til|'til)\b(?! (?:an?|i|you|we|it|my|your|our|the money|funds)\b)|to go\b)"
)
_ZH_CURRENCY = r"(?:美元|美金|欧元|英镑|日元|港币|港元|人民币|韩元|卢布|比特币|以太坊|黄金|白银)"
_ZH_CLAUSE = r"[^，。？！?!,;；]"  # a character of the same clause
_YEAR = re.compile(r"(?<![0-9])(?:1[5-9]|20)[0-9]{2}(?![0-9])")


def _compiled(patterns: tuple[tuple[str, str], ...]) -> tuple[tuple[str, re.Pattern[str]], ...]:
    return tuple((kind, re.compile(pattern)) for kind, pattern in patterns)


_EN = _compiled(
    (
        (
            "countdown",
            rf"\bhow (?:long|much time) (?:is )?(?:left )?{_UNTIL}"
            rf"|\bhow many (?:more )?{_UNITS} (?:are |is )?(?:left )?{_UNTIL}"
            rf"|\b{_UNITS} (?:left|remaining|to go) (?:until|till|before)\b"
            r"|\bcount ?down (?:to|until|till)\b"
            r"|\bwhen (?:is|does|will|'s) the next\b|\bwhen'?s the next\b",
        ),
        (
            "weather",
            r"\b(?:what|how)(?:'s| is| will)?(?: the)? weather\b"
            r"|\bweather (?:forecast|report|update|today|tomorrow|tonight|now|this|next|like|in|for"
            r"|at|outside|looking)\b"
            r"|\b(?:weather|rain|snow|temperature|wind|storm|pollen) forecast\b"
            r"|\b(?:will it|is it going to|is it gonna|going to) (?:rain|snow|hail|storm|thunder"
            r"|be (?:sunny|cloudy|windy|rainy|hot|cold|warm|foggy|stormy|freezing|nice))"
            r"|\bis it (?:raining|snowing|hailing|sunny|cloudy|windy|foggy|stormy)\b"
            r"|\b(?:what(?:'s| is)|how(?:'s| is)) the (?:current )?(?:temperature|humidity"
            r"|uv index|air quality|aqi|pollen count|wind speed|heat index|wind chill)"
            r"(?: (?:like )?(?:in|outside|today|tonight|tomorrow|now|right now|this|here)\b"
            r"(?! (?:celsius|fahrenheit|kelvin))|\s*\?|$)"
            r"|\bhow (?:hot|cold|warm|humid|windy) is it (?:in|outside|today|tonight|now|right)\b"
            r"|\b(?:need|bring|take) an umbrella\b",
        ),
        (
            "price",
            r"\b(?:stock|share|ticker|market) prices?\b"
            r"|\bprices? of (?:an? |one |the )?"
            r"(?:(?:barrel|ounce|gallon|litre|liter|gram|kilo|tonne)s? of )?"
            rf"(?:{_ASSET}|shares?|stocks?|[\w.&-]+ (?:stock|shares))\b"
            rf"|\b{_ASSET}s? (?:prices?|rates?)\b"
            r"|\bhow much (?:is|are|does|'s) (?:an? |one |the )?"
            rf"(?:{_ASSET}|{_CURRENCY}|share|shares|ounce|barrel|gallon|litre|liter)\b"
            r"|\bhow much is [\w.&-]+ (?:stock|shares?) (?:worth|trading)"
            r"|\btrading at\b|\bmarket cap(?:itali[sz]ation)?\b|\b(?:worth|trading) (?:today|now)\b"
            rf"|(?:\d[\d,.]* ?|\b(?:a|one) ){_CURRENCY} (?:to|in|into) {_CURRENCY}\b"
            rf"|\b(?:what(?:'s| is| are)|how much is) the (?:{_CURRENCY} )?exchange rates?\b"
            rf"|\bexchange rates? (?:from|between|for) {_CURRENCY}\b"
            r"|\b(?:dow jones|nasdaq|s&p ?500|ftse(?: 100)?|nikkei|dax|hang seng"
            r"|shanghai composite)\b"
            r"|\bhow(?:'s| is) the (?:stock )?market\b"
            r"|\bstock market (?:today|now|up|down|doing|performing|open|closed|crash)",
        ),
        (
            "score",
            r"\b(?:what(?:'s| is| was) the|final|live|half[- ]?time|current) scores?\b"
            r"|\bscores? (?:of|in|for) (?:the|last|yesterday|tonight|today)\b"
            r"|\bwho(?:'s| is| are) (?:winning|leading|ahead|top of)\b"
            r"|\bwho (?:won|leads|will win)\b"
            r"|\b(?:match|game|race|election|fight|playoff|final)s? results?\b"
            r"|\bresults? of the (?:match|game|race|election|fight|final)\b"
            r"|\b(?:league table|standings|leaderboard|medal (?:table|count|tally))\b",
        ),
        (
            "latest",
            r"\b(?:latest|newest|most recent)\b(?! (?:time|possible|date|hour|cut-?off|i|you|we"
            r"|one|by which|that i|that you)\b)"
            r"|\b(?:breaking|recent|today's|latest) news\b|\bnews (?:today|about|on|from|headlines"
            r"|updates?)\b|\bheadlines\b|\bin the news\b|\bany news\b"
            r"|\b(?:live|latest) (?:updates?|coverage|results|stream|feed)\b"
            r"|\btrending\b|\bjust (?:announced|released|happened|launched)\b"
            r"|\bwhat(?:'s| is) (?:happening|going on) (?:in|with|at|today|now|right now)\b"
            r"|\brecent(?:ly)? (?:news|events|developments|changes|announcements|updates)\b"
            r"|\b(?:released|announced|launched|come out|came out|out|available) yet\b",
        ),
        (
            "now",
            r"\b(?:right now|just now|currently|at the moment|at present|presently|as we speak"
            r"|as of (?:now|today)|these days|nowadays)\b"
            r"|(?<!electric )(?<!electrical )(?<!alternating )(?<!direct )"
            r"\bcurrent\b(?! accounts?\b)"
            r"|\bwhat time is it\b|\bwhat(?:'s| is) the (?:time|date)\b"
            r"|\bwhat day is (?:it|today)\b"
            r"|\bwhat(?:'s| is) today\b|\bopen now\b|\bstill open\b"
            r"|\b(?:is|are|what(?:'s| is)|who(?:'s| is)|how much|how many|where(?:'s| is))\b"
            r"[^,.;:!?]{0,40}?\bnow\b"
            r"|\bwho(?:'s| is) the (?:current )?(?:president|prime minister|pm|ceo|chancellor|"
            r"chairman|chair|king|queen|pope|mayor|governor|leader|head coach|manager|champion"
            r"|world champion|richest (?:man|person|woman))\b",
        ),
        (
            "relative_date",
            r"\b(?:today|tonight|tomorrow|yesterday)(?:'s)?\b"
            rf"|\bthis (?:coming )?{_PERIOD}\b"
            rf"|\b(?:next|last|past|coming) (?:few )?(?:{_PERIOD}|\d+ {_UNITS}|few {_UNITS})\b"
            rf"|\b(?:\d+|a|an|one|two|three|four|five|six|seven|a few|few) {_UNITS} ago\b",
        ),
    )
)

_ZH = _compiled(
    (
        (
            "countdown",
            r"还有(?:几|多少|多久|多长时间)|还剩(?:几|多少|多久)|倒计时"
            rf"|(?:距离|离){_ZH_CLAUSE}{{0,12}}?还(?:有|剩)"
            rf"|下(?:一|一个|一次|个|次){_ZH_CLAUSE}{{0,12}}?(?:什么时候|哪天|几号|何时)",
        ),
        (
            "weather",
            r"天气|气温|下雨|下雪|降雨|降温|雾霾|空气质量|空气指数|紫外线|带伞|几度"
            rf"|台风{_ZH_CLAUSE}{{0,6}}?(?:到|来|登陆|路径)",
        ),
        (
            "price",
            r"股价|股票价格|汇率|金价|油价|房价|币价|行情|大盘|涨了|跌了|涨跌|涨停|跌停|市值"
            rf"|{_ZH_CURRENCY}{_ZH_CLAUSE}{{0,8}}?(?:多少钱|价格|价钱|兑|换多少|等于|多少人民币)"
            rf"|(?:股票|基金|黄金|原油){_ZH_CLAUSE}{{0,6}}?(?:多少钱|价格|涨|跌)",
        ),
        (
            "score",
            r"比分|谁赢|赢了吗|输了吗|赢了没|比赛结果|赛果|积分榜|排名榜|战况|战报|领先",
        ),
        (
            "latest",
            r"最新|新闻|头条|热搜|刚刚|刚才|近期|最近(?!的|一家|一个|一间|一处|哪|在哪)",
        ),
        (
            "now",
            r"现在|目前|当前|此刻|眼下|实时|现任|几点了|几点钟了",
        ),
        (
            "relative_date",
            r"今天|今日|今晚|今早|今夜|明天|明日|明早|明晚|昨天|昨日|昨晚|前天|后天"
            r"|本周|这周|这个星期|这星期|这礼拜|下周|下个星期|下星期|上周|上个星期|上星期"
            r"|本月|这个月|下个月|上个月|今年|明年|去年|前年|后年|周末(?=有|会|天气|去)"
            r"|(?:这|本|这个)周末|[0-9一二三四五六七八九十几两]+(?:天|周|个月|年|小时)(?:前|以前|之前)",
        ),
    )
)

# how something works, or what it usually is, not its value now: "how are bitcoin prices
# determined", "what affects the price of gold", "the average temperature in July", 下雨是怎么形成的
_EXPLAINED = re.compile(
    r"^(?:why|how (?:does|do|is|are|can|could) [^?]{0,60}?\b(?:work|determined|decided|calculated"
    r"|formed|form|made|set|measured|vary|change|affect|cause)\b)"
    r"|\bwhat (?:affects|causes|determines|influences|drives|moves|sets)\b"
    r"|\bwhat(?:'s| is) the difference\b|\b(?:average|typical|usually|normally)\b"
    r"|为什么|是怎么|怎么形成|如何形成|做出来|什么因素|受什么|影响|区别|原理|平均|通常|一般"
)
_EXPLAINABLE = ("weather", "price", "score", "latest")
_HAN = re.compile(r"[\u3400-\u9fff]")
# "who won" about a named year, or the first of something, is history
_HISTORY = re.compile(r"\b(?:first|inaugural|ever|in history)\b|第一")


def time_sensitive(question: str) -> str | None:
    """The kind of time-sensitivity of ``question`` (one of ``KINDS``), or None."""
    text = fold(question).casefold()
    found: set[str] = set()
    for kind, pattern in _EN:
        if pattern.search(text):
            found.add(kind)
    if _HAN.search(text):
        for kind, pattern in _ZH:
            if pattern.search(text):
                found.add(kind)
    if "score" in found and (_YEAR.search(text) or _HISTORY.search(text)):
        found.discard("score")  # "who won the world cup in 2018"
    if found.intersection(_EXPLAINABLE) and _EXPLAINED.search(text):
        found.difference_update(_EXPLAINABLE)
    return next((kind for kind in KINDS if kind in found), None)
