"""The local demo that ``make demo`` runs: the whole product on the embedded defaults.

1. Sample request logs (``precompute/samplelogs.py``): support questions with paraphrases, Zipf
   popularity over hundreds of users, plus rows the mining rules must exclude (personal data,
   multi-turn, failed requests, one-user questions).
2. The nightly pipeline (``precompute/pipeline.py``, the stages the Airflow DAG runs, quality gate
   included) into a local store.
3. The three serving layers on loopback (``local.py``): a static "CDN" over the store (exact answer
   objects), the edge index service, and the origin (which also serves the web page at ``/``).
4. A client session (``client.py``, the web client's path: CDN exact object -> edge lookup ->
   origin stream), printed as a table: question, tier, latency, answer start; then the
   excluded-question report and where the page is. ``--serve`` keeps the services up.
"""

from __future__ import annotations

import hashlib
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TextIO

import httpx

from base.signing import generate_keypair
from base.store import FileStore
from edgeqa.client import Answered, EdgeQAClient
from edgeqa.local import LocalServer, port_is_free

# an unseen wording of a published Chinese question (cosine 0.994 to 怎么冻结我的银行卡？)
ZH_PARAPHRASE = "如何冻结银行卡"
# what the scripted session asks: hot questions and paraphrases (edge tiers), then novel ones
SESSION = (
    "How do I freeze my card?",  # hot, published: exact at the CDN
    "What are your opening hours?",
    "how can I freeze my debit card",  # a published paraphrase
    "Could you tell me how to freeze my card",  # unseen wording: semantic or generated
    "What is the capital of France?",  # novel: generated at the origin
    "What is the capital of France?",  # asked again: the origin's online cache
    "My card 4111 1111 1111 1111 was declined, why?",  # personal data: never cached
    # Chinese: the zh profile (multilingual-e5-small), its answers the operator's
    "怎么冻结我的银行卡？",  # hot, published: exact at the CDN, from the zh release
    ZH_PARAPHRASE,  # unseen wording: semantic at the edge, from the zh profile
    "密码输错四次会锁卡吗？",  # like a published question but another number: a miss, generated
)
# the Chinese sample logs: every question, asked mostly in its first wording, by enough people
# that most wordings reach k on their own (multilingual-e5 merges only near-identical wordings)
ZH_SAMPLE: dict[str, Any] = {
    "days": 7,
    "users": 200,
    "asks": 900,
    "zipf_s": 0.6,
    "spread_intents": 0,
    "aside_rows": 0,
    "pii_rows": 0,
    "multi_turn_rows": 0,
    "failed_rows": 0,
    "tail_questions": 0,
    "seed": 1,
}
# the demo's users are synthetic: a fixed salt (a deployment sets its own secret); its session
# is one person, so the online cache serves a repeat without waiting for k askers; its releases
# are signed with a key made for this run, and served only with its signature
_SIGNING_KEY, _PUBLIC_KEY = generate_keypair()
DEMO_ENV = {
    "EDGEQA_USER_SALT": "edgeqa-demo-salt",
    "EDGEQA_CACHE_MIN_USERS": "1",
    "EDGEQA_SIGNING_KEY": _SIGNING_KEY,
    "EDGEQA_RELEASE_PUBLIC_KEYS": _PUBLIC_KEY,
}


def _say(out: TextIO, text: str) -> None:
    print(text, file=out, flush=True)


