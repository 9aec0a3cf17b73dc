"""Hit precision of the semantic cache: edgeqa's calibrated decision vs plain cosine thresholds.

Builds a release from the cache rows with the real build code (one answer per label, every
distinct phrasing of the label indexed under it; the decision calibrated leave-one-out on these
rows only, to a target precision), then looks up every query through the real lookup code (exact
tier, then semantic). A hit is correct when it returns the query's label's answer; a query
labelled ``oos`` must miss.

  hit_rate            in-scope queries answered / in-scope queries
  precision           correct hits / all hits (an out-of-scope hit is a wrong hit)
  oos_false_hit_rate  out-of-scope queries answered / out-of-scope queries

Systems: ``cosine_0.8`` and ``cosine_0.9`` (nearest phrasing above a fixed cosine, the usual
defaults elsewhere); then what each of edgeqa's steps buys, each calibrated on the cache rows
to the target precision: ``calibrated_cosine`` (threshold only), ``+margin``, ``+agreement``,
``+guard`` (the base embedder with the full decision) and ``edgeqa``: all of it with the embedder
fine-tuned on the cache rows (``--finetune-steps``, default 150, ~8 min on 2 idle CPU cores; shipped
inside the release and recorded in its manifest). ``--finetune-steps 0``: ``edgeqa`` = ``+guard``.
A calibrated system whose calibration cannot reach the target answers as the product would:
exact hits only (``"semantic": false``), never on the uncalibrated fallback threshold.

Prints one JSON object: {"config": {...}, "systems": {"<name>": {"threshold", "hit_rate",
"precision", "oos_false_hit_rate", ...}}}

Run:
  .venv/bin/python benchmarks/cache_quality.py \\
      --cache ../shared/data/banking77/train.csv --queries ../shared/data/banking77/test.csv
  .venv/bin/python benchmarks/cache_quality.py \\
      --cache ../shared/data/clinc150/clinc150_full_flat.csv --cache-where split=train \\
      --queries ../shared/data/clinc150/clinc150_full_flat.csv \\
      --queries-where split=test,oos_test
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import tempfile
import time
from collections import Counter, defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Sequence

    import numpy as np

    from base.manifest import Finetuned, Manifest
    from edge_index.lookup import ReleaseIndex
    from semantic.guard import Guard
    from semantic.matcher import Decision

LABEL_COLUMNS = ("label", "category", "intent")
OOS = "oos"


def read_rows(path: Path, where: str | None) -> list[tuple[str, str]]:
    """(text, label) rows; ``where``: ``column=value1,value2`` keeps matching rows only."""
    column, values = None, set()
    if where:
        column, _, wanted = where.partition("=")
        values = set(wanted.split(","))
    with path.open(encoding="utf-8") as f:
        reader = csv.DictReader(f)
        fields = reader.fieldnames or []
        label = next((c for c in LABEL_COLUMNS if c in fields), None)
        if "text" not in fields or label is None:
            raise SystemExit(f"{path}: needs a text column and one of {LABEL_COLUMNS}")
        rows = []
        for row in reader:
            if column and row.get(column) not in values:
                continue
            rows.append((row["text"], row[label]))
    return rows


def answer_for(label: str, labels: list[str], language: str) -> str:
    """The placeholder answer of ``label``, in the cache's language (an answer in another
    script than its question is flagged and never published: ``policy/answers.py``)."""
    if language == "zh":
        return f"这是第{labels.index(label) + 1}类问题的答案。"
    return f"answer for {label}"


def cache_release(
    rows: list[tuple[str, str]],
    embedder: Any,
    name: str,
    tmp: Path,
    target: float,
    language: str = "en",
    embedder_dir: Path | None = None,
    embedder_info: Finetuned | None = None,
) -> tuple[ReleaseIndex, Manifest, list[dict[str, Any]], np.ndarray]:
    """Build, publish and load a release with one answer per label."""
    import numpy as np

    from base.keys import InvalidQueryError, key_of_normalized, normalize
    from base.release import load_release
    from base.store import FileStore
    from edge_index.lookup import ReleaseIndex
    from precompute.build import answered, build_release
    from precompute.config import BuildConfig
    from precompute.publish import publish
    from precompute.questions import HotQuestion, Phrasing

    by_key: dict[str, Counter[str]] = defaultdict(Counter)
    text_of: dict[str, str] = {}
    normalized_of: dict[str, str] = {}
    for text, label in rows:
        if label == OOS:
            continue  # out-of-scope rows are never cached
        try:
            normalized = normalize(text)
        except InvalidQueryError:
            continue
        k = key_of_normalized(normalized)
        by_key[k][label] += 1
        text_of.setdefault(k, text)
        normalized_of[k] = normalized
    phrasings: dict[str, list[Phrasing]] = defaultdict(list)
    for k, labels in by_key.items():
        label = labels.most_common(1)[0][0]  # a phrasing listed under two labels: the majority
        phrasings[label].append(Phrasing(k, normalized_of[k], text_of[k], set(), 1, {}))
    now = datetime.now(UTC).replace(microsecond=0)
    hot, answers = [], {}
    labels = sorted({label for _, label in rows})
    for label, group in sorted(phrasings.items()):
        hot.append(HotQuestion(group[0], group, 0, len(group), 0.0))
        answer = answer_for(label, labels, language)
        answers[group[0].key] = {"answer": answer, "flag": "", "generated_at": now}
    store = FileStore(tmp / "store")
    manifest, _ = build_release(
        tmp / "release",
        answered(hot, answers),
        embedder,
        name,
        "cache-quality",
        {"bench": True},
        BuildConfig(target_precision=target),
        extra={"parent": None},
        now=now,
        embedder_dir=embedder_dir,
        embedder_info=embedder_info,
    )
    publish(store, tmp / "release")
    release = load_release(store, "cache-quality")
    rows_out = [r for shard in release.shards for r in shard.rows.to_pylist()]
    vectors = np.concatenate([s.index.reconstruct_n(0, s.index.ntotal) for s in release.shards])
    return ReleaseIndex(release, embedder), manifest, rows_out, vectors


def evaluate(
    index: ReleaseIndex,
    queries: list[tuple[str, str]],
    query_vectors: np.ndarray,
    label_of_answer: dict[str, str],
) -> dict[str, Any]:
    from base.keys import InvalidQueryError, key_of_normalized, normalize
    from edge_index import tiers
    from edge_index.lookup import Hit

    scores, ids = index.search(query_vectors, index.k)
    hits = correct = in_scope = in_scope_hits = oos = oos_hits = 0
    by_tier: Counter[str] = Counter()
    for (text, label), s, i in zip(queries, scores, ids, strict=True):
        try:
            normalized = normalize(text)
        except InvalidQueryError:
            continue
        # the tier cascade (edge_index/tiers.py) with the semantic search batched up front
        result = tiers.exact(index, key_of_normalized(normalized)) or index.decide(text, s, i)
        is_oos = label == OOS
        oos += is_oos
        in_scope += not is_oos
        if isinstance(result, Hit):
            hits += 1
            by_tier[result.tier] += 1
            if is_oos:
                oos_hits += 1
            else:
                in_scope_hits += 1
                correct += label_of_answer[result.answer] == label
    return {
        "semantic": index.semantic,
        "threshold": index.decision.threshold,
        "margin": index.decision.margin,
        "agreement": index.decision.agreement,
        "guard": any(index.guard.as_dict().values()),
        "hit_rate": round(in_scope_hits / in_scope, 4) if in_scope else None,
        "precision": round(correct / hits, 4) if hits else None,
        "oos_false_hit_rate": round(oos_hits / oos, 4) if oos else None,
        "hits_by_tier": dict(by_tier),
    }


def pairs_report(path: Path, embedder: Any, decision: Decision, guard: Guard) -> dict[str, Any]:
    """Precision and recall of the threshold + guard decision on labelled duplicate pairs."""
    with path.open(encoding="utf-8") as f:
        pairs = [
            (r["question1"], r["question2"], r["is_duplicate"] in ("1", "true", "True"))
            for r in csv.DictReader(f)
        ]
    a = embedder.encode([p[0] for p in pairs], normalize_embeddings=True, batch_size=256)
    b = embedder.encode([p[1] for p in pairs], normalize_embeddings=True, batch_size=256)
    cosine = (a * b).sum(axis=1)
    predicted = [
        bool(c >= decision.threshold) and guard.check(q2, q1) is None
        for c, (q1, q2, _) in zip(cosine, pairs, strict=True)
    ]
    tp = sum(p and d for p, (_, _, d) in zip(predicted, pairs, strict=True))
    fp = sum(p and not d for p, (_, _, d) in zip(predicted, pairs, strict=True))
    positives = sum(d for _, _, d in pairs)
    return {
        "pairs": len(pairs),
        "precision": round(tp / (tp + fp), 4) if tp + fp else None,
        "recall": round(tp / positives, 4) if positives else None,
    }


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cache", type=Path, required=True, help="CSV text,label")
    parser.add_argument("--queries", type=Path, required=True, help="CSV text,label (oos: miss)")
    parser.add_argument("--cache-where", default=None, help="column=v1,v2 filter on --cache")
    parser.add_argument("--queries-where", default=None, help="column=v1,v2 filter on --queries")
    parser.add_argument(
        "--pairs", type=Path, default=None, help="CSV question1,question2,is_duplicate"
    )
    parser.add_argument("--target-precision", type=float, default=0.99)
    parser.add_argument(
        "--finetune-steps", type=int, default=150, help="embedder tuning steps; 0: none"
    )
    parser.add_argument(
        "--embedder",
        default=None,
        help="default: the one the product picks for the cache's language (EDGEQA_EMBEDDER)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    from base.config import SharedSettings
    from base.keys import InvalidQueryError, normalize
    from base.languages import language_of
    from base.manifest import Finetuned
    from edge_index.lookup import ReleaseIndex
    from semantic.guard import Guard
    from semantic.loading import load_embedder
    from semantic.matcher import Decision, calibrate

    started = time.perf_counter()
    cache = read_rows(args.cache, args.cache_where)
    queries = read_rows(args.queries, args.queries_where)
    # the language profile the product would put these questions in, and its embedder
    language = Counter(language_of(text) for text, _ in cache).most_common(1)[0][0]
    spec = args.embedder or SharedSettings.from_env().embedders.get(language, "embedded")
    embedder = load_embedder(spec, device="cpu")
    systems: dict[str, dict[str, Any]] = {}
    labels = sorted({label for _, label in cache})
    label_of_answer = {answer_for(label, labels, language): label for label in labels}

    def run(
        model: Any, name: str, tmp: Path, ablations: bool, prefix: str = "", **ship: Any
    ) -> ReleaseIndex:
        embedder_name = spec if not ship else f"{spec}+finetune"
        index, manifest, rows, vectors = cache_release(
            cache, model, embedder_name, tmp, args.target_precision, language, **ship
        )
        normalized = []
        for text, _ in queries:
            try:
                normalized.append(normalize(text))
            except InvalidQueryError:
                normalized.append(text)
        query_vectors = index.embed(normalized)
        if ablations:
            off = Guard(numbers=False, negations=False, entities=False)
            for t in (0.8, 0.9):
                plain = ReleaseIndex(index.release, model, Decision(t, -1.0, 0.0), off)
                systems[f"{prefix}cosine_{t}"] = evaluate(
                    plain, queries, query_vectors, label_of_answer
                )
            labels = [r["cluster"] for r in rows]
            texts = [r["question"] for r in rows]
            for system, use_margin, use_agreement in (
                (f"{prefix}calibrated_cosine", False, False),
                (f"{prefix}+margin", True, False),
                (f"{prefix}+agreement", True, True),
            ):
                cal = calibrate(
                    vectors,
                    labels,
                    texts,
                    None,
                    args.target_precision,
                    use_margin=use_margin,
                    use_agreement=use_agreement,
                )
                variant = ReleaseIndex(index.release, model, cal.decision, off)
                variant.semantic = cal.calibrated  # as the product: uncalibrated is exact only
                systems[system] = evaluate(variant, queries, query_vectors, label_of_answer)
                systems[system]["calibrated"] = cal.calibrated
        systems[name] = evaluate(index, queries, query_vectors, label_of_answer)
        systems[name]["calibration"] = manifest.threshold.as_dict()
        systems[name]["embedder"] = manifest.embedder.as_dict(exclude={"files"})
        print(f"{name}: {systems[name]}", file=sys.stderr, flush=True)
        return index

    with tempfile.TemporaryDirectory() as tmp:
        index = run(embedder, "+guard", Path(tmp) / "base", ablations=True)
        if spec != "embedded":  # side by side: what the English embedder would have done
            run(
                load_embedder("embedded", device="cpu"),
                "minilm:+guard",
                Path(tmp) / "minilm",
                ablations=True,
                prefix="minilm:",
            )
        if args.pairs:
            systems["+guard"]["pairs"] = pairs_report(
                args.pairs, embedder, index.decision, index.guard
            )
        if args.finetune_steps:
            from precompute.finetune import finetune, model_digest
            from semantic.loading import trainable

            tuned = trainable(embedder)
            t0 = time.perf_counter()
            texts = [normalize(t) for t, label in cache if label != OOS]
            labels = [label for _, label in cache if label != OOS]
            finetune(tuned, texts, labels, steps=args.finetune_steps)
            tune_s = time.perf_counter() - t0
            folder = Path(tmp) / "tuned-model"
            tuned.save(str(folder))
            info = Finetuned.of(
                {
                    "base": spec,
                    "steps": args.finetune_steps,
                    "examples": len(texts),
                    "seconds": round(tune_s, 1),
                    "sha256": model_digest(folder),
                }
            )
            run(
                tuned,
                "edgeqa",
                Path(tmp) / "tuned",
                ablations=False,
                embedder_dir=folder,
                embedder_info=info,
            )
        else:
            systems["edgeqa"] = systems["+guard"]

    print(
        json.dumps(
            {
                "config": {
                    "cache": str(args.cache),
                    "cache_where": args.cache_where,
                    "queries": str(args.queries),
                    "queries_where": args.queries_where,
                    "cache_rows": len(cache),
                    "queries_rows": len(queries),
                    "oos_queries": sum(1 for _, label in queries if label == OOS),
                    "target_precision": args.target_precision,
                    "language": language,
                    "embedder": spec,
                    "seconds": round(time.perf_counter() - started, 1),
                },
                "systems": systems,
            }
        )
    )


if __name__ == "__main__":
    main()
