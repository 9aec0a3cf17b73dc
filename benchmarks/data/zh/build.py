"""Build the Chinese cache-quality evaluation set from xSID 0.7 (zh), CC BY-SA 4.0.

xSID (van der Goot et al., NAACL 2021; mainlp/xsid) gives each of its validation and test
utterances a human Chinese translation and an intent label. This script turns them into the
two CSV files that ``benchmarks/cache_quality.py`` reads:

  xsid_zh_cache.csv    the validation split, less the held-out intents: the cached questions
  xsid_zh_queries.csv  the test split; the held-out intents' utterances, and those of any intent
                       with no cached utterance, are labelled ``oos`` (they must miss)

Columns: ``text,label,text_en,xsid_split,xsid_id``. Rows keep the source's order; nothing is
sampled, so one input always gives the same bytes. The inputs are checked against the git blob
ids of the files at mainlp/xsid @761d926c3f2e9f6bea13192d2f39cec1d04d9777 (``--no-verify``
skips that).

Run (README.md says how to extract the source from the fetched repository):
  python benchmarks/data/zh/build.py --source /tmp/xsid-src --out benchmarks/out/zh
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import shutil
import sys
from collections import Counter
from pathlib import Path

VERSION_DIR = "data/xSID-0.7"
SOURCE_COMMIT = "761d926c3f2e9f6bea13192d2f39cec1d04d9777"
SOURCE_BLOBS = {
    "zh.valid.conll": "fca9a3b406c21261e16cfed0f4515b6f293ea2b6",
    "zh.test.conll": "546b5fe2a6dc13953cbb820e997f35c5c891c509",
}
# Held out of the cache entirely: their test utterances become out-of-scope queries. One intent
# of another domain (books) and two that are near neighbours of cached intents (showing alarms or
# reminders vs setting or cancelling them), so the out-of-scope set has easy and hard cases.
HELD_OUT = ("RateBook", "alarm/show_alarms", "reminder/show_reminders")
OOS = "oos"
FIELDS = ("text", "label", "text_en", "xsid_split", "xsid_id")


def _blob_id(data: bytes) -> str:
    """The git blob id of ``data``: what ``git ls-tree`` prints, so the pin is checkable by eye."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def read_conll(path: Path, verify: bool) -> list[dict[str, str]]:
    """One row per utterance: the ``# id``, ``# text``, ``# text-en`` and ``# intent`` comments."""
    data = path.read_bytes()
    if verify and _blob_id(data) != SOURCE_BLOBS[path.name]:
        raise SystemExit(
            f"{path}: not the file of mainlp/xsid @{SOURCE_COMMIT[:12]} "
            f"(blob {_blob_id(data)}, expected {SOURCE_BLOBS[path.name]}); --no-verify to go on"
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


def build(source: Path, out: Path, verify: bool) -> dict[str, object]:
    valid = read_conll(source / VERSION_DIR / "zh.valid.conll", verify)
    test = read_conll(source / VERSION_DIR / "zh.test.conll", verify)
    cache = [r for r in valid if r["intent"] not in HELD_OUT]
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
    for name, rows in (("xsid_zh_cache.csv", cache_rows), ("xsid_zh_queries.csv", query_rows)):
        with (out / name).open("w", encoding="utf-8", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=FIELDS, lineterminator="\n")
            writer.writeheader()
            writer.writerows(rows)
    shutil.copyfile(source / "LICENSE", out / "LICENSE")
    no_cache = sorted({r["intent"] for r in test} - cached_labels - set(HELD_OUT))
    cache_texts = {r["text"] for r in cache_rows}
    return {
        "source": f"mainlp/xsid @{SOURCE_COMMIT}, {VERSION_DIR}/zh.{{valid,test}}.conll",
        "licence": "CC BY-SA 4.0",
        "held_out_intents": list(HELD_OUT),
        "oos_also": no_cache,
        "cache_rows": len(cache_rows),
        "cache_labels": len(cached_labels),
        "query_rows": len(query_rows),
        "oos_rows": sum(r["label"] == OOS for r in query_rows),
        "in_scope_queries_also_cached_verbatim": sum(
            r["label"] != OOS and r["text"] in cache_texts for r in query_rows
        ),
        "query_labels": dict(sorted(Counter(r["label"] for r in query_rows).items())),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--source",
        type=Path,
        required=True,
        help=f"a tree of mainlp/xsid holding LICENSE and {VERSION_DIR}/zh.*.conll",
    )
    parser.add_argument("--out", type=Path, required=True, help="folder for the CSV files")
    parser.add_argument("--no-verify", action="store_true", help="accept other input files")
    args = parser.parse_args(argv)
    summary = build(args.source, args.out, verify=not args.no_verify)
    json.dump(summary, sys.stdout, ensure_ascii=False)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