def build_release(
    store: FileStore, out: TextIO, max_tokens: int, quantization: str | None = None
) -> dict[str, dict[str, Any]]:
    """Sample logs (English and Chinese), then the nightly pipeline once per language; the run
    reports by language. ``quantization``: the weights the answers are generated with (None:
    the nightly job's default)."""
    import os

    from precompute.config import PipelineConfig
    from precompute.pipeline import RunParams, run_languages
    from precompute.samplelogs import ZH_INTENTS, curated_answers, generate_rows, write_logs

    until = datetime.now(UTC).date() - timedelta(days=1)
    english = generate_rows(until, days=7)
    chinese = generate_rows(until, questions=ZH_INTENTS, **ZH_SAMPLE)
    write_logs(store, english + chinese)
    _say(
        out,
        f"1. sample request logs: {len(english)} English and {len(chinese)} Chinese rows over "
        f"7 days -> {store.uri}/logs/",
    )
    # the embedded model writes no usable Chinese: the Chinese questions get the operator's
    # answers (precompute/curated.py), as a team serving a language its model cannot would
    answers = store.root / "curated-answers.jsonl"
    data = curated_answers().encode("utf-8")
    answers.write_bytes(data)
    # pinned as a deployment pins the file its operator reviewed (precompute/curated.py)
    pin = {"EDGEQA_CURATED_ANSWERS_SHA256": hashlib.sha256(data).hexdigest()}
    config = PipelineConfig.from_env(
        {**DEMO_ENV, **os.environ, **pin},
        max_tokens=max_tokens,
        quantization=quantization,
        answers=str(answers),
    ).replace(build={"semantic_uncalibrated": True})
    params = RunParams(store.uri, store.uri, until - timedelta(days=6), until, config, "demo")
    _say(out, "2. nightly pipeline (the DAG's stages), once per language profile:")
    _say(
        out,
        "   (a release this small cannot calibrate its semantic tier; the demo serves each "
        "embedder's measured decision, as BuildConfig.semantic_uncalibrated allows)",
    )

    def said(stage: str, result: dict[str, Any], seconds: float) -> None:
        lines = {
            "mine": lambda r: (
                f"{r['questions']} questions to answer ({r.get('curated', 0)} curated), "
                f"profile {r['profile']}; wordings embedded on "
                f"{r['mining'].get('clustering', {}).get('embedded_on') or 'nothing'}"
            ),
            "generate": lambda r: (
                f"{r['answers']} answers ({r['generated']} generated, {r['reused']} taken), "
                f"{r.get('tokens_per_s') or 0} tok/s on {r['ran_on']}"
            ),
            "build": lambda r: (
                f"{r['rows']} phrasings in {r['shards']} shard(s), version {r['version']}"
            ),
            "validate": lambda r: (
                f"{r['status']} (precision {r['precision']}, "
                f"{r.get('empty_answers', 0)} empty answers)"
            ),
            "publish": lambda r: f"{r['status']}: current.json -> {r['version']}",
            "prune": lambda r: f"{len(r['removed'])} old releases removed",
        }
        _say(out, f"   {stage:<9} {lines[stage](result)} ({seconds:.1f} s)")

    from precompute.fleet import disconnect

    try:
        return run_languages(params, ("en", "zh"), on_stage=said)
    finally:
        disconnect()  # the model stages are done: the local Ray they ran on goes


# what CloudFront may read of the bucket (infra/terraform/modules/cdn: the bucket policy)
PUBLIC = (
    r"[A-Za-z0-9_][A-Za-z0-9_.-]*/(current\.json|a/[0-9a-f]{2}/[0-9a-f]{64}\.json"
    r"|releases/[A-Za-z0-9_][A-Za-z0-9_.-]*/k/[0-9a-f]+\.json)"
)


def cdn_app(root: Path) -> Any:
    """The store folder over HTTP, as CloudFront serves the bucket: only what the bucket policy
    lets it read (answer objects, key-index buckets, pointers: ``PUBLIC``; the rest 404s), CORS,
    and ``current.json`` with the ``Cache-Control`` the publisher writes it with on S3 (browsers
    ask again each time)."""
    import os
    import re

    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.middleware.cors import CORSMiddleware
    from starlette.responses import Response
    from starlette.routing import Mount
    from starlette.staticfiles import StaticFiles
    from starlette.types import Scope

    from base.release import POINTER, POINTER_CACHE_CONTROL

    public = re.compile(PUBLIC)

    class Bucket(StaticFiles):
        async def get_response(self, path: str, scope: Scope) -> Response:
            if not public.fullmatch(path.replace(os.sep, "/")):
                return Response(status_code=404)
            return await super().get_response(path, scope)

        def file_response(
            self,
            full_path: str | os.PathLike[str],
            stat_result: os.stat_result,
            scope: Scope,
            status_code: int = 200,
        ) -> Response:
            response = super().file_response(full_path, stat_result, scope, status_code)
            if Path(full_path).name == POINTER:
                response.headers["cache-control"] = POINTER_CACHE_CONTROL
            return response

    return Starlette(
        routes=[Mount("/", Bucket(directory=root))],
        middleware=[Middleware(CORSMiddleware, allow_origins=["*"], allow_methods=["GET"])],
    )


