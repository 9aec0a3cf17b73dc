"""Curated answers: the operator's JSON Lines file, the rows it answers, and a zh run using it."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, date, datetime, timedelta
from datetime import time as day_time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from base.keys import key, normalize
from base.release import load_release, read_pointer
from base.store import FileStore
from base.users import hash_user
from precompute.curated import (
    CURATED,
    CuratedAnswersError,
    curated_rows,
    parse_curated,
    read_curated,
)
from precompute.generate import answer_schema
from precompute.questions import HotQuestion, Phrasing
from precompute.samplelogs import write_logs
from tests.conftest import fast_weights

NOW = datetime(2026, 11, 28, 12, tzinfo=UTC)


def _jsonl(*items: Any) -> str:
    """One line per item: a dict or list as JSON, a str as it is."""
    return "\n".join(i if isinstance(i, str) else json.dumps(i, ensure_ascii=False) for i in items)


def test_parse_curated_reads_the_answer_by_the_question_key() -> None:
    data = _jsonl(
        {"question": "How do I freeze my card?", "answer": "Use Cards > Freeze in the app."},
        "",
        "   ",
        {"question": "如何冻结我的银行卡？", "answer": "请在手机银行中冻结。", "note": "ignored"},
    ).encode()
    curated = parse_curated(data + b"\n\n")
    assert curated == {
        key("How do I freeze my card?"): "Use Cards > Freeze in the app.",
        key("如何冻结我的银行卡？"): "请在手机银行中冻结。",
    }
    # a question is found by its key: the same question typed otherwise is the same entry
    assert key("  how do I FREEZE my card??") in curated
    assert key("如何冻结我的银行卡") in curated
    assert parse_curated(b"") == {} and parse_curated(b"\n \n") == {}


GOOD = {"question": "What are your opening hours?", "answer": "9 to 5, Monday to Friday."}


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "line 3 is not JSON"),
        ("[1, 2]", 'line 3 must be {"question": ..., "answer": ...}'),
        ('"just a string"', "line 3 must be"),
        ({"question": "How do I close my account?"}, "line 3: question and answer must be"),
        ({"question": "How do I close my account?", "answer": " \t"}, "line 3: question and"),
        ({"question": "How do I close my account?", "answer": 5}, "line 3: question and"),
        ({"answer": "Call us."}, "line 3: question and answer must be non-empty strings"),
        ({"question": "", "answer": "Call us."}, "line 3: "),
        ({"question": " ?? ", "answer": "Call us."}, "line 3: "),
        ({"question": "How do I close my account?", "answer": "x" * 16_001}, "line 3: the answer"),
        (
            {"question": "Why was 4111 1111 1111 1111 declined?", "answer": "Call us."},
            "line 3: the question carries personal data ['card']",
        ),
        (
            {"question": "How do I contact support?", "answer": "Write to jane.doe@example.com."},
            "line 3: the answer carries personal data ['email']",
        ),
        (
            {"question": "如何联系客服？", "answer": "请拨打 138 0013 8000。"},
            "line 3: the answer carries personal data ['phone']",
        ),
    ],
)
def test_parse_curated_refuses_a_bad_line_naming_it(line: Any, message: str) -> None:
    data = _jsonl(GOOD, "", line, GOOD).encode()
    with pytest.raises(CuratedAnswersError) as caught:
        parse_curated(data, "faq.jsonl")
    assert str(caught.value).startswith("faq.jsonl line 3")
    assert message in str(caught.value)


def test_parse_curated_refuses_a_file_that_is_not_utf8() -> None:
    data = (
        _jsonl(GOOD).encode() + b"\n" + '{"question": "caf\xe9?", "answer": "x"}'.encode("latin-1")
    )
    with pytest.raises(CuratedAnswersError, match=r"faq\.jsonl is not UTF-8"):
        parse_curated(data, "faq.jsonl")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_read_curated_returns_the_answers_and_the_file_digest(tmp_path: Path) -> None:
    path = tmp_path / "faq.jsonl"
    data = _jsonl(
        GOOD, {"question": "跨行转账多久能到账？", "answer": "通常两个工作日内。"}
    ).encode()
    path.write_bytes(data)
    curated, sha = read_curated(str(path), _sha256(data))
    assert sha == _sha256(data)
    assert curated == parse_curated(data)
    assert read_curated(path.as_uri(), sha.upper()) == (curated, sha)  # file://...
    with pytest.raises(CuratedAnswersError, match="no curated answers file"):
        read_curated(str(tmp_path / "missing.jsonl"), sha)
    path.write_bytes(data + b"\nnot json\n")
    with pytest.raises(CuratedAnswersError, match=r"faq\.jsonl line 3 is not JSON"):
        read_curated(str(path), _sha256(path.read_bytes()))


def test_read_curated_refuses_a_file_that_is_not_the_pinned_one(tmp_path: Path) -> None:
    path = tmp_path / "faq.jsonl"
    reviewed = _jsonl(GOOD, {"question": "How do I close my account?", "answer": "Call us."})
    pinned = _sha256(reviewed.encode())
    path.write_text(reviewed, encoding="utf-8")
    assert read_curated(str(path), pinned)[1] == pinned
    # changed after it was reviewed, by whoever may write where it lives: still a valid file
    # (nothing but the pin tells), refused whole before a line of it is read
    for tampered in (
        reviewed.replace("Call us.", "Send your card number to support-desk.example."),
        reviewed + "\n" + json.dumps({"question": "Is my money safe?", "answer": "Sell now."}),
        reviewed + "\n",
    ):
        assert parse_curated(tampered.encode())
        path.write_text(tampered, encoding="utf-8")
        with pytest.raises(CuratedAnswersError) as caught:
            read_curated(str(path), pinned)
        message = str(caught.value)
        assert f"has sha256 {_sha256(tampered.encode())}, not the pinned {pinned}" in message
        assert "refused" in message and "EDGEQA_CURATED_ANSWERS_SHA256" in message
    # a file nobody pinned is not read either
    path.write_text(reviewed, encoding="utf-8")
    with pytest.raises(CuratedAnswersError, match=r"faq\.jsonl is not pinned: set EDGEQA_CURATED"):
        read_curated(str(path), "")


def test_curated_answers_are_pinned_by_the_configuration() -> None:
    from base.config import ConfigError
    from precompute.config import PipelineConfig

    # answers without a pin: refused when the run is configured, before anything runs
    with pytest.raises(ConfigError, match=r"--answers.*EDGEQA_CURATED_ANSWERS_SHA256"):
        PipelineConfig.from_env({}, answers="faq.jsonl")
    with pytest.raises(ConfigError, match="EDGEQA_CURATED_ANSWERS_SHA256: 'abc' is not a sha256"):
        PipelineConfig.from_env({"EDGEQA_CURATED_ANSWERS_SHA256": "abc"}, answers="faq.jsonl")
    pin, other = "ab" * 32, "cd" * 32
    config = PipelineConfig.from_env(
        {"EDGEQA_CURATED_ANSWERS_SHA256": pin.upper()}, answers="faq.jsonl"
    )
    assert config.settings.curated_answers_sha256 == pin
    assert config.generation.curated_answers == "faq.jsonl"
    # the pin is the deployment's alone: a run bringing its own is refused (test_config_bar.py)
    with pytest.raises(ConfigError, match="answers_sha256 refused"):
        PipelineConfig.from_env(
            {"EDGEQA_CURATED_ANSWERS_SHA256": pin}, answers="faq.jsonl", answers_sha256=other
        )
    # no answers, no pin needed
    assert PipelineConfig.from_env({}).generation.curated_answers == ""


def _phrasing(question: str, users: int = 5) -> Phrasing:
    people = {f"u{i}" for i in range(users)}
    return Phrasing(
        key(question), normalize(question), question, people, users, dict.fromkeys(people, NOW)
    )


def _cluster(*questions: str) -> HotQuestion:
    phrasings = [_phrasing(q) for q in questions]
    return HotQuestion(phrasings[0], phrasings, users=5, hits=5 * len(questions), score=5.0)


def test_curated_rows_answer_the_clusters_a_curated_question_is_in() -> None:
    freeze = _cluster("How do I freeze my card?", "how can I freeze my card")
    hours = _cluster("What are your opening hours?", "when are you open")
    close = _cluster("How do I close my account?", "I want to close my account")
    curated = parse_curated(
        _jsonl(
            # a non-canonical phrasing of freeze
            {"question": "How can I freeze my card?", "answer": "Cards > Freeze."},
            # both phrasings of close: the canonical one's answer
            {"question": "i want to close my account", "answer": "Not this one."},
            {"question": "how do i close my account", "answer": "Call us to close it."},
            # asked by nobody: no row
            {"question": "Do you sell gold?", "answer": "No."},
        ).encode()
    )
    rows = curated_rows([freeze, hours, close], curated, NOW)
    assert [row["key"] for row in rows] == [freeze.key, close.key]  # hours: none curated
    first, second = rows
    assert first == {
        "key": freeze.key,
        "question": "How do I freeze my card?",  # the cluster's, not the curated wording
        "answer": "Cards > Freeze.",
        "tokens": 0,
        "finish_reason": "stop",
        "flag": "",
        "generated_at": NOW,
        "reused_from": CURATED,
    }
    assert second["answer"] == "Call us to close it." and second["reused_from"] == "curated"
    # rows of the generated answers' schema (the pipeline saves them in reused/)
    assert pa.Table.from_pylist(rows, schema=answer_schema()).num_rows == 2
    assert curated_rows([hours], curated, NOW) == []
    assert curated_rows([freeze], {}, NOW) == []


# the zh run: three Chinese questions, each asked by k=5 people; two answered by the operator
UNTIL = date(2026, 11, 28)
ZH_ASKED = ("如何冻结我的银行卡？", "跨行转账多久能到账？", "怎么修改我的联系地址？")
ZH_CURATED = {
    # typed without the question mark: the same key
    "如何冻结我的银行卡": "请在手机银行的“卡片管理”中选择冻结，或致电客服。",
    "跨行转账多久能到账？": "跨行转账通常在两个工作日内到账。",
}


def _log_rows(questions: tuple[str, ...], users: int) -> list[dict[str, Any]]:
    start = datetime.combine(UNTIL, day_time(8), UTC)
    rows = []
    for n, question in enumerate(questions):
        for i in range(users):
            rows.append(
                {
                    "ts": start + timedelta(minutes=7 * n + i),
                    "request_id": f"{n:04d}{i:012d}",
                    "user": hash_user(f"person-{n}-{i}", b"test-salt"),
                    "signed": True,
                    "tenant": "demo",
                    "query": question,
                    "normalized": normalize(question),
                    "key": key(question),
                    "turns": 1,
                    "tier": "generated",
                    "status": 200,
                    "latency_ms": 120.0,
                    "ttft_ms": 40.0,
                    "profile": "",
                }
            )
    return rows


def _zh_run(logs: FileStore, out: FileStore, config: Any) -> Any:
    """The zh run of UNTIL's logs, built as of that day's end."""
    from precompute.pipeline import RunParams

    return RunParams(
        logs.uri,
        out.uri,
        UNTIL,
        UNTIL,
        config,
        started=datetime.combine(UNTIL, day_time.max, UTC),
        language="zh",
    )


def test_a_zh_run_publishes_the_curated_answers(
    embedded_model: Any,
    multilingual_embedder: Any,  # converted into model_cache_dir once, for the run to load
    model_cache_dir: Path,
    tmp_path: Path,
) -> None:
    from precompute.config import PipelineConfig
    from precompute.pipeline import run_pipeline

    logs, out = FileStore(tmp_path / "logs"), FileStore(tmp_path / "out")
    # an English question asked as often: another profile's, not mined tonight
    english = _log_rows(("How do I freeze my card?",), 5)
    assert write_logs(logs, _log_rows(ZH_ASKED, 5) + english) == 20
    answers = tmp_path / "answers.jsonl"
    curated_lines = [{"question": q, "answer": a} for q, a in ZH_CURATED.items()]
    answers.write_text(_jsonl(*curated_lines) + "\n", encoding="utf-8")
    config = PipelineConfig.from_env(
        {
            "EDGEQA_CACHE_DIR": str(model_cache_dir),
            "EDGEQA_MIN_USERS": "5",
            "EDGEQA_CURATED_ANSWERS_SHA256": _sha256(answers.read_bytes()),
        },
        answers=str(answers),
        max_tokens=8,
        quantization=fast_weights(),
        ttl_days=3650.0,
    )
    params = _zh_run(logs, out, config)
    stages: dict[str, dict[str, Any]] = {}
    report = run_pipeline(
        params, model=embedded_model, on_stage=lambda n, r, s: stages.update({n: r})
    )

    assert report["status"] == "published", report
    assert "-zh-" in report["profile"]
    assert report["logs"]["rows"] == 15  # the zh questions' rows only
    assert report["mining"]["curated"] == 2 and stages["mine"]["curated"] == 2
    assert report["mining"]["published_clusters"] == 3
    assert report["generation"]["reused"] == 2 and report["generation"]["generated"] == 1

    pointer, _ = read_pointer(out, report["profile"])
    assert pointer is not None and pointer.version == report["version"]
    release = load_release(out, report["profile"])
    manifest = release.manifest
    assert manifest.profile.language == "zh"
    assert manifest.profile.inputs["embedder"] == "multilingual"
    assert manifest.embedder.name == "multilingual"
    rows = {r["key"]: r for shard in release.shards for r in shard.rows.to_pylist()}
    for question, answer in ZH_CURATED.items():
        row = rows[key(question)]
        assert row["answer"] == answer  # verbatim
        assert row["question"] in ZH_ASKED  # as people typed it
    # the third, answered by SmolLM2 in 8 tokens (poor Chinese): flagged and held back, or
    # published; either way the release holds nothing else
    generated = key(ZH_ASKED[2])
    assert set(rows) - {key(q) for q in ZH_CURATED} <= {generated}
    excluded = report["build"]["excluded_clusters"]
    assert report["build"]["clusters"] == 2 + (generated in rows)
    assert (generated in rows) == (not excluded), excluded
    if excluded:  # held back for its answer (what generation flagged, or the build's checks)
        assert sum(excluded.values()) == 1 and next(iter(excluded)).startswith("answer_")


def test_a_run_whose_answers_file_was_changed_after_it_was_pinned_publishes_nothing(
    tmp_path: Path,
) -> None:
    from precompute.config import PipelineConfig
    from precompute.pipeline import run_pipeline

    logs, out = FileStore(tmp_path / "logs"), FileStore(tmp_path / "out")
    assert write_logs(logs, _log_rows(ZH_ASKED, 5)) == 15
    answers = tmp_path / "answers.jsonl"
    reviewed = _jsonl(*({"question": q, "answer": a} for q, a in ZH_CURATED.items())) + "\n"
    answers.write_text(reviewed, encoding="utf-8")
    config = PipelineConfig.from_env(
        {"EDGEQA_MIN_USERS": "5", "EDGEQA_CURATED_ANSWERS_SHA256": _sha256(reviewed.encode())},
        answers=str(answers),
    )
    # one answer rewritten in the store after review: a well-formed file the run would publish,
    # signed, if it read it
    answers.write_text(
        reviewed.replace("或致电客服", "或把卡号发到 support-desk.example"), encoding="utf-8"
    )
    params = _zh_run(logs, out, config)
    with pytest.raises(CuratedAnswersError, match="not the pinned"):
        run_pipeline(params)
    assert out.list() == []  # no work area, no release, no pointer
