"""Writes pii_cases.jsonl: labelled questions for the PII filter's recall and precision.

Positives are synthetic personal data (fake names, numbers with valid checksums where the kind has
one: Luhn, IBAN mod 97, the Chinese ID's check character, SSN ranges) in the formats people type,
inside questions a user might ask; checksums are computed here, independently of
``policy/pii.py``. Negatives are ordinary chatbot questions written by hand, most of them with
numbers: amounts, years, dates, times, versions, IP addresses, math, measurements, scores, model
numbers, postcodes, codes that look like phone numbers but are not. Each line:
``{"text": ..., "kind": "card" | ... | null}``. Run: python tests/policy/make_pii_cases.py
"""

from __future__ import annotations

import base64
import json
import random
import string
from pathlib import Path

RNG = random.Random(20261201)

FIRST = ["alex", "maria", "wei", "fatima", "john", "priya", "lukas", "sofia", "kenji", "amara"]
LAST = ["smith", "garcia", "zhang", "khan", "doe", "patel", "muller", "rossi", "tanaka", "okafor"]
DOMAINS = ["gmail.com", "example.co.uk", "outlook.com", "yahoo.fr", "mail.example.org", "qq.com"]

FULL_WIDTH = {str(d): chr(0xFF10 + d) for d in range(10)}
ARABIC_INDIC = {str(d): chr(0x0660 + d) for d in range(10)}
DEVANAGARI = {str(d): chr(0x0966 + d) for d in range(10)}


def digits(n: int) -> str:
    return "".join(RNG.choice(string.digits) for _ in range(n))


def luhn_complete(prefix: str, length: int) -> str:
    body = prefix + digits(length - len(prefix) - 1)
    return next(body + c for c in string.digits if luhn_valid(body + c))


def luhn_fails(sizes: list[int]) -> str:
    """Digits in these groups that no card reading accepts: no run of whole groups passes Luhn."""
    while True:
        number = digits(sum(sizes))
        bounds = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
        runs = [number[a:b] for a in bounds for b in bounds if 13 <= b - a <= 19]
        if not any(luhn_valid(run) for run in runs):
            return grouped(number, sizes, " ")


def luhn_valid(number: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(number)):
        d = int(ch) * (2 if i % 2 else 1)
        total += d - 9 if d > 9 else d
    return total % 10 == 0


def grouped(number: str, sizes: list[int], sep: str) -> str:
    parts, at = [], 0
    for size in sizes:
        parts.append(number[at : at + size])
        at += size
    if at < len(number):
        parts.append(number[at:])
    return sep.join(p for p in parts if p)


def translate(text: str, table: dict[str, str]) -> str:
    return "".join(table.get(c, c) for c in text)


def iban(country: str, bban: str) -> str:
    def numeric(s: str) -> int:
        return int("".join(str(int(c, 36)) for c in s))

    check = 98 - numeric(bban + country + "00") % 97
    return f"{country}{check:02d}{bban}"


def cn_id(region: str) -> str:
    born = f"{RNG.randint(1950, 2005)}{RNG.randint(1, 12):02d}{RNG.randint(1, 28):02d}"
    body = region + born + digits(3)
    weights = (7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2)
    total = sum(int(c) * w for c, w in zip(body, weights, strict=True))
    return body + "10X98765432"[total % 11]


def ssn() -> str:
    area = RNG.choice([RNG.randint(1, 665), RNG.randint(667, 899)])
    return f"{area:03d}{RNG.randint(1, 99):02d}{RNG.randint(1, 9999):04d}"


def cpf() -> str:
    body = [RNG.randint(0, 9) for _ in range(9)]
    for n in (10, 11):
        total = sum(d * w for d, w in zip(body, range(n, 1, -1), strict=False))
        body.append(0 if total % 11 < 2 else 11 - total % 11)
    s = "".join(map(str, body))
    return f"{s[:3]}.{s[3:6]}.{s[6:9]}-{s[9:]}"


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def jwt() -> str:
    header = {"alg": RNG.choice(["HS256", "RS256"]), "typ": "JWT"}
    payload = {
        "sub": digits(8),
        "name": f"{RNG.choice(FIRST)} {RNG.choice(LAST)}",
        "iat": 1700000000,
    }
    signature = bytes(RNG.randrange(256) for _ in range(32))
    return ".".join(
        [
            b64url(json.dumps(header).encode()),
            b64url(json.dumps(payload).encode()),
            b64url(signature),
        ]
    )