@contextmanager
def services(
    store: FileStore, profiles: dict[str, str], ports: tuple[int, int, int] | None = None
) -> Iterator[dict[str, str]]:
    """The CDN, the edge service and the origin on loopback, serving ``profiles`` (by
    language); their URLs."""
    import os

    from base.logs import open_log_writer
    from base.users import user_hasher
    from edge_index.releases import Releases
    from edge_index.server.app import create_app as edge_app
    from edge_index.watcher import EDGE_METRICS
    from origin.config import OriginSettings
    from origin.runtime import load_runtime
    from origin.server import OriginServer, create_app

    settings = OriginSettings.from_env({**DEMO_ENV, **os.environ}).replace(
        store=store.uri,
        profile=",".join(profiles.values()),
        languages=",".join(profiles),
        poll_s=5.0,
    )
    wanted = ports or (0, 0, 0)
    cdn_port, edge_port, origin_port = (p if p and port_is_free(p) else None for p in wanted)
    with ExitStack() as stack:
        cdn = stack.enter_context(LocalServer(cdn_app(store.root), port=cdn_port))
        # each language's embedder is loaded once in this process, for the edge and the origin
        releases = Releases.from_settings(settings, EDGE_METRICS, store=store)
        releases.start()
        stack.callback(releases.stop)
        edge_logs = open_log_writer(store, "edge", settings)
        users = user_hasher(settings)
        edge = stack.enter_context(
            LocalServer(
                edge_app(releases, edge_logs, users=users, metrics_token=settings.metrics_token),
                port=edge_port,
            )
        )
        settings = settings.replace(cdn_url=cdn.url, edge_url=edge.url)
        server = OriginServer(
            settings,
            lambda: load_runtime(settings),
            open_log_writer(store, "origin", settings),
            users=users,
        )
        origin = stack.enter_context(LocalServer(create_app(server), port=origin_port))
        deadline = time.monotonic() + 120
        while httpx.get(f"{origin.url}/health").status_code != 200:
            if time.monotonic() > deadline:
                raise RuntimeError("the origin did not become ready")
            time.sleep(0.1)
        yield {"cdn": cdn.url, "edge": edge.url, "origin": origin.url}


def _columns(char: str) -> int:
    import unicodedata

    return 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1


def _cell(text: str, width: int) -> str:
    """``text`` cut and padded to ``width`` terminal columns (a CJK character takes two)."""
    out, used = [], 0
    for char in text:
        if used + _columns(char) > width:
            break
        out.append(char)
        used += _columns(char)
    return "".join(out) + " " * (width - used)


def _table(rows: list[Answered], out: TextIO) -> None:
    _say(out, f"   {'question':<48} {'tier':<13} {'source':<7} {'first byte':>11}  answer")
    for r in rows:
        answer = " ".join(r.answer.split())
        cut = sum(_columns(c) for c in answer) > 56
        answer = _cell(answer, 56).rstrip() + ("…" if cut else "")
        ms = r.first_byte_ms
        question = _cell(r.question, 48)
        _say(out, f"   {question} {r.tier:<13} {r.source:<7} {ms:>8.1f} ms  {answer}")


def run_demo(
    workdir: Path = Path("var/demo"),
    serve: bool = False,
    max_tokens: int = 96,
    out: TextIO = sys.stdout,
    quantization: str | None = None,
) -> dict[str, Any]:
    import shutil

    started = time.perf_counter()
    root = workdir.resolve() / "store"
    shutil.rmtree(root, ignore_errors=True)
    store = FileStore(root)
    reports = build_release(store, out, max_tokens, quantization)
    profiles = {language: report["profile"] for language, report in reports.items()}
    result: dict[str, Any] = {**reports["en"], "languages": reports, "profiles": profiles}
    ports = (8002, 8001, 8000) if serve else None
    with services(store, profiles, ports) as urls:
        _say(out, f"3. serving: CDN {urls['cdn']}  edge {urls['edge']}  origin {urls['origin']}")
        _say(out, "4. a client session (CDN exact object -> edge lookup -> origin stream):")
        client = EdgeQAClient(
            urls["origin"],
            urls["cdn"],
            urls["edge"],
            public_keys=(_PUBLIC_KEY,),
            profiles=profiles,
        )
        answered = [client.ask(q) for q in SESSION]
        _table(answered, out)
        excluded = ", ".join(f"{k} {n}" for k, n in sorted(result["excluded_rows"].items()))
        _say(out, f"5. excluded from the release (rows): {excluded}")
        _say(
            out,
            "   personal data and multi-turn rows are never published; below_k: fewer than k "
            "distinct people asked the question, in any wording; rare_tokens: a wording holding "
            "a word fewer than k of them typed (they counted; the text is held back)",
        )
        seconds = time.perf_counter() - started
        _say(out, f"6. the web page: {urls['origin']}/  (demo finished in {seconds:.0f} s)")
        result["session"] = [r.__dict__ for r in answered]
        result["urls"] = urls
        if serve:
            _say(out, "   serving until Ctrl-C")
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                pass
    return result
