"""The local demo that ``make demo`` runs: the whole product on the embedded defaults.

1. Sample request logs (``samplelogs.py``): support questions with paraphrases, Zipf popularity
   over hundreds of users, plus rows the mining rules must exclude (personal data, multi-turn,
   failed requests, one-user questions).
2. The nightly pipeline through the same stages the Airflow DAG runs (``stages.py``): mine,
   generate per partition, build, validate (quality gate), publish, prune, into a local store.
3. The three serving layers on loopback: a static "CDN" over the store (exact answer objects),
   the edge index service, and the origin (which also serves the web page at ``/``).
4. A scripted client session doing what the web client does (exact object at the CDN -> edge
   lookup -> origin stream), printed as a table: question, tier, latency, answer start; then the
   excluded-question report and where the page is. ``--serve`` keeps the services up.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TextIO

import httpx

from edge_index.keys import key
from edge_index.serving import BackgroundServer, port_is_free
from edge_index.store import FileStore

# what the scripted session asks: hot questions and paraphrases (edge tiers), then novel ones
SESSION = (
    "How do I freeze my card?",  # hot, published: exact at the CDN
    "What are your opening hours?",
    "how can I freeze my debit card",  # a published paraphrase
    "Could you tell me how to freeze my card",  # unseen wording: semantic or generated
    "What is the capital of France?",  # novel: generated at the origin
    "What is the capital of France?",  # asked again: the origin's online cache
    "My card 4111 1111 1111 1111 was declined, why?",  # personal data: never cached
)


@dataclass
class Answered:
    question: str
    tier: str
    source: str
    ms: float
    answer: str


def _say(out: TextIO, text: str) -> None:
    print(text, file=out, flush=True)


def build_release(store: FileStore, out: TextIO, max_tokens: int) -> dict[str, Any]:
    """Sample logs, then the DAG's stages one by one; the stage results."""
    from precompute.pipeline import PrecomputeConfig
    from precompute.samplelogs import generate_rows, write_logs
    from precompute.stages import (
        StageParams,
        build_stage,
        generate_stage,
        mine_stage,
        prune_stage,
        publish_stage,
        validate_stage,
    )

    until = datetime.now(UTC).date() - timedelta(days=1)
    rows = generate_rows(until, days=7)
    write_logs(store, rows)
    _say(out, f"1. sample request logs: {len(rows)} rows over 7 days -> {store.uri}/logs/")
    config = PrecomputeConfig.from_env(max_tokens=max_tokens, baseline_sample=0)
    params = StageParams(store.uri, store.uri, until - timedelta(days=6), until, config)
    started = time.perf_counter()
    mined = mine_stage(params)
    profile, run = mined["profile"], mined["run"]
    _say(out, f"2. nightly pipeline (the DAG's stages), profile {profile}:")
    _say(out, f"   mine      {mined['questions']} questions to answer "
              f"({time.perf_counter() - started:.1f} s)")  # fmt: skip
    for partition in mined["partitions"]:
        started = time.perf_counter()
        generated = generate_stage(params, profile, run, partition)
        seconds = time.perf_counter() - started
        _say(out, f"   generate  partition {partition}: {generated['answers']} answers, "
                  f"{generated.get('tokens_per_s', 0)} tok/s ({seconds:.1f} s)")  # fmt: skip
    built = build_stage(params, profile, run)
    _say(out, f"   build     {built['rows']} phrasings in {built['shards']} shard(s), "
              f"version {built['version']}")  # fmt: skip
    validated = validate_stage(params, profile, run)
    _say(out, f"   validate  passed (precision {validated['precision']}, "
              f"{validated['empty_answers']} empty answers)")  # fmt: skip
    published = publish_stage(params, profile, run)
    prune_stage(params, profile)
    _say(out, f"   publish   {published['status']}: {profile}/current.json -> {built['version']}")
    return {"mined": mined, "built": built, "published": published}


def cdn_app(root: Path) -> Any:
    """The store folder over HTTP, as CloudFront serves the bucket (CORS, cache headers)."""
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.middleware.cors import CORSMiddleware
    from starlette.routing import Mount
    from starlette.staticfiles import StaticFiles

    return Starlette(
        routes=[Mount("/", StaticFiles(directory=root))],
        middleware=[Middleware(CORSMiddleware, allow_origins=["*"], allow_methods=["GET"])],
    )