def email() -> str:
    first, last = RNG.choice(FIRST), RNG.choice(LAST)
    local = RNG.choice(
        [f"{first}.{last}", f"{first}{last[0]}", f"{first}+bank", f"{last}{digits(2)}"]
    )
    return f"{local}@{RNG.choice(DOMAINS)}"


def card_numbers() -> list[str]:
    """Cards in the ways people type them."""
    out = []
    seps = [" ", "-", ".", "/", "", " ", "-"]
    for i in range(40):
        brand = i % 5
        if brand == 0:
            number, sizes = luhn_complete("4", 16), [4, 4, 4, 4]
        elif brand == 1:
            number, sizes = luhn_complete(RNG.choice(["51", "53", "55", "2221"]), 16), [4, 4, 4, 4]
        elif brand == 2:
            number, sizes = luhn_complete(RNG.choice(["34", "37"]), 15), [4, 6, 5]
        elif brand == 3:
            number, sizes = luhn_complete("6011", 16), [4, 4, 4, 4]
        else:
            number, sizes = luhn_complete("62", 19), [4, 4, 4, 4, 3]
        sep = seps[i % len(seps)]
        out.append(grouped(number, sizes, sep))
    # full-width, other scripts, no-break and thin spaces, zero-width spaces, en dashes
    visa = [luhn_complete("4", 16) for _ in range(8)]
    out.append(translate(grouped(visa[0], [4, 4, 4, 4], " "), FULL_WIDTH))
    out.append(translate(grouped(visa[1], [4, 4, 4, 4], "\u3000"), FULL_WIDTH))
    out.append(translate(visa[2], FULL_WIDTH))
    out.append(translate(grouped(visa[3], [4, 4, 4, 4], " "), ARABIC_INDIC))
    out.append(grouped(visa[4], [4, 4, 4, 4], "\u00a0"))
    out.append(grouped(visa[5], [4, 4, 4, 4], "\u2009"))
    out.append(grouped(visa[6], [4, 4, 4, 4], "\u200b"))
    out.append(grouped(visa[7], [4, 4, 4, 4], "\u2013"))
    return out


CARD_QUESTIONS = [
    "Why was my card {} declined at the supermarket?",
    "Can you check if {} has been blocked?",
    "I typed {} at checkout and it failed, why?",
    "Please refund the payment to card {}",
    "my card number is {} is it still active",
    "{} was charged twice, what do I do?",
    "Is {} a valid card number?",
    "Add {} exp 09/27 cvv 123 to my account",
]


