"""Build the Chinese cache-quality evaluation set from MASSIVE zh-CN (Amazon), CC BY 4.0.

MASSIVE (FitzGerald et al., 2022) gives 16,521 Chinese (zh-CN) assistant utterances, each a human
localization of an English request, with one of 60 intent labels, split train / validation / test.
This script turns them into the two CSV files that ``benchmarks/cache_quality.py`` reads:

  massive_zh_cache.csv    the train split, less the held-out intents: the cached questions
  massive_zh_queries.csv  the test split; the held-out intents' utterances, and those of any
                          intent with no cached utterance, are labelled ``oos`` (they must miss)

Columns: ``text,label,massive_intent,massive_split,massive_id`` (``massive_intent`` is the
source's intent, also for ``oos`` rows). A text that MASSIVE files under more than one intent
in any split (53 short ones such as 你好 or 关灯) is dropped from both files; a text repeated
within one file (compared as the cache keys compare it, ``base.keys.normalize``) is kept
once, at its first row. Rows keep the source's order and nothing is sampled, so one input always
gives the same bytes. The inputs are the SetFit layout (``id,label,text,label_text,...``) as
committed to DuoWeiTree/ZeroshotClassification @88eafae9; only ``id``, ``text`` and
``label_text`` are read (``label_text_ch``, machine-translated label names under no licence, is
not). They are checked against their sha256 (``--no-verify`` skips that).

``--dataset xsid`` builds the earlier, smaller set from xSID 0.7 zh (CC BY-SA 4.0) instead.

Run (README.md says how to extract the sources from the fetched repositories):
  python benchmarks/data/zh/build.py --source /tmp/massive_zh --out benchmarks/out/zh
  python benchmarks/data/zh/build.py --dataset xsid --source /tmp/xsid-src --out benchmarks/out/zh
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import shutil
import sys
import textwrap
from collections import Counter, defaultdict
from pathlib import Path

from base.keys import InvalidQueryError, normalize

OOS = "oos"

MASSIVE_REPO = "DuoWeiTree/ZeroshotClassification"
MASSIVE_COMMIT = "88eafae914968ce40e3baa106096b949c41c95d9"
MASSIVE_FILE = "amazon_massive_intent_zh-CN_{split}.csv"  # under testdata/ in that repository
MASSIVE_SHA256 = {
    "train": "1faaf5b307ecb97b46e477d28654c7bbb901bd7635fb487f4933d9d0a9f010f4",
    "validation": "b029773f7f0ce0818d88263bb8286e8e4415172ca7f9742152eac93704f2c451",
    "test": "04fa980c36e80b4288230404705cdccf9f8d63f63fd8b1b870626cb324aecc2e",
}
# Held out of the cache entirely: their test utterances become out-of-scope queries. Six are near
# neighbours of intents that stay cached (the hard cases: the same nouns, another action), four
# are two whole domains with no cached intent left (the easy cases).
MASSIVE_HELD_OUT = (
    "alarm_query",  # vs alarm_set, alarm_remove
    "audio_volume_down",  # vs audio_volume_up, audio_volume_mute
    "iot_hue_lightdim",  # vs iot_hue_lightup, iot_hue_lightchange
    "calendar_remove",  # vs calendar_set, calendar_query
    "email_addcontact",  # vs email_querycontact
    "transport_taxi",  # vs transport_ticket, transport_query
    "takeaway_order",  # the takeaway domain
    "takeaway_query",
    "cooking_recipe",  # the cooking domain (cooking_query has 4 train rows and no test row)
    "cooking_query",
)
MASSIVE_FIELDS = ("text", "label", "massive_intent", "massive_split", "massive_id")
MASSIVE_ATTRIBUTION = """\
massive_zh_cache.csv and massive_zh_queries.csv are adapted from "MASSIVE" by Amazon.com Inc. or
its affiliates, licensed under CC BY 4.0 (https://creativecommons.org/licenses/by/4.0/); MASSIVE
localizes SLURP (Bastianelli et al., EMNLP 2020), whose text is CC BY 4.0 too. Source: the zh-CN
train and test splits as committed to github.com/DuoWeiTree/ZeroshotClassification @88eafae9
(testdata/amazon_massive_intent_zh-CN_*.csv). Changes: selection (utterance text and intent
only); the intents
  {held_out}
held out of the cache and their test utterances relabelled oos; texts filed under more than one
intent, and repeated texts, removed. Cite: Jack FitzGerald et al., "MASSIVE: A 1M-Example
Multilingual Natural Language Understanding Dataset with 51 Typologically-Diverse Languages",
arXiv:2204.08582 (2022). No warranties are given.
"""


def _key(text: str) -> str:
    """What the cache compares: the normalized query (the text itself if it cannot be one)."""
    try:
        return normalize(text)
    except InvalidQueryError:
        return text


def read_massive(source: Path, split: str, verify: bool) -> list[dict[str, str]]:
    path = source / MASSIVE_FILE.format(split=split)
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if verify and digest != MASSIVE_SHA256[split]:
        raise SystemExit(
            f"{path}: not the file of {MASSIVE_REPO} @{MASSIVE_COMMIT[:12]} "
            f"(sha256 {digest}, expected {MASSIVE_SHA256[split]}); --no-verify to go on"
        )
    reader = csv.DictReader(data.decode("utf-8").splitlines())
    missing = {"id", "text", "label_text"} - set(reader.fieldnames or ())
    if missing:
        raise SystemExit(f"{path}: no column {', '.join(sorted(missing))}")
    rows = [{"id": r["id"], "text": r["text"], "intent": r["label_text"]} for r in reader]
    for row in rows:
        if not row["text"].strip() or not row["intent"]:
            raise SystemExit(f"{path}: utterance {row['id']} has no text or no intent")
    return rows


def _write(path: Path, fields: tuple[str, ...], rows: list[dict[str, str]]) -> None:
    with path.open("w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


def build_massive(source: Path, out: Path, verify: bool) -> dict[str, object]:
    splits = {s: read_massive(source, s, verify) for s in ("train", "validation", "test")}
    intents_of: dict[str, set[str]] = defaultdict(set)
    for rows in splits.values():
        for r in rows:
            intents_of[_key(r["text"])].add(r["intent"])
    ambiguous = {k for k, intents in intents_of.items() if len(intents) > 1}

    def select(rows: list[dict[str, str]]) -> tuple[list[dict[str, str]], int, int]:
        """Rows less ambiguous texts and repeats; with the number of each dropped."""
        kept, seen, n_ambiguous, n_repeat = [], set(), 0, 0
        for r in rows:
            k = _key(r["text"])
            if k in ambiguous:
                n_ambiguous += 1
            elif k in seen:
                n_repeat += 1
            else:
                seen.add(k)
                kept.append(r)
        return kept, n_ambiguous, n_repeat

    train, train_ambiguous, train_repeats = select(
        [r for r in splits["train"] if r["intent"] not in MASSIVE_HELD_OUT]
    )
    test, test_ambiguous, test_repeats = select(splits["test"])
    cached_labels = {r["intent"] for r in train}

    def row(r: dict[str, str], split: str, label: str) -> dict[str, str]:
        return {
            "text": r["text"],
            "label": label,
            "massive_intent": r["intent"],
            "massive_split": split,
            "massive_id": r["id"],
        }

    cache_rows = [row(r, "train", r["intent"]) for r in train]
    query_rows = [
        row(r, "test", r["intent"] if r["intent"] in cached_labels else OOS) for r in test
    ]
    out.mkdir(parents=True, exist_ok=True)
    _write(out / "massive_zh_cache.csv", MASSIVE_FIELDS, cache_rows)
    _write(out / "massive_zh_queries.csv", MASSIVE_FIELDS, query_rows)
    (out / "MASSIVE_NOTICE.txt").write_text(
        MASSIVE_ATTRIBUTION.format(
            held_out=textwrap.fill(", ".join(MASSIVE_HELD_OUT), 96, subsequent_indent="  ")
        ),
        encoding="utf-8",
    )
    all_intents = {r["intent"] for rows in splits.values() for r in rows}
    cache_keys = {_key(r["text"]) for r in cache_rows}
    per_label = Counter(r["label"] for r in cache_rows)
    oos_rows = [r for r in query_rows if r["label"] == OOS]
    return {
        "source": f"{MASSIVE_REPO} @{MASSIVE_COMMIT}, testdata/{MASSIVE_FILE}",
        "licence": "CC BY 4.0 (MASSIVE, Amazon.com Inc. or its affiliates)",
        "source_rows": {s: len(rows) for s, rows in splits.items()},
        "source_intents": len(all_intents),
        "held_out_intents": list(MASSIVE_HELD_OUT),
        "oos_also": sorted(all_intents - cached_labels - set(MASSIVE_HELD_OUT)),
        "ambiguous_texts": len(ambiguous),
        "dropped_ambiguous_rows": {"cache": train_ambiguous, "queries": test_ambiguous},
        "dropped_repeated_rows": {"cache": train_repeats, "queries": test_repeats},
        "cache_rows": len(cache_rows),
        "cache_labels": len(cached_labels),
        "cache_rows_per_label_min_max": [min(per_label.values()), max(per_label.values())],
        "query_rows": len(query_rows),
        "query_in_scope_rows": len(query_rows) - len(oos_rows),
        "oos_rows": len(oos_rows),
        "oos_rows_by_intent": dict(sorted(Counter(r["massive_intent"] for r in oos_rows).items())),
        "in_scope_queries_also_cached_verbatim": sum(
            r["label"] != OOS and _key(r["text"]) in cache_keys for r in query_rows
        ),
    }


XSID_DIR = "data/xSID-0.7"
XSID_COMMIT = "761d926c3f2e9f6bea13192d2f39cec1d04d9777"
XSID_BLOBS = {
    "zh.valid.conll": "fca9a3b406c21261e16cfed0f4515b6f293ea2b6",
    "zh.test.conll": "546b5fe2a6dc13953cbb820e997f35c5c891c509",
}
# Held out of the cache entirely: their test utterances become out-of-scope queries. One intent
# of another domain (books) and two that are near neighbours of cached intents (showing alarms or
# reminders vs setting or cancelling them), so the out-of-scope set has easy and hard cases.
XSID_HELD_OUT = ("RateBook", "alarm/show_alarms", "reminder/show_reminders")
XSID_FIELDS = ("text", "label", "text_en", "xsid_split", "xsid_id")


def _blob_id(data: bytes) -> str:
    """The git blob id of ``data``: what ``git ls-tree`` prints, so the pin is checkable by eye."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def read_conll(path: Path, verify: bool) -> list[dict[str, str]]:
    """One row per utterance: the ``# id``, ``# text``, ``# text-en`` and ``# intent`` comments."""
    data = path.read_bytes()
    if verify and _blob_id(data) != XSID_BLOBS[path.name]:
        raise SystemExit(
            f"{path}: not the file of mainlp/xsid @{XSID_COMMIT[:12]} "
            f"(blob {_blob_id(data)}, expected {XSID_BLOBS[path.name]}); --no-verify to go on"
        )
    rows, current = [], {}
    for line in data.decode("utf-8").splitlines():
        if line.startswith("# ") and " = " in line:
            name, _, value = line[2:].partition(" = ")
            current[name.strip()] = value.strip()
        elif not line.strip() and current:
            rows.append(current)
            current = {}
    if current:
        rows.append(current)
    for row in rows:
        if not row.get("text") or not row.get("intent"):
            raise SystemExit(f"{path}: utterance {row.get('id')} has no text or no intent")
    return rows


def build_xsid(source: Path, out: Path, verify: bool) -> dict[str, object]:
    valid = read_conll(source / XSID_DIR / "zh.valid.conll", verify)
    test = read_conll(source / XSID_DIR / "zh.test.conll", verify)
    cache = [r for r in valid if r["intent"] not in XSID_HELD_OUT]
    cached_labels = {r["intent"] for r in cache}

    def row(r: dict[str, str], split: str, label: str) -> dict[str, str]:
        return {
            "text": r["text"],
            "label": label,
            "text_en": r.get("text-en", ""),
            "xsid_split": split,
            "xsid_id": r["id"],
        }

    cache_rows = [row(r, "valid", r["intent"]) for r in cache]
    query_rows = [
        row(r, "test", r["intent"] if r["intent"] in cached_labels else OOS) for r in test
    ]
    out.mkdir(parents=True, exist_ok=True)
    _write(out / "xsid_zh_cache.csv", XSID_FIELDS, cache_rows)
    _write(out / "xsid_zh_queries.csv", XSID_FIELDS, query_rows)
    shutil.copyfile(source / "LICENSE", out / "LICENSE")
    no_cache = sorted({r["intent"] for r in test} - cached_labels - set(XSID_HELD_OUT))
    cache_texts = {_key(r["text"]) for r in cache_rows}
    return {
        "source": f"mainlp/xsid @{XSID_COMMIT}, {XSID_DIR}/zh.{{valid,test}}.conll",
        "licence": "CC BY-SA 4.0",
        "held_out_intents": list(XSID_HELD_OUT),
        "oos_also": no_cache,
        "cache_rows": len(cache_rows),
        "cache_labels": len(cached_labels),
        "query_rows": len(query_rows),
        "oos_rows": sum(r["label"] == OOS for r in query_rows),
        "in_scope_queries_also_cached_verbatim": sum(
            r["label"] != OOS and _key(r["text"]) in cache_texts for r in query_rows
        ),
        "query_labels": dict(sorted(Counter(r["label"] for r in query_rows).items())),
    }


BUILDERS = {"massive": build_massive, "xsid": build_xsid}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--dataset", choices=sorted(BUILDERS), default="massive", help="default: massive"
    )
    parser.add_argument(
        "--source",
        type=Path,
        required=True,
        help=f"massive: a folder holding {MASSIVE_FILE.format(split='{train,validation,test}')}; "
        f"xsid: a tree of mainlp/xsid holding LICENSE and {XSID_DIR}/zh.*.conll",
    )
    parser.add_argument("--out", type=Path, required=True, help="folder for the CSV files")
    parser.add_argument("--no-verify", action="store_true", help="accept other input files")
    args = parser.parse_args(argv)
    summary = BUILDERS[args.dataset](args.source, args.out, verify=not args.no_verify)
    json.dump(summary, sys.stdout, ensure_ascii=False)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