@contextmanager
def services(
    store: FileStore, profile: str, ports: tuple[int, int, int] | None = None
) -> Iterator[dict[str, str]]:
    """The CDN, the edge service and the origin on loopback; their URLs."""
    import dataclasses

    from edge_index.embedder import load_embedder
    from edge_index.logs import LogWriter
    from edge_index.service import EdgeState
    from edge_index.service import create_app as edge_app
    from origin.config import OriginConfig, ServerConfig
    from origin.engine import Engine
    from origin.model import load_model
    from origin.server import OriginServer, Runtime, create_app, served_model_name

    wanted = ports or (0, 0, 0)
    cdn_port, edge_port, origin_port = (p if p and port_is_free(p) else None for p in wanted)
    embedder = load_embedder("embedded")
    with ExitStack() as stack:
        cdn = stack.enter_context(BackgroundServer(cdn_app(store.root), port=cdn_port))
        edge_state = EdgeState(store, profile, embedder, poll_s=5)
        edge_state.start()
        stack.callback(edge_state.stop)
        edge_logs = LogWriter(store, source="edge")
        edge = stack.enter_context(
            BackgroundServer(edge_app(edge_state, edge_logs), port=edge_port)
        )
        settings = OriginConfig.from_env()
        model, tokenizer = load_model(settings.model, settings.device, settings.dtype)
        engine = Engine(model, tokenizer, settings.engine_config(str(model.device)))
        config = dataclasses.replace(
            ServerConfig.from_env(), store_uri=store.uri, profile=profile, poll_s=5.0,
            cdn_url=cdn.url, edge_url=edge.url,
        )  # fmt: skip
        releases = EdgeState(store, profile, embedder, poll_s=5)
        server = OriginServer(
            config, lambda: Runtime(engine.start(), settings.max_tokens, 0.0, releases),
            served_model_name(config, settings.model), LogWriter(store, source="origin"),
        )  # fmt: skip
        origin = stack.enter_context(BackgroundServer(create_app(server), port=origin_port))
        deadline = time.monotonic() + 120
        while httpx.get(f"{origin.url}/health").status_code != 200:
            if time.monotonic() > deadline:
                raise RuntimeError("the origin did not become ready")
            time.sleep(0.1)
        yield {"cdn": cdn.url, "edge": edge.url, "origin": origin.url}


def ask(urls: dict[str, str], profile: str, question: str, client: httpx.Client) -> Answered:
    """The web client's tiered lookup (web/edgeqa.js), in Python."""
    started = time.perf_counter()
    pointer = client.get(f"{urls['cdn']}/{profile}/current.json")
    if pointer.status_code == 200:
        version = pointer.json()["version"]
        found = client.get(f"{urls['cdn']}/{profile}/releases/{version}/a/{key(question)}.json")
        if found.status_code == 200:
            ms = (time.perf_counter() - started) * 1000
            return Answered(question, "exact", "cdn", ms, found.json()["answer"])
    lookup = client.get(f"{urls['edge']}/v1/lookup", params={"q": question})
    if lookup.status_code == 200:
        ms = (time.perf_counter() - started) * 1000
        return Answered(question, lookup.json()["tier"], "edge", ms, lookup.json()["answer"])
    body = {"messages": [{"role": "user", "content": question}], "stream": True}
    text, first = "", None
    with client.stream("POST", f"{urls['origin']}/v1/chat/completions", json=body) as response:
        tier = response.headers.get("x-edgeqa-tier", "generated")
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            delta = json.loads(line[6:])["choices"]
            if delta and delta[0]["delta"].get("content"):
                first = first or time.perf_counter()
                text += delta[0]["delta"]["content"]
    ms = ((first or time.perf_counter()) - started) * 1000
    return Answered(question, tier, "origin", ms, text)


def _table(rows: list[Answered], out: TextIO) -> None:
    _say(out, f"   {'question':<48} {'tier':<13} {'source':<7} {'first byte':>11}  answer")
    for r in rows:
        answer = " ".join(r.answer.split())
        answer = answer[:56] + ("…" if len(answer) > 56 else "")
        _say(out, f"   {r.question[:48]:<48} {r.tier:<13} {r.source:<7} {r.ms:>8.1f} ms  {answer}")


def run_demo(
    workdir: Path = Path("var/demo"),
    serve: bool = False,
    max_tokens: int = 96,
    out: TextIO = sys.stdout,
) -> dict[str, Any]:
    import os

    # the demo's users are synthetic: a fixed salt (a deployment sets its own secret)
    os.environ.setdefault("EDGEQA_USER_SALT", "edgeqa-demo-salt")
    started = time.perf_counter()
    root = workdir.resolve() / "store"
    shutil.rmtree(root, ignore_errors=True)
    store = FileStore(root)
    result = build_release(store, out, max_tokens)
    profile = result["mined"]["profile"]
    ports = (8002, 8001, 8000) if serve else None
    with services(store, profile, ports) as urls, httpx.Client(timeout=120) as client:
        _say(out, f"3. serving: CDN {urls['cdn']}  edge {urls['edge']}  origin {urls['origin']}")
        _say(out, "4. a client session (CDN exact object -> edge lookup -> origin stream):")
        answered = [ask(urls, profile, q, client) for q in SESSION]
        _table(answered, out)
        excluded = result["mined"]["excluded_rows"]
        _say(out, "5. excluded from the release (rows): " + ", ".join(
            f"{reason} {count}" for reason, count in sorted(excluded.items())))  # fmt: skip
        _say(out, "   personal data and multi-turn rows are never published; below_k: fewer "
                  "than k distinct users asked")  # fmt: skip
        _say(out, f"6. the web page: {urls['origin']}/  (demo finished in "
                  f"{time.perf_counter() - started:.0f} s)")  # fmt: skip
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