def positives() -> list[tuple[str, str]]:
    cases: list[tuple[str, str]] = []

    def add(kind: str, templates: list[str], values: list[str]) -> None:
        for i, value in enumerate(values):
            cases.append((templates[i % len(templates)].format(value), kind))

    add("card", CARD_QUESTIONS, card_numbers())
    # a card followed by its expiry or CVV, glued on with the same separator
    for _ in range(4):
        number = grouped(luhn_complete("4", 16), [4, 4, 4, 4], " ")
        cases.append((f"charge {number} 0927 please", "card"))

    add("email", EMAIL_QUESTIONS, [email() for _ in range(22)])
    add(
        "email",
        ["my address is {}", "Send the statement to {}", "{} cannot log in", "email me at {}"],
        [
            "john＠example．com",
            "ｍａｒｉａ．ｇａｒｃｉａ＠ｇｍａｉｌ．ｃｏｍ",
            "wei.zhang＠qq．com",
            "jane@example。com",
            "José.Müller@correo.es",
            "ALEX.SMITH@OUTLOOK.COM",
            "a.b-c_d+e@sub.mail.example.co.uk",
            "priya\u200b.patel@gmail.com",
        ],
    )

    national = []
    for i in range(14):
        number = ssn()
        sep = [" ", "-", ".", ""][i % 4]
        national.append(grouped(number, [3, 2, 4], sep))
    add(
        "national_id",
        ["my SSN is {}", "Is {} a valid social security number?", "ssn {} for the form"],
        national,
    )
    ninos = ["AB 12 34 56 C", "JH123456C", "JG 10 37 88 B", "ce-47-82-19-a", "WP 93 12 07 D"]
    add("national_id", ["my NI number is {}", "National insurance {} please update"], ninos)
    ibans = [
        iban("DE", digits(18)),
        iban("GB", "WEST" + digits(14)),
        iban("GB", "NWBK" + digits(14)),
        iban("FR", digits(10) + digits(11) + digits(2)),
        iban("ES", digits(20)),
        iban("IT", "X" + digits(10) + digits(12)),
        iban("NL", "ABNA" + digits(10)),
        iban("BE", digits(12)),
        iban("CH", digits(17)),
        iban("PL", digits(24)),
        iban("IE", "AIBK" + digits(14)),
        iban("AT", digits(16)),
    ]
    iban_forms = []
    for i, value in enumerate(ibans):
        form = i % 4
        if form == 0:
            iban_forms.append(grouped(value, [4] * 8, " "))
        elif form == 1:
            iban_forms.append(grouped(value, [4] * 8, "-"))
        elif form == 2:
            iban_forms.append(value)
        else:
            iban_forms.append(grouped(value, [4] * 8, " ").lower())
    add(
        "national_id",
        [
            "Send it to IBAN {} please",
            "is {} the right IBAN for my rent?",
            "My IBAN {} and the sort code, is that enough?",
            "transfer from {} failed",
        ],
        iban_forms,
    )
    regions = ["110101", "310104", "440305", "510107", "330106", "420102", "610113", "210102"]
    cn_forms = []
    for i in range(12):
        value = cn_id(regions[i % len(regions)])
        form = i % 6
        if form == 0:
            cn_forms.append(value)
        elif form == 1:
            cn_forms.append(grouped(value, [6, 8, 4], " "))
        elif form == 2:
            cn_forms.append(grouped(value, [4, 4, 4, 4, 2], " "))
        elif form == 3:
            cn_forms.append(grouped(value, [3] * 6, " "))
        elif form == 4:
            cn_forms.append(grouped(value, [6, 8, 4], "-"))
        else:
            cn_forms.append(translate(grouped(value, [6, 8, 4], " "), FULL_WIDTH))
    add(
        "national_id",
        ["我的身份证号是{}", "身份证 {} 怎么查", "My Chinese ID is {}, can I open an account?"],
        cn_forms,
    )
    accounts = [
        luhn_fails([4, 4, 4, 4, 2]),
        luhn_fails([4, 4, 4, 4, 2]),
        luhn_fails([4, 4, 4, 4]),
        grouped("1" + digits(9), [3, 3, 4], " "),  # not a North American phone: area 1xx
        grouped("1" + digits(9), [4, 3, 3], " "),
        grouped(digits(11), [4, 4, 3], " "),
        grouped(digits(12), [4, 4, 4], " "),
        grouped(digits(12), [3, 3, 3, 3], " "),
        grouped(digits(10), [3, 4, 3], "-"),
        grouped(digits(12), [4, 4, 4], "-"),
        grouped(digits(10), [2, 4, 4], " "),
        grouped(digits(12), [4, 4, 4], " "),  # Aadhaar-shaped
        grouped(digits(10), [6, 4], "/"),  # Czech birth number
        grouped("1990" + digits(8), [8, 4], "-"),  # Swedish personnummer
        grouped(digits(12), [4, 4, 4], "."),
        digits(11),
        digits(9),
        digits(14),
        translate(grouped(digits(12), [4, 4, 4], " "), FULL_WIDTH),
        translate(digits(10), DEVANAGARI),
        cpf(),
        cpf(),
    ]
    add(
        "national_id",
        [
            "my account number is {}",
            "Why is account {} frozen?",
            "transfer 200 to {} please",
            "passport {} expired, what now?",
            "Aadhaar {} linked to which bank?",
            "is {} my customer reference",
        ],
        accounts,
    )
    labelled = [digits(8), digits(8), digits(7), digits(6)]
    add(
        "national_id",
        [
            "My account number is {} and sort code 20-00-00",
            "acct no. {} balance?",
            "Policy number {} renewal date?",
            "passport no {} lost",
        ],
        labelled,
    )
    add("phone", PHONE_QUESTIONS, phone_numbers())
    add("url_secret", ["see {}", "why does {} not work", "I clicked {} is it safe?"], URL_SECRETS)
    add(
        "jwt",
        [
            "Why is my token {} rejected?",
            "decode this jwt {}",
            "Authorization: Bearer {}",
            "what does {} contain",
        ],
        [jwt() for _ in range(10)],
    )
    key_ids = ["AKIA" + "".join(RNG.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567") for _ in range(16))]
    key_ids += [
        RNG.choice(["AKIA", "ASIA"])
        + "".join(RNG.choice(string.ascii_uppercase + string.digits) for _ in range(16))
        for _ in range(5)
    ]
    add("cloud_key", ["my access key {} stopped working", "is {} leaked?"], key_ids)
    alphabet = string.ascii_letters + string.digits + "/+"
    secrets = ["".join(RNG.choice(alphabet) for _ in range(40)) for _ in range(6)]
    add(
        "cloud_key",
        [
            "aws_secret_access_key = {}",
            "AWS_SECRET_ACCESS_KEY={} why denied",
            "my secret access key is {}",
            '"SecretAccessKey": "{}" is this format right',
            "aws secret key: {}",
            "export AWS_SECRET_KEY='{}'",
        ],
        secrets,
    )
    add("phone", ZH_PHONE_QUESTIONS, zh_phone_numbers())
    ids = [cn_id(regions[i % len(regions)]) for i in range(6)]
    add(
        "national_id",
        ZH_ID_QUESTIONS,
        [
            grouped(ids[0], [6, 4, 4, 4], " "),
            grouped(ids[1], [6, 8, 4], "-"),
            grouped(ids[2], [3, 3, 4, 4, 4], " "),
            ids[3],
            translate(grouped(ids[4], [6, 4, 4, 4], "\u3000"), FULL_WIDTH),
            grouped(ids[5], [4, 4, 4, 4, 2], " "),
        ],
    )
    return cases


ZH_PHONE_QUESTIONS = [
    "我的手机号是{}",
    "请打{}联系我",
    "{}是谁的电话？一直打给我",
    "帮我把预留手机号改成{}",
    "座机{}打不通怎么办",
    "客服回电请打{}，谢谢",
]
ZH_ID_QUESTIONS = [
    "身份证号码：{}",
    "{}这个身份证号能开户吗",
    "帮我查一下身份证{}绑定了几张卡",
]


def zh_phone_numbers() -> list[str]:
    """Mainland mobiles (1[3-9]x xxxx xxxx) and landlines (area code 10, 2x or 3-digit)."""

    def mobile() -> str:
        return RNG.choice(["13", "15", "17", "18", "19"]) + digits(9)

    def local() -> str:
        return str(RNG.randint(2, 8)) + digits(7)

    m = [mobile() for _ in range(8)]
    return [
        m[0],
        grouped(m[1], [3, 4, 4], " "),
        grouped(m[2], [3, 4, 4], "-"),
        "+86 " + grouped(m[3], [3, 4, 4], " "),
        "+86-" + grouped(m[4], [3, 4, 4], "-"),
        "0086 " + m[5],
        "86 " + grouped(m[6], [3, 4, 4], " "),
        translate(grouped(m[7], [3, 4, 4], " "), FULL_WIDTH),
        "010-" + local(),
        "(0755) " + grouped(local(), [4, 4], " "),
        "+86 10 " + grouped(local(), [4, 4], " "),
        "0755-" + grouped(local(), [4, 4], "-"),
        "021 " + grouped(local(), [4, 4], " "),
        "（010）" + local(),
        "010－" + local() + "转123",
        "+86 (21) " + grouped(local(), [4, 4], " "),
        "86-755-" + local(),
        "0571 " + grouped(local(), [4, 4], " "),
    ]


EMAIL_QUESTIONS = [
    "My email is {}, why can't I log in?",
    "Please send the form to {}",
    "can you email {} the statement",
    "I changed my address to {} but no code arrives",
    "is {} registered?",
    "Contact me at <{}>",
    "mailto:{} does not open",
    "reset link for {} expired",
]

PHONE_QUESTIONS = [
    "Please call me back on {}",
    "my number is {}",
    "Text {} when my card is ready",
    "Why did {} call me about my account?",
    "update my phone to {}",
    "call {} after 5pm",
]


def phone_numbers() -> list[str]:
    def nanp() -> tuple[str, str, str]:
        return (
            str(RNG.randint(2, 9)) + digits(2),
            str(RNG.randint(2, 9)) + digits(2),
            digits(4),
        )

    out = []
    for form in range(10):
        a, b, c = nanp()
        out.append(
            [
                f"({a}) {b}-{c}",
                f"{a}-{b}-{c}",
                f"{a}.{b}.{c}",
                f"{a} {b} {c}",
                f"1-{a}-{b}-{c}",
                f"+1 ({a}) {b}-{c}",
                f"+1 {a} {b} {c}",
                f"({a}){b}-{c}",
                f"+1-{a}-{b}-{c}",
                f"{a} {b}-{c}",
            ][form]
        )
    out += [
        f"+44 7700 900{digits(3)}",
        f"07700 900{digits(3)}",
        f"020 7946 0{digits(3)}",
        f"0161 496 0{digits(3)}",
        f"+44 (0)20 7946 0{digits(3)}",
        f"+33 6 {digits(2)} {digits(2)} {digits(2)} {digits(2)}",
        f"06 {digits(2)} {digits(2)} {digits(2)} {digits(2)}",
        f"+49 30 {digits(8)}",
        f"030 {digits(8)}",
        f"+86 138 {digits(4)} {digits(4)}",
        f"139 {digits(4)} {digits(4)}",
        f"010-{digits(8)}",
        f"0755-{digits(8)}",
        f"021 {digits(4)} {digits(4)}",
        f"+91 98{digits(3)} {digits(5)}",
        f"+61 412 {digits(3)} {digits(3)}",
        f"0412 {digits(3)} {digits(3)}",
        f"03-{digits(4)}-{digits(4)}",
        f"090-{digits(4)}-{digits(4)}",
        f"+81 90-{digits(4)}-{digits(4)}",
        f"+{digits(2)}{digits(9)}",
        translate(f"020 7946 0{digits(3)}", FULL_WIDTH),
        translate(f"+91 98{digits(3)} {digits(5)}", DEVANAGARI),
        f"(0{digits(2)}) {digits(4)} {digits(4)}",
    ]
    return out


URL_SECRETS = [
    "https://bank.example.com/reset?token=a8f3k2j9d0",
    "https://bob:hunter2@example.com/files",
    "https://app.example.com/cb#access_token=xyz987",
    "https://api.example.com/v1/items?api_key=sk9384hf",
    "https://example.com/login?session=8c1e0b7",
    "https://files.example.net/doc.pdf?X-Amz-Signature=ab12cd34",
    "https://example.com/verify?code=483920",
    "https://admin:Passw0rd@192.168.1.10/setup",
    "https://example.com/invite?otp=119283",
    "https://portal.example.org/?password=letmein",
]

# written by hand: what people ask a support or general chatbot, most with numbers in them
NEGATIVES = [
    # banking, with amounts and short numbers
    "I withdrew 10 pounds instead of 30",
    "What is the daily ATM withdrawal limit, 500 or 1000?",
    "Why did my transfer of $1,250.50 take 3 days in 2024?",
    "Why was I charged £2.50 for a transfer of £1,200?",
    "Can I send 25000 euros abroad in one payment?",
    "Is the 5.25% savings rate fixed for 12 months?",
    "How long does a £10,000 CHAPS payment take?",
    "What would the monthly payment be on 250000 over 25 years at 4.5%?",
    "My card ending 4821 was declined",
    "card ending in 1234 expired 03/25, where is the new one?",
    "Why is there a pending charge of 0.01?",
    "Is there a 4 digit PIN or 6 digit PIN?",
    "Can I pay in 3 instalments of £33.33?",
    "What is the overdraft fee, £5 a day or 39.9% EAR?",
    "How much is 1,000,000 yen in pounds?",
    "Do you charge 2.99% on foreign transactions?",
    "I have 3 accounts, can I merge 2 of them?",
    "Is my money protected up to £85,000?",
    "Why was £1 taken and then refunded?",
    "The app says error 403 when I log in",
    "Can I withdraw 300 dollars at 2am?",
    "What is the minimum deposit, 1 or 100?",
    "How do I get a 0% balance transfer for 18 months?",
    "Are there fees for transfers over 50000?",
    "Interest on 12000 at 3.5% for 2 years?",
    "Is 1.250.000 euros enough to retire in Spain?",
    "what is 1 500 000 in words",
    "Why did I get charged 12,99 € twice?",
    "Is the ISA limit £20,000 for 2024/25?",
    "my salary is 45k, how much tax do I pay?",
    # dates and times
    "What day of the week was 15/03/2024?",
    "How many days are there between 2024-01-01 and 2024-12-31?",
    "Is the branch open on 24.12.2023 at 09:30?",
    "Convert 14:30 GMT to EST",
    "What happened on 9/11/2001?",
    "Is 29/02/2023 a valid date?",
    "Schedule a meeting for 2024-06-01T09:00:00Z",
    "Flights from 12-20-2024 to 01-05-2025, any deals?",
    "My statement from 01/02/2024 - 28/02/2024 is missing",
    "Why does my log say 2024-03-15 10:30:45,123 ERROR?",
    "Was the payment on 03-15-2024 10:30 processed?",
    "How many weeks from 2023-09-04 to 2024-07-19?",
    "Is 31.12.1999 23:59:59 the last second of the millennium?",
    "Count down to 2025-01-01 00:00",
    "Parse the date 2024/03/15 14:05 in JavaScript",
    "What time is 18:45 in 12 hour format?",
    "What was the date 100 days after 2024-02-10?",
    "Between 1914-1918 and 1939-1945 how many years of war?",
    "Events from 2024-03-15 to 2024-03-20 in Paris",
    "date range 2024-03-15–2024-03-20 in SQL",
    # versions and software
    "Python 3.12.1 vs 3.11.7, which should I use?",
    "npm install react@18.2.0 fails with ERESOLVE",
    "Windows 10.0.19045.3803 update error 0x800f0922",
    "Chrome 120.0.6099.109 keeps crashing",
    "Is kernel 6.5.0-14-generic safe to upgrade?",
    "CUDA 12.1 with PyTorch 2.1.2 and driver 535.129.03",
    "Upgrade from Ubuntu 22.04.3 LTS to 24.04",
    "Java 17.0.9+9 vs 21.0.1",
    "What changed in Django 5.0.1?",
    "pip install numpy==1.26.4 is slow",
    "lodash@4.17.21 vulnerability",
    "iOS 17.2.1 battery drain",
    "Node 20.11.0 or 18.19.0 for production?",
    "Error: listen EADDRINUSE: address already in use :::3000",
    "What does exit code 137 mean in Docker?",
    "Postgres 16.1 vs MySQL 8.0.35",
    "Build 22631.2861 of Windows 11 broke my printer",
    "macOS 14.2.1 Sonoma wifi problems",
    "Chrome version 125.0.6422.112 download",
    "Kubernetes 1.29.0 release notes",
    "KB5034441 failed to install with 0x80070643",
    "error code 80244019 in Windows Update",
    "What does HTTP 502 Bad Gateway mean?",
    "Getting 0xC0000005 access violation in C++",
    # IP addresses
    "I can't reach my router at 192.168.1.1",
    "Why does 192.168.10.254 not answer pings?",
    "Is 8.8.8.8 or 1.1.1.1 the faster DNS?",
    "Connection refused on 127.0.0.1:8000",
    "What is the subnet mask 255.255.255.0 in CIDR?",
    "Difference between 10.0.0.0/8 and 172.16.0.0/12",
    "How do I set a static IP 192.168.0.100 on Ubuntu?",
    "ssh to 10.0.0.138 times out",
    "Is 172.16.254.1 a private address?",
    "nginx listens on 0.0.0.0:80 but not 443",
    "inet 192.168.1.23/24 brd 192.168.1.255 what does it mean",
    "ping 208.67.222.222 packet loss",
    # math
    "12 * 34 = 408?",
    "What is 123456 * 789?",
    "Solve 3x + 7 = 22",
    "What is the sum of 1 to 100?",
    "What is 2^10?",
    "Is 97 a prime number?",
    "What is 15% of 2,500?",
    "Convert 0.375 to a fraction",
    "sqrt(2) is 1.41421356237, how many digits are known?",
    "What is 999999999 + 1?",
    "What is 2^32 = 4294967296 in hex?",
    "Why does 0.1 + 0.2 = 0.30000000000000004 in JavaScript?",
    "Simplify 144/12 + 7",
    "What is pi to 10 digits, 3.1415926535?",
    "Factor x^2 - 5x + 6",
    "What is 7 factorial?",
    "Calculate 45 + 67 + 89 + 123",
    "Is 1/3 + 1/4 = 7/12?",
    "Next number in 2 4 8 16 32?",
    "Sort 45 12 89 33 7 in ascending order",
    "Median of 12 15 18 22 30?",
    "Mean of 100 200 300 400 500",
    "What comes next: 3 6 9 12 15?",
    "Round 2.675 to 2 decimal places",
    "What is 1e9 in scientific notation?",
    "Add 1,234,567 and 8,765,432",
    "How much is 10 to the power of 12?",
    "Largest 32 bit signed integer 2^31 - 1 = 2147483647?",
    "Area of a circle with radius 7.5 cm",
    "Convert binary 101101 to decimal",
    # measurements and quantities
    "How many calories in 250g of rice?",
    "Convert 5 ft 11 in to cm",
    "Is 120/80 blood pressure normal?",
    "How far is 26.2 miles in km?",
    "What is 98.6 F in Celsius?",
    "How much does 1.5 L of water weigh?",
    "My baby weighs 3.2 kg at 6 weeks, is that ok?",
    "Is 180 cm and 75 kg a healthy BMI?",
    "How many cups in 500 ml?",
    "Bake at 180 C for 25 minutes or 200 for 20?",
    "Is 0.5 mg of melatonin enough?",
    "How long to boil 6 eggs at 1000 m altitude?",
    "Screen of 1920 x 1080 at 144 Hz or 2560 x 1440 at 165 Hz?",
    "4K is 3840 x 2160, right?",
    "Tyre size 225/45 R17 91W meaning",
    "Is a 12V 7Ah battery enough for 100 W?",
    # sports
    "Lakers beat Celtics 112-108, who scored most?",
    "Federer won 6-4 6-3 7-6, which final was that?",
    "Man United 3-1 Chelsea in 2024?",
    "Who scored in the 1966 World Cup final 4-2?",
    "Is a .315 batting average good?",
    "Marathon in 3:45:20, what pace per km?",
    "Team A 2 - 1 Team B, what were the odds?",
    "How many points for 147 in snooker?",
    "Why is 2-2 a draw in the 90th minute?",
    "Top 10 scorers of the 2022-23 season",
    # products and model numbers
    "RTX 4090 vs RTX 4080 for 4K gaming",
    "iPhone 15 Pro Max 256GB or 512GB?",
    "Samsung QN65Q80C review",
    "Galaxy S24 Ultra vs Pixel 8 Pro",
    "Is the i9-13900K too hot?",
    "Ryzen 9 7950X3D with DDR5-6000 CL30",
    "Sony WH-1000XM5 noise cancelling",
    "Dell XPS 15 9530 battery life",
    "LG OLED65C3PUA vs Sony A80L",
    "Canon EOS R5 or R6 Mark II?",
    "Boeing 737-800 seat map",
    "Airbus A320neo range in km",
    "Tesla Model Y 2024 range",
    "PlayStation 5 model CFI-1216A noise",
    "MacBook Pro M3 14 inch 18GB",
    "USB 3.2 Gen 2x2 speed in Gbps",
    "HDMI 2.1 48 Gbps cable needed for 120 Hz?",
    "IEEE 802.11ax vs 802.11ac",
    "Is ISO 27001 certification worth it?",
    "RFC 5321 email length limits",
    # postcodes, phone-like codes that are not personal
    "What city has ZIP code 90210?",
    "Shipping to 10001 takes how long?",
    "Is SW1A 1AA Buckingham Palace?",
    "Is 94105-1234 a valid ZIP+4 code?",
    "What is area code 415?",
    "Country code for Germany, +49?",
    "Should I dial 911 or 112 in Europe?",
    "What is 1-800-273-8255?",
    "Is 0800 123 4567 free from mobiles?",
    "Is (800) 555-0199 a toll free number?",
    "Call 999 or 111 for a non emergency?",
    "What is extension 4521 for?",
    "Enter the code 483920 from the SMS?",
    "What is the ISBN 978-0-306-40615-7 book?",
    "Find ISBN 0-306-40615-2",
    "Who wrote ISBN 9780306406157?",
    "Flight BA 283 delayed?",
    "Gate B12 or terminal 5 for LH 901?",
    "Is bus 42 running on route 66?",
    "Room 1203 on floor 12, where is it?",
    # hex digests and identifiers that are not personal
    "git checkout 9fceb02d0ae598e95dc970b74767f19372d61af8 fails",
    "What is UUID 123e4567-e89b-12d3-a456-426614174000?",
    "MD5 of an empty string is d41d8cd98f00b204e9800998ecf8427e?",
    "docker pull image@sha256:4b1e2c6f0a9d8e7c5b3a1f2e4d6c8b0a9e7f5d3c1b2a4e6f8d0c2b4a6e8f0d2c",
    "Why does git show 3f2a9c0 as detached HEAD?",
    "sha1 2fd4e1c67a2d28fced849ee1bb76e7391b93eb12 of the quick brown fox",
    "Cannot find commit 7e3c1f20 in the repo",
    # years and lists
    "Revenue for 2019 2020 2021 2022, which grew most?",
    "Best movies of 1994",
    "Who won the World Cup in 1998, 2002 and 2006?",
    "From 1990 to 2024 how much did prices rise?",
    "In the 1980s what was the interest rate?",
    "Is 2024 a leap year?",
    "What was the population in 1900 vs 2000?",
    "Series 10 20 30 40 50 60 sum",
    "Numbers 1 2 3 4 5 6 7 8 9 10 in French",
    "List 01 02 03 04 05 as words",
    "Population of India is 1,428,627,663?",
    "Is the world population 8,000,000,000 yet?",
    "US debt of $34 trillion in numbers",
    "How do you write 250 000 000 in words?",
    # e-mail-like and URLs that are not personal
    "How do I @mention someone in Slack?",
    "What does @Override do in Java?",
    "npm install @types/node fails",
    "What is the @staticmethod decorator?",
    "What does A@B.T mean in numpy?",
    "git@github.com: Permission denied (publickey)",
    "How do I clone git@github.com:pytorch/pytorch.git?",
    "Is user@localhost a valid address?",
    "see https://example.com/help?page=2&lang=en",
    "https://docs.python.org/3.12/library/re.html is down?",
    "Why does https://www.youtube.com/watch?v=dQw4w9WgXcQ not play?",
    "https://github.com/pytorch/pytorch/issues/12345 any fix?",
    "Is https://192.168.1.1:8443/admin safe?",
    # tokens, keys, timestamps that are documentation or questions about them
    "How do I decode a JWT in Python?",
    "Does a JWT header always start with eyJhbGciOi?",
    "What is AKIAIOSFODNN7EXAMPLE in the AWS docs?",
    "Is wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY a real secret key?",
    "How do I rotate an AWS access key every 90 days?",
    "Convert unix timestamp 1700000000 to a date",
    "What date is epoch 1609459200?",
    "Why is my timestamp 1704067200000 in milliseconds?",
    # no numbers
    "How long does a bank transfer take?",
    "How do I freeze my card?",
    "What is the capital of Australia?",
    "Explain quantum entanglement simply",
    "Write a haiku about autumn",
    "Why is the sky blue?",
    "How do I reset my online banking password?",
    "What are your opening hours?",
    "Can I use Apple Pay abroad?",
    "Translate good morning into Japanese",
    # Chinese and other scripts, with numbers
    "2024年3月15日是星期几？",
    "iPhone 15多少钱？",
    "１２０元等于多少美元？",
    "明天 10:30 的航班 CA 1501 会延误吗？",
    "٢٠٢٤ هل هي سنة كبيسة؟",
    "Was kostet ein Ticket für 49 Euro im Monat?",
    "¿Cuánto son 1.500 dólares en pesos?",
    "Combien font 3 × 7 ?",
    # Chinese questions with amounts, dates, counts, service numbers and codes
    "我转了5000元，为什么只到账4990元？",
    "2024年3月15日的账单在哪里看",
    "信用卡额度20000够吗",
    "10086是什么号码",
    "95588是工行的客服电话吗",
    "12306怎么退票",
    "400-820-8820是哪家公司的客服",
    "4008208820是什么电话",
    "存款利率2.15%还是2.6%",
    "双11下单3件能退吗",
    "邮编100101是北京哪里",
    "身高175体重70算胖吗",
    "订单123456怎么还没发货",
    "转账100000元要多久到账",
    "2023年到2024年房价涨了多少",
    "1000万日元等于多少人民币",
    "房贷30年100万月供多少",
    "余额1234.56元为什么不能取",
    "5月20日到6月1日能办卡吗",
    "早上8:30到下午5:00营业吗",
    "转账2笔共3000元，手续费多少",
    "1380元的账单能分3期吗",
    "价格从138涨到158",
    "高铁G1234晚点了吗",
    "第3期账单什么时候出",
    "120和110哪个是急救电话",
    "验证码是6位还是4位",
    "ETC每月扣费15.5元正常吗",
    "2024-06-18 10:30的转账失败了",
    "一年期定存1.65%，存50000元利息多少",
    # big numbers that people ask about
    "What is 1000000007 used for in competitive programming?",
    "Is 2147483647 prime?",
    "How many seconds in 100 years, 3153600000?",
]


def main() -> None:
    cases = positives()
    lines = [{"text": text, "kind": kind} for text, kind in cases]
    lines += [{"text": text, "kind": None} for text in NEGATIVES]
    path = Path(__file__).with_name("pii_cases.jsonl")
    path.write_text(
        "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines), encoding="utf-8"
    )
    print(f"wrote {len(cases)} positives and {len(NEGATIVES)} negatives to {path}")


if __name__ == "__main__":
    main()
