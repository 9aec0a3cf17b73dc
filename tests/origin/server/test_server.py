"""The origin server over real HTTP on loopback, with the embedded model and a real release.

One server (module scope) serves most tests; a test that needs other settings swaps
``origin.server.settings`` and puts it back.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from starlette.requests import Request
from starlette.testclient import TestClient

from base.keys import key_of_normalized, normalize
from base.logreader import read_logs
from base.logs import LogWriter
from base.store import FileStore
from base.users import mint_user_token
from edge_index.lookup import ReleaseIndex
from edge_index.releases import Releases
from edge_index.watcher import ORIGIN_METRICS, ReleaseWatcher
from origin.config import OriginSettings
from origin.engine import Engine, EngineConfig
from origin.engine.scheduler import SHARED_PREFIX_MIN
from origin.runtime import Runtime
from origin.server import OriginServer, create_app, prompts
from origin.server.tiers import scoped_key
from policy.answers import CACHE_SKIP_REASONS, uncacheable
from precompute.publish import publish
from tests.releases import PROFILE, QUESTIONS, build
from tests.serving import Server, free_port, wait_healthy

MODEL = "SmolLM2-135M-Instruct"
VLLM_BENCH = Path(__file__).parents[2] / "third_party" / "vllm_benchmarks"
NOVEL = "Why do leaves change colour in autumn?"


IDENTITY_SECRET = "i" * 40


# each signed test user asks from a /24 of its own, as people do: the online cache's k counts
# networks too (the test client is on loopback, a trusted proxy here, and forwards the address)
_NETWORKS: dict[str, int] = {}


def _as(user: str, **headers: str) -> dict[str, str]:
    network = _NETWORKS.setdefault(user, len(_NETWORKS) + 1)
    return {
        "x-edgeqa-user": mint_user_token(user, IDENTITY_SECRET),
        "x-forwarded-for": f"198.18.{network}.1",
        **headers,
    }


@dataclass
class Origin:
    url: str
    server: OriginServer
    engine: Engine
    store: FileStore

    def client(self, **kw: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, **{"timeout": 120, **kw})


def _config(store: FileStore, **env: str) -> OriginSettings:
    return OriginSettings.from_env(
        {
            "EDGEQA_STORE": store.uri,
            "EDGEQA_IDENTITY_SECRET": IDENTITY_SECRET,
            "EDGEQA_CACHE_MIN_USERS": "2",
            # one test client stands for many users: the per-asker shares are tested on their own
            "EDGEQA_MAX_IN_FLIGHT_PER_USER": "0",
            "EDGEQA_MAX_IN_FLIGHT_PER_NETWORK": "0",
            "EDGEQA_MAX_TOKENS_PER_MINUTE_PER_USER": "0",
            "EDGEQA_MAX_QUEUED_REQUESTS": "256",
            "EDGEQA_TRUSTED_PROXIES": "127.0.0.1/32",
            "EDGEQA_MAX_QUEUED_TOKENS": "100000",
            **env,
        }
    )


@pytest.fixture(scope="module")
def origin(embedded_model, embedder, tmp_path_factory) -> Iterator[Origin]:  # type: ignore[no-untyped-def]
    model, tokenizer = embedded_model
    tmp = tmp_path_factory.mktemp("origin")
    store = FileStore(tmp / "store")
    build(embedder, tmp / "v1", store, tag="v1", now=datetime(2026, 11, 20, tzinfo=UTC))
    publish(store, tmp / "v1")
    engine = Engine(
        model, tokenizer, EngineConfig(max_num_seqs=8, max_model_len=512, speculative="suffix")
    ).start()
    # as origin.runtime.load_runtime builds it
    releases = Releases.of(
        ReleaseWatcher(store, PROFILE, embedder, poll_s=3600, metrics_prefix=ORIGIN_METRICS)
    )
    logs = LogWriter(store, source="origin", flush_interval_s=3600)
    server = OriginServer(_config(store), lambda: Runtime(engine, 48, 0.0, releases), logs)
    with Server(create_app(server)) as running:
        wait_healthy(running.url)
        yield Origin(running.url, server, engine, store)


def _chat(question: str, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": question}], **extra}


def _events(response: httpx.Response) -> list[Any]:
    """The JSON payloads of an SSE body, and "[DONE]"."""
    out: list[Any] = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            data = line[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


# -- the API with the official client -------------------------------------------------------------


def test_openai_client_chat_and_completions(origin: Origin) -> None:
    client = openai.OpenAI(base_url=f"{origin.url}/v1", api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list().data] == [MODEL]
    messages: Any = [{"role": "user", "content": [{"type": "text", "text": "Name a fruit."}]}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=24)
    text = whole.choices[0].message.content
    assert text and whole.choices[0].finish_reason in ("stop", "length")
    assert whole.usage is not None and whole.usage.completion_tokens > 0
    parts, usage = [], None
    for chunk in client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_completion_tokens=24,
        stream=True,
        stream_options={"include_usage": True},
        temperature=0.0,
        top_p=1.0,
        seed=3,
    ):
        if chunk.choices:
            parts.append(chunk.choices[0].delta.content or "")
        if chunk.usage is not None:
            usage = chunk.usage
    assert "".join(parts) == text  # greedy: streaming and not streaming agree
    assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens

    done = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=8)
    pieces = [
        c.choices[0].text
        for c in client.completions.create(
            model=MODEL, prompt="The capital of France is", max_tokens=8, stream=True
        )
        if c.choices
    ]
    assert done.choices[0].text and "".join(pieces) == done.choices[0].text
    # token ids as the prompt, a stop string, and tolerated extras
    ids = origin.engine.tokenizer.encode("The capital of France is")
    stopped = client.completions.create(
        model=MODEL,
        prompt=ids,
        max_tokens=8,
        stop=["."],
        best_of=1,
        extra_body={"ignore_eos": False, "logprobs": None},
    )
    assert "." not in stopped.choices[0].text


def test_sse_format(origin: Origin) -> None:
    with (
        origin.client() as client,
        client.stream(
            "POST",
            "/v1/chat/completions",
            json=_chat(
                "Say hello.", max_tokens=8, stream=True, stream_options={"include_usage": True}
            ),
        ) as response,
    ):
        assert response.headers["content-type"].startswith("text/event-stream")
        events = _events(response)
    assert events[-1] == "[DONE]"
    first, finish, usage = events[0], events[-3], events[-2]
    assert first["object"] == "chat.completion.chunk"
    assert first["choices"][0]["delta"]["role"] == "assistant"
    assert finish["choices"][0]["finish_reason"] in ("stop", "length")
    assert usage["choices"] == [] and usage["usage"]["total_tokens"] > 0


# -- tiers ----------------------------------------------------------------------------------------


def test_release_tiers_online_cache_and_what_never_caches(origin: Origin) -> None:
    with origin.client() as client:
        exact = client.post("/v1/chat/completions", json=_chat("how do I freeze my CARD?"))
        assert exact.headers["x-edgeqa-tier"] == "exact"
        assert exact.json()["choices"][0]["message"]["content"] == f"v1: answer to {QUESTIONS[0]}"
        semantic = client.post("/v1/chat/completions", json=_chat("how can I freeze my card"))
        assert semantic.headers["x-edgeqa-tier"] == "semantic"
        assert (
            semantic.json()["choices"][0]["message"]["content"] == f"v1: answer to {QUESTIONS[0]}"
        )
        cut = client.post("/v1/chat/completions", json=_chat(QUESTIONS[0], max_tokens=2)).json()
        assert cut["choices"][0]["finish_reason"] == "length"
        assert cut["usage"]["completion_tokens"] == 2

        with client.stream(
            "POST", "/v1/chat/completions", json=_chat(QUESTIONS[1], stream=True)
        ) as response:
            assert response.headers["x-edgeqa-tier"] == "exact"
            events = _events(response)
        assert events[-1] == "[DONE]"
        text = "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1])
        assert text == f"v1: answer to {QUESTIONS[1]}"

        # the online cache serves an answer once 2 (EDGEQA_CACHE_MIN_USERS) people of one tenant
        # asked for it, never to another tenant
        novel, reworded = _chat(NOVEL, max_tokens=24), _chat(f"  {NOVEL.lower()}", max_tokens=24)
        first = client.post("/v1/chat/completions", json=novel, headers=_as("ann"))
        same = client.post("/v1/chat/completions", json=reworded, headers=_as("ann"))
        elsewhere = client.post(
            "/v1/chat/completions", json=novel, headers=_as("bob", **{"x-edgeqa-tenant": "acme"})
        )
        again = client.post("/v1/chat/completions", json=reworded, headers=_as("bob"))
        assert first.headers["x-edgeqa-tier"] == "generated"
        content = first.json()["choices"][0]["message"]["content"]
        assert same.headers["x-edgeqa-tier"] == "generated"  # one asker so far
        assert elsewhere.headers["x-edgeqa-tier"] == "generated"  # another tenant's cache
        finish = first.json()["choices"][0]["finish_reason"]
        if finish == "stop" and uncacheable(NOVEL, content, finish) is None:
            assert again.headers["x-edgeqa-tier"] == "origin_cache"
            assert again.json()["choices"][0]["message"]["content"] == content
        else:  # a cut or degenerate answer is not cached
            assert again.headers["x-edgeqa-tier"] == "generated"
        # browsers are not told the tier (with the timing, it says someone asked lately)
        seen = client.post("/v1/chat/completions", json=novel, headers={"origin": "https://x.test"})
        assert "x-edgeqa-tier" not in seen.headers.get("access-control-expose-headers", "")

        never = [
            _chat(QUESTIONS[0], temperature=0.8, seed=1),  # non-default sampling
            _chat(QUESTIONS[0], stop=["x"]),
            {
                "model": MODEL,
                "messages": [  # multi-turn
                    {"role": "user", "content": "Hi"},
                    {"role": "assistant", "content": "Hello!"},
                    {"role": "user", "content": QUESTIONS[0]},
                ],
                "max_tokens": 8,
            },
            _chat(f"{QUESTIONS[0]} My email is jo@example.com", max_tokens=8),  # personal data
            {
                "model": MODEL,
                "max_tokens": 8,
                "messages": [  # other instructions
                    {"role": "system", "content": "Answer in French."},
                    {"role": "user", "content": QUESTIONS[0]},
                ],
            },
        ]
        for body in never:
            for _ in range(2):  # the second time would hit a cache if the first had written it
                response = client.post("/v1/chat/completions", json={**body, "max_tokens": 8})
                assert response.status_code == 200
                assert response.headers["x-edgeqa-tier"] == "generated", body
        # completions never use the tiers
        plain = client.post("/v1/completions", json={"prompt": QUESTIONS[0], "max_tokens": 4})
        assert plain.headers["x-edgeqa-tier"] == "generated"


# -- validation and limits ------------------------------------------------------------------------


def test_validation_errors_name_the_field_and_others_keep_working(origin: Origin) -> None:
    hi = [{"role": "user", "content": "hi"}]
    cases: list[tuple[Any, int, str | None]] = [
        (b"{", 400, "body"),
        (b"[1, 2]", 400, "body"),
        ({"model": MODEL}, 400, "messages"),
        ({"messages": []}, 400, "messages"),
        ({"messages": "hi"}, 400, "messages"),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages[0].role"),
        ({"messages": [{"role": "user"}]}, 400, "messages[0].content"),
        ({"messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            400,
            "messages[0].content[0]",
        ),
        ({"messages": hi, "temperature": -0.5}, 400, "temperature"),
        ({"messages": hi, "temperature": "hot"}, 400, "temperature"),
        (
            b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
            400,
            "temperature",
        ),
        ({"messages": hi, "top_p": 0}, 400, "top_p"),
        ({"messages": hi, "max_tokens": 0}, 400, "max_tokens"),
        ({"messages": hi, "max_tokens": 10**9}, 400, "max_tokens"),
        ({"messages": hi, "max_tokens": "5"}, 400, "max_tokens"),
        ({"messages": hi, "max_completion_tokens": 500}, 400, "max_completion_tokens"),
        ({"messages": hi, "stop": [""]}, 400, "stop"),
        ({"messages": hi, "n": 2}, 400, "n"),
        ({"messages": hi, "stream": "yes"}, 400, "stream"),
        ({"messages": hi, "logprobs": True}, 400, "logprobs"),
        ({"messages": [{"role": "user", "content": "word " * 600}]}, 400, "messages"),
        ({"messages": hi, "model": "gpt-4"}, 404, "model"),
        (b"[" * 200_000 + b"]" * 200_000, 400, "body"),  # nested past Python's recursion limit
    ]
    with origin.client() as client:
        for body, status, param in cases:
            raw = body if isinstance(body, bytes) else json.dumps(body).encode()
            response = client.post(
                "/v1/chat/completions", content=raw, headers={"content-type": "application/json"}
            )
            assert response.status_code == status, (str(body)[:200], response.text)
            error = response.json()["error"]
            assert error["param"] == param and error["message"] and error["type"], body
        # more text than any context could hold: refused before the tokenizer sees it
        huge = {"messages": [{"role": "user", "content": "x" * 900_000}]}
        refused = client.post("/v1/chat/completions", json=huge).json()["error"]
        assert refused["param"] == "messages" and refused["code"] == "context_length_exceeded"
        assert "characters" in refused["message"]
        bad_prompts = [
            {"prompt": ""},
            {"prompt": ["a", "b"]},
            {"prompt": [-1]},
            {"prompt": [10**7]},
        ]
        for body in bad_prompts:
            response = client.post("/v1/completions", json=body)
            assert response.status_code == 400 and response.json()["error"]["param"] == "prompt"
        big = client.post(
            "/v1/chat/completions",
            content=b" " * (2 << 20),
            headers={"content-type": "application/json"},
        )
        assert big.status_code == 413 and big.json()["error"]["param"] == "body"
        assert client.get("/v1/nothing").status_code == 404
        assert client.get("/v1/chat/completions").status_code == 405
        ok = client.post("/v1/chat/completions", json=_chat("Say yes.", max_tokens=4))
        assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"]
    assert origin.engine.alive


def test_a_value_python_cannot_hold_or_encode_is_a_400_naming_its_field(origin: Origin) -> None:
    """An integer past Python's 4300-digit conversion limit and a lone surrogate (no UTF-8 form)
    are valid JSON: each is refused with a 400 naming its field, never a 500."""
    huge = "9" * 5000
    hi = '[{"role": "user", "content": "hi"}]'
    chat, completion = "/v1/chat/completions", "/v1/completions"
    cases = [
        (chat, f'{{"messages": {hi}, "max_tokens": {huge}}}', "max_tokens"),
        (chat, f'{{"messages": {hi}, "seed": -{huge}}}', "seed"),
        (chat, f'{{"messages": {hi}, "temperature": {huge}}}', "temperature"),
        (completion, f'{{"prompt": "hi", "max_tokens": {huge}}}', "max_tokens"),
        (completion, f'{{"prompt": [1, {huge}]}}', "prompt[1]"),
        (chat, f'{{"messages": {hi}, "user": "\\ud800"}}', "user"),
        (chat, f'{{"messages": {hi}, "user": "a\\udfffb"}}', "user"),
        (chat, '{"messages": [{"role": "user", "content": "x\\ud800"}]}', "messages[0].content"),
        (chat, f'{{"messages": {hi}, "stop": ["ok", "\\udc00"]}}', "stop[1]"),
    ]
    with origin.client() as client:
        for path, raw, param in cases:
            response = client.post(path, content=raw, headers={"content-type": "application/json"})
            assert response.status_code == 400, (raw[-60:], response.text[:200])
            error = response.json()["error"]
            assert error["param"] == param and error["type"] == "invalid_request_error", raw[-60:]
        # the surrogate's own bytes (json reads bytes with "surrogatepass"), not an escape
        raw = b'{"messages": ' + hi.encode() + b', "user": "\xed\xa0\x80"}'
        response = client.post(chat, content=raw, headers={"content-type": "application/json"})
        assert response.status_code == 400 and response.json()["error"]["param"] == "user"
        # an escaped pair is one character, not a lone half
        paired = f'{{"messages": {hi}, "user": "\\ud83d\\ude00", "max_tokens": 1}}'
        response = client.post(chat, content=paired, headers={"content-type": "application/json"})
        assert response.status_code == 200, response.text
    assert origin.engine.alive


# -- auth -----------------------------------------------------------------------------------------


def test_api_keys(origin: Origin) -> None:
    key = "k" * 24
    saved = origin.server.settings
    origin.server.settings = saved.replace(api_keys=("another-key-0123456789", key))
    try:
        with origin.client() as client:
            assert client.get("/v1/models").status_code == 401
            denied = client.post("/v1/chat/completions", json=_chat("hi"))
            assert denied.status_code == 401 and denied.json()["error"]["type"]
            wrong = client.get("/v1/models", headers={"authorization": f"Bearer {key[:-1]}x"})
            assert wrong.status_code == 401
            assert client.get("/v1/models", headers={"authorization": f"Bearer {key}"}).is_success
            assert client.get("/v1/models", headers={"x-api-key": key}).is_success
            assert client.get("/health").status_code == 200  # open
        sdk = openai.OpenAI(base_url=f"{origin.url}/v1", api_key=key, max_retries=0)
        assert sdk.chat.completions.create(
            model=MODEL, messages=_chat("hi")["messages"], max_tokens=2
        ).choices
    finally:
        origin.server.settings = saved


def test_metrics_behind_a_bearer_token(origin: Origin) -> None:
    token = "m" * 24
    saved = origin.server.settings
    origin.server.settings = saved.replace(metrics_token=token)
    try:
        with origin.client() as client:
            refused = client.get("/metrics")
            assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
            assert refused.json()["error"]["type"] == "authentication_error"
            wrong = client.get("/metrics", headers={"authorization": f"Bearer {token[:-1]}x"})
            assert wrong.status_code == 401
            # what Prometheus sends (scrape_config's authorization), and only that
            assert client.get("/metrics", headers={"x-api-key": token}).status_code == 401
            scraped = client.get("/metrics", headers={"authorization": f"Bearer {token}"})
            assert scraped.status_code == 200 and "vllm:num_requests_running" in scraped.text
            assert client.get("/health").status_code == 200  # load balancers need no token
    finally:
        origin.server.settings = saved
    # without a token, /metrics answers this machine only
    assert _from(origin, "203.0.113.9").get("/metrics").status_code == 403
    assert _from(origin, "127.0.0.1").get("/metrics").status_code == 200


# -- backpressure, cancellation, timeouts ---------------------------------------------------------


async def _stream_until_first_token(url: str, body: dict[str, Any]) -> int:
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                return response.status_code
            async for line in response.aiter_lines():
                if '"content": "' in line and '"content": ""' not in line:
                    return 200  # leave mid-generation: the connection closes here
    return 200


def _idle(engine: Engine, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if engine.num_running == 0 and engine.num_waiting == 0:
            return
        time.sleep(0.05)
    raise AssertionError(f"engine still busy: {engine.metrics()}")


def test_200_cancelled_streams_free_every_slot(origin: Origin) -> None:
    engine = origin.engine
    _idle(engine)
    kv_before = engine.scheduler.kv_tokens_used
    finished_before = dict(engine.stats.requests_finished)

    async def main() -> list[int]:
        bodies = [
            _chat(f"Tell me a long story about number {i}.", max_tokens=200, stream=True)
            for i in range(200)
        ]
        return await asyncio.gather(*(_stream_until_first_token(origin.url, b) for b in bodies))

    statuses = asyncio.run(main())
    assert statuses == [200] * 200
    _idle(engine)
    assert engine.scheduler.kv_tokens_used == kv_before == 0
    assert engine.runner.cache.used_slots == []
    assert engine.queue_load() == (0, 0)
    aborted = engine.stats.requests_finished.get("abort", 0) - finished_before.get("abort", 0)
    assert aborted >= 190  # the few that finished first are not cancellations


def test_a_non_streaming_client_that_leaves_is_cancelled(origin: Origin) -> None:
    engine = origin.engine
    _idle(engine)
    before = engine.stats.requests_finished.get("abort", 0)
    with pytest.raises(httpx.ReadTimeout), origin.client(timeout=1.0) as client:
        client.post(
            "/v1/chat/completions",
            json=_chat("Write a long essay.", max_tokens=400, ignore_eos=True),
        )
    _idle(engine, timeout=30)
    assert engine.stats.requests_finished.get("abort", 0) == before + 1


def test_prompt_prefixes_are_shared_within_a_tenant_only(origin: Origin) -> None:
    """A request starts from KV prefixes its own tenant (API key and x-edgeqa-tenant) computed,
    never another's: its sooner first token would tell it that someone sent a prompt beginning
    like its own. EDGEQA_PREFIX_CACHING_SCOPE=global shares them between tenants again."""
    scheduler = origin.engine.scheduler
    body = {
        "model": MODEL,
        "prompt": "Write one sentence about a lighthouse keeper who counted every passing ship.",
        "max_tokens": 2,
    }

    def shared(tenant: str) -> int:
        """Prompt tokens the tenant's request started from instead of computing them."""
        before = scheduler.prefix_tokens_shared
        with origin.client() as client:
            response = client.post(
                "/v1/completions", json=body, headers={"x-edgeqa-tenant": tenant}
            )
        assert response.status_code == 200, response.text
        return scheduler.prefix_tokens_shared - before

    assert shared("ann-co") == 0
    assert shared("ann-co") >= SHARED_PREFIX_MIN  # its tenant's prompt, kept in a free slot
    assert shared("bob-co") == 0  # the same prompt from another tenant: computed
    saved = origin.server.settings
    origin.server.settings = saved.replace(prefix_caching_scope="global")
    try:
        shared("cy-co")
        assert shared("dee-co") >= SHARED_PREFIX_MIN
    finally:
        origin.server.settings = saved


def test_backpressure_answers_429_and_admitted_requests_finish(origin: Origin) -> None:
    saved = origin.server.settings
    origin.server.settings = saved.replace(max_queued_requests=2)
    try:

        async def one(client: httpx.AsyncClient, i: int) -> tuple[int, str | None, str]:
            body = _chat(f"Count to {i + 10}.", max_tokens=32, ignore_eos=True, stream=True)
            async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                text = "".join([line async for line in response.aiter_lines()])
                return response.status_code, response.headers.get("retry-after"), text

        async def main() -> list[tuple[int, str | None, str]]:
            async with httpx.AsyncClient(base_url=origin.url, timeout=120) as client:
                return await asyncio.gather(*(one(client, i) for i in range(30)))

        results = asyncio.run(main())
    finally:
        origin.server.settings = saved
    rejected = [r for r in results if r[0] == 429]
    admitted = [r for r in results if r[0] == 200]
    assert rejected and admitted and len(rejected) + len(admitted) == 30
    assert all(r[1] and int(r[1]) >= 1 for r in rejected)
    assert all("rate_limit_exceeded" in r[2] for r in rejected)
    assert all(r[2].endswith("data: [DONE]") for r in admitted)


def test_one_key_flooding_leaves_another_key_its_share(origin: Origin) -> None:
    """Per asker (here, an API key): at most 2 generations in flight and 600 tokens a minute
    (prompt + max_tokens, charged at admission). A flood from key A is refused past its share,
    with the reason; key B, asking in the middle of the flood, is served."""
    flood, calm = "a" * 24, "b" * 24
    saved = origin.server.settings
    origin.server.settings = saved.replace(
        api_keys=(flood, calm), max_in_flight_per_user=2, max_tokens_per_minute_per_user=600
    )
    try:

        async def one(client: httpx.AsyncClient, key: str, i: int) -> tuple[int, str]:
            body = _chat(f"Count to {i + 10}.", max_tokens=48, ignore_eos=True, stream=True)
            headers = {"authorization": f"Bearer {key}"}
            async with client.stream(
                "POST", "/v1/chat/completions", json=body, headers=headers
            ) as response:
                return response.status_code, "".join([x async for x in response.aiter_lines()])

        async def main() -> tuple[list[tuple[int, str]], tuple[int, str]]:
            async with httpx.AsyncClient(base_url=origin.url, timeout=120) as client:
                flooding = [asyncio.create_task(one(client, flood, i)) for i in range(12)]
                await asyncio.sleep(0)
                served = await one(client, calm, 99)
                return await asyncio.gather(*flooding), served

        flooded, served = asyncio.run(main())
    finally:
        origin.server.settings = saved
    assert served[0] == 200 and served[1].endswith("data: [DONE]")
    refused = [text for status, text in flooded if status == 429]
    assert 0 < len(refused) <= 10 and sum(status == 200 for status, _ in flooded) >= 2
    assert any('"user_limit"' in text for text in refused) or any(
        '"user_tokens"' in text for text in refused
    )
    # the minute's token budget: once spent, refused with the seconds to wait, whatever in flight
    origin.server.settings = saved.replace(
        api_keys=(flood, calm), max_in_flight_per_user=0, max_tokens_per_minute_per_user=600
    )
    try:
        with origin.client(headers={"authorization": f"Bearer {calm}"}) as client:
            body = _chat("Count to five.", max_tokens=200)
            statuses = [client.post("/v1/chat/completions", json=body) for _ in range(4)]
    finally:
        origin.server.settings = saved
    over = statuses[-1]
    assert statuses[0].status_code == 200 and over.status_code == 429
    assert over.json()["error"]["code"] == "user_tokens" and int(over.headers["retry-after"]) >= 1


def _from(origin: Origin, peer: str) -> TestClient:
    """The origin's real app, its requests arriving from ``peer`` (no lifespan: the fixture's
    server is running)."""
    return TestClient(create_app(origin.server), client=(peer, 5000))


def test_one_ipv6_host_is_one_asker_for_shares_and_the_cache(origin: Origin) -> None:
    """A host is routed a whole /64 and may use any address in it: two of them are one asker
    for the per-asker shares and toward the online cache's k; two /64s are two askers for the
    shares, but toward the cache's k only from two /48s (k counts networks too, as mining does)."""
    host, same_host, other_host = "2001:db8:6:1::1", "2001:db8:6:1::2", "2001:db8:6:2::1"
    other_network = "2001:db8:7:1::1"
    tenant = {"x-edgeqa-tenant": "ipv6-askers"}  # a cache scope of this test's own
    # shares: a minute's token budget that one request spends alone
    saved = origin.server.settings
    origin.server.settings = saved.replace(
        max_in_flight_per_user=0, max_tokens_per_minute_per_user=1
    )
    try:
        body = _chat("Count to three.", max_tokens=4)
        first = _from(origin, host).post("/v1/chat/completions", json=body, headers=tenant)
        again = _from(origin, same_host).post("/v1/chat/completions", json=body, headers=tenant)
        other = _from(origin, other_host).post("/v1/chat/completions", json=body, headers=tenant)
    finally:
        origin.server.settings = saved
    assert first.status_code == 200 and other.status_code == 200
    assert again.status_code == 429 and again.json()["error"]["code"] == "user_tokens"
    # the cache's k (EDGEQA_CACHE_MIN_USERS, 2 here): an answer cached for the first address (as
    # its generated answer would be), asked for from another address of its /64, then another /64
    question = "What makes a rainbow appear after rain?"
    peer = Request(
        {
            "type": "http",
            "headers": [(b"x-edgeqa-tenant", tenant["x-edgeqa-tenant"].encode())],
            "client": (host, 5000),
            "method": "POST",
        }
    )
    scope = origin.server.users.tenant(peer)  # the tenant as the origin keeps it: hashed
    key = scoped_key(key_of_normalized(normalize(question)), None, scope)
    asker = origin.server.users.of_request(peer)
    cached = origin.server.cache.put(
        key, "Sunlight through raindrops.", 5, asker=asker.user, network=asker.network
    )
    assert cached
    body = _chat(question, max_tokens=4)
    held = _from(origin, same_host).post("/v1/chat/completions", json=body, headers=tenant)
    same_48 = _from(origin, other_host).post("/v1/chat/completions", json=body, headers=tenant)
    served = _from(origin, other_network).post("/v1/chat/completions", json=body, headers=tenant)
    assert held.headers["x-edgeqa-tier"] == "generated"  # still one asker
    assert same_48.headers["x-edgeqa-tier"] == "generated"  # two askers, one network
    assert served.headers["x-edgeqa-tier"] == "origin_cache"


@contextlib.contextmanager
def _tokenizer_busy() -> Iterator[None]:
    """The server's tokenizer taken, as a long prompt being tokenized takes it: no prompt is
    tokenized until the block ends."""
    prompts._TOKENIZING.acquire()
    try:
        yield
    finally:
        prompts._TOKENIZING.release()


async def _first_done(
    tasks: list[asyncio.Task[httpx.Response]], count: int
) -> list[httpx.Response]:
    """The responses of the first ``count`` of ``tasks`` to finish (fewer after a minute: the
    test then fails on the count instead of hanging)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    done: set[asyncio.Task[httpx.Response]] = set()
    pending = set(tasks)
    while len(done) < count and pending and loop.time() < deadline:
        finished, pending = await asyncio.wait(
            pending, timeout=deadline - loop.time(), return_when=asyncio.FIRST_COMPLETED
        )
        done |= finished
    return [task.result() for task in done]


def test_prompts_waiting_for_the_tokenizer_count_in_their_askers_share(origin: Origin) -> None:
    """A request counts in its asker's share from before its prompt is tokenized. With the
    tokenizer busy, one asker sends six long prompts at once: the four past its share (2) are
    refused while the tokenizer is still busy (429 ``user_limit``, ``Retry-After``, the JSON
    error), so another asker's short prompt waits behind two of them at most, and is answered."""
    saved = origin.server.settings
    origin.server.settings = saved.replace(max_in_flight_per_user=2)
    long = "The quick brown fox jumps over the lazy dog. " * 30  # 330 tokens with the template
    bodies = [_chat(f"{long}{i}", max_tokens=2) for i in range(6)]

    async def ask(client: httpx.AsyncClient, body: dict[str, Any], user: str) -> httpx.Response:
        return await client.post("/v1/chat/completions", json=body, headers=_as(user))

    async def main() -> tuple[list[httpx.Response], list[httpx.Response], httpx.Response]:
        async with httpx.AsyncClient(base_url=origin.url, timeout=120) as client:
            with _tokenizer_busy():
                flood = [asyncio.create_task(ask(client, body, "flooder")) for body in bodies]
                early = await _first_done(flood, 4)
                calm = asyncio.create_task(ask(client, _chat("Say yes.", max_tokens=2), "calm"))
            return early, await asyncio.gather(*flood), await calm

    try:
        early, flood, calm = asyncio.run(main())
        with origin.client() as client:  # the refused held nothing: the share is whole again
            again = client.post("/v1/chat/completions", json=bodies[0], headers=_as("flooder"))
    finally:
        origin.server.settings = saved
    assert [r.status_code for r in early] == [429] * 4
    for response in early:
        assert response.json()["error"]["code"] == "user_limit"
        assert int(response.headers["retry-after"]) >= 1
    assert sorted(r.status_code for r in flood) == [200, 200, 429, 429, 429, 429]
    assert calm.status_code == 200 and again.status_code == 200


def test_a_prompt_longer_than_its_context_takes_is_refused_before_tokenizing(
    origin: Origin,
) -> None:
    """At most 8 characters a token of the context (4,096 for these 512 tokens; the longest
    token has 81): a longer prompt is refused while the tokenizer is busy, never waiting for it."""
    words = "word " * 1000  # 5,000 characters
    with _tokenizer_busy(), origin.client(timeout=60) as client:
        chat = client.post("/v1/chat/completions", json=_chat(words))
        completion = client.post("/v1/completions", json={"prompt": words, "max_tokens": 4})
    for response, field in ((chat, "messages"), (completion, "prompt")):
        assert response.status_code == 400
        error = response.json()["error"]
        assert error["param"] == field and error["code"] == "context_length_exceeded"
        assert "at most 4096" in error["message"]


def test_refusals_are_charged_to_their_asker(origin: Origin) -> None:
    """A refused request costs its asker 100 tokens of its minute: six refusals (too long, a bad
    field, another model) spend a 600-token minute, and the asker's next request, a valid one,
    is refused before it is tokenized (429 ``user_tokens`` with ``Retry-After``, not
    ``user_limit``: the refused hold nothing) while another asker's is answered."""
    saved = origin.server.settings
    origin.server.settings = saved.replace(
        max_in_flight_per_user=2, max_tokens_per_minute_per_user=600
    )
    refused = [_chat("word " * 1000), _chat("hi", temperature=-1), _chat("hi", model="gpt-4")] * 2
    valid = _chat("Say yes.", max_tokens=2)
    try:
        with origin.client(timeout=60) as client:
            statuses = [
                client.post("/v1/chat/completions", json=body, headers=_as("hammer")).status_code
                for body in refused
            ]
            with _tokenizer_busy():
                spent = client.post("/v1/chat/completions", json=valid, headers=_as("hammer"))
            other = client.post("/v1/chat/completions", json=valid, headers=_as("bystander"))
    finally:
        origin.server.settings = saved
    assert statuses == [400, 400, 404] * 2
    assert spent.status_code == 429 and spent.json()["error"]["code"] == "user_tokens"
    assert int(spent.headers["retry-after"]) >= 1
    assert other.status_code == 200


def test_request_timeout(origin: Origin) -> None:
    saved = origin.server.settings
    origin.server.settings = saved.replace(request_timeout_s=0.3)
    try:
        with origin.client() as client:
            body = _chat("Write a long essay.", max_tokens=400, ignore_eos=True)
            assert client.post("/v1/chat/completions", json=body).status_code == 504
            with client.stream(
                "POST", "/v1/chat/completions", json={**body, "stream": True}
            ) as response:
                events = _events(response)
            assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "timeout"
    finally:
        origin.server.settings = saved
    _idle(origin.engine)


# -- metrics, logs, health ------------------------------------------------------------------------


def _samples(client: httpx.Client) -> dict[str, float]:
    """The origin's Prometheus samples, by name with labels."""
    samples = {}
    for line in client.get("/metrics").text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def test_time_sensitive_answers_are_never_cached_and_are_counted(origin: Origin) -> None:
    question = "What's the weather in Lisbon today?"
    skipped = 'edgeqa_origin_cache_skipped_total{reason="time_sensitive"}'
    with origin.client() as client:
        before = _samples(client)
        tiers, finishes = [], []
        for user in ("ann", "bob", "cy"):  # past EDGEQA_CACHE_MIN_USERS askers of one tenant
            response = client.post(
                "/v1/chat/completions", json=_chat(question, max_tokens=64), headers=_as(user)
            )
            assert response.status_code == 200
            tiers.append(response.headers["x-edgeqa-tier"])
            finishes.append(response.json()["choices"][0]["finish_reason"])
        after = _samples(client)
    assert tiers == ["generated"] * 3, finishes
    assert after[skipped] - before.get(skipped, 0.0) == 3
    for reason in CACHE_SKIP_REASONS:  # every reason exported, at 0 until it happens
        assert f'edgeqa_origin_cache_skipped_total{{reason="{reason}"}}' in after


def test_metrics_use_vllm_names_and_split_ttft(origin: Origin) -> None:
    with origin.client() as client:
        body = _chat("Name a color.", max_tokens=8, stream=True)
        with client.stream("POST", "/v1/chat/completions", json=body) as response:
            _events(response)
        # the same question again, past the caches (a stop string): the suffix proposer drafts
        # from the first answer
        client.post("/v1/chat/completions", json=_chat("Name a color.", max_tokens=8, stop=["#"]))
        client.post("/v1/chat/completions", json=_chat(QUESTIONS[2]))
        samples = _samples(client)
    label = f'{{model_name="{MODEL}"}}'
    for name in (
        "vllm:time_to_first_token_seconds_count",
        "vllm:e2e_request_latency_seconds_count",
        "vllm:request_queue_time_seconds_count",
        "edgeqa_ttft_queue_seconds_count",
        "edgeqa_ttft_compute_seconds_count",
        "edgeqa_ttft_network_seconds_count",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:prefix_cache_hits_total",  # the chat template's system prompt, shared
        "vllm:spec_decode_num_drafts_total",
        "vllm:spec_decode_num_draft_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_total",
    ):
        assert samples[name + label] > 0, name
    assert samples["vllm:num_requests_running" + label] >= 0
    assert samples["vllm:num_requests_waiting" + label] >= 0
    # where the engine's steps spent their time: every part counted, the model the most
    step = {
        phase: samples[f'edgeqa_engine_step_seconds_total{{model_name="{MODEL}",phase="{phase}"}}']
        for phase in ("schedule", "forward", "sample", "update")
    }
    assert all(s > 0 for s in step.values()) and max(step, key=step.__getitem__) == "forward"
    per_pos = (
        f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{model_name="{MODEL}",position="0"}}'
    )
    assert samples[per_pos] >= 0
    rates = [k for k in samples if k.startswith("edgeqa_spec_decode_acceptance_rate{")]
    assert rates and all('proposer="' in k for k in rates), rates
    assert samples['edgeqa_origin_requests_total{status="200",tier="exact"}'] >= 1
    assert samples['edgeqa_origin_requests_total{status="200",tier="generated"}'] >= 1
    version = origin.server.release_version()
    assert samples[f'edgeqa_origin_release_info{{language="en",version="{version}"}}']
    # the origin's release watcher reports its loads (a refused release is visible here too)
    assert samples['edgeqa_origin_release_loads_total{language="en",result="ok"}'] >= 1
    assert 'edgeqa_origin_release_loads_total{language="en",result="refused"}' in samples
    # every series the shipped Grafana dashboard plots is exported
    dashboard = json.loads(
        (Path(__file__).parents[3] / "docs" / "grafana-dashboard.json").read_text()
    )
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    names = {n for e in exprs for n in re.findall(r"(?:vllm:|edgeqa_)[a-z0-9_:]+", e)}
    exported = {name.split("{", 1)[0] for name in samples}
    assert len(names) > 10 and names <= exported, names - exported


# -- a client that has just missed at the edge ----------------------------------------------------


def _moved(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """The semantic-tier and missed-hint counters that moved: ``{"semantic=miss": 1, ...}``."""
    names = {
        "edgeqa_origin_semantic_lookups_total": "semantic",
        "edgeqa_origin_missed_hints_total": "hint",
    }
    moved = {}
    for sample, value in after.items():
        name, _, label = sample.partition("{")
        if name in names and value != before.get(sample, 0.0):
            outcome = label.split('"')[1]
            moved[f"{names[name]}={outcome}"] = value - before.get(sample, 0.0)
    return moved


def _asking(client: httpx.Client) -> Any:
    """``ask(question, user, headers={...}, **body)``: the tier, the answer, and which counters
    the request moved (``_moved``)."""

    def ask(question: str, user: str, **extra: Any) -> tuple[str, str, dict[str, float]]:
        headers = _as(user, **extra.pop("headers", {}))
        before = _samples(client)
        body = _chat(question, **extra)
        response = client.post("/v1/chat/completions", json=body, headers=headers)
        assert response.status_code == 200, response.text
        content = response.json()["choices"][0]["message"]["content"]
        return response.headers["x-edgeqa-tier"], content, _moved(before, _samples(client))

    return ask


def _missed(origin: Origin) -> dict[str, str]:
    return {"x-edgeqa-missed": f"{PROFILE}/{origin.server.release_version()}"}


def test_a_client_that_missed_at_the_edge_spares_the_origin_the_release_lookups(
    origin: Origin, monkeypatch: pytest.MonkeyPatch
) -> None:
    missed, version = _missed(origin), origin.server.release_version()
    exact_lookups: list[str] = []  # keys looked up in the release's exact tier
    lookup_exact = ReleaseIndex.lookup_exact

    def spy(index: ReleaseIndex, key: str) -> Any:
        exact_lookups.append(key)
        return lookup_exact(index, key)

    monkeypatch.setattr(ReleaseIndex, "lookup_exact", spy)
    with origin.client() as client:
        ask = _asking(client)
        # without the hint, as before: a novel question is looked up in both of the release's
        # tiers (embedded and searched), then generated
        tier, _, moved = ask("Which planet has the most moons?", "ann", max_tokens=8)
        assert (tier, moved) == ("generated", {"semantic=miss": 1})
        assert len(exact_lookups) == 1
        # with it: not looked up in that release again, by either tier (the edge has just run
        # both); only the online cache is consulted
        exact_lookups.clear()
        tier, _, moved = ask("Name a famous painter.", "ann", max_tokens=8, headers=missed)
        assert (tier, moved) == ("generated", {"semantic=skipped": 1, "hint=honoured": 1})
        assert exact_lookups == []
        # a false hint on a published wording gets its sender a generated answer
        tier, _, moved = ask(QUESTIONS[0], "ann", max_tokens=8, headers=missed)
        assert (tier, moved) == ("generated", {"semantic=skipped": 1, "hint=honoured": 1})
        assert exact_lookups == []

        # a hint naming another release is ignored: searched as without it
        for other in (f"{PROFILE}/20000101T000000Z-00000000", f"other-profile/{version}"):
            headers = {"x-edgeqa-missed": other}
            tier, _, moved = ask("Name a large river.", "ann", max_tokens=8, headers=headers)
            assert (tier, moved) == ("generated", {"semantic=miss": 1, "hint=other_release": 1})
        # a request the tiers never look up is not counted
        tier, _, moved = ask(NOVEL, "ann", max_tokens=4, temperature=0.5, headers=missed)
        assert (tier, moved) == ("generated", {})

        # a malformed hint, or one sent twice, is refused naming the header, on both endpoints
        for value in ("nonsense", f"{PROFILE}/{version}/x", f"{PROFILE}/..", "p/v 1", "é/v"):
            for path, body in (
                ("/v1/chat/completions", _chat(NOVEL)),
                ("/v1/completions", {"prompt": NOVEL}),
            ):
                raw = {"x-edgeqa-missed": value.encode()}
                refused = client.post(path, json=body, headers=raw)
                assert refused.status_code == 400, (value, refused.text)
                assert refused.json()["error"]["param"] == "x-edgeqa-missed"
        twice = [("x-edgeqa-missed", missed["x-edgeqa-missed"])] * 2
        refused = client.post("/v1/chat/completions", json=_chat(NOVEL), headers=twice)
        assert refused.status_code == 400 and "sent 2 times" in refused.json()["error"]["message"]


def test_with_the_hint_the_online_cache_still_answers_and_never_jumps_the_release(
    origin: Origin,
) -> None:
    missed, cache = _missed(origin), origin.server.cache

    def key_of(question: str) -> str:
        return scoped_key(key_of_normalized(normalize(question)), None, "")

    with origin.client() as client:
        ask = _asking(client)
        # an answer generated after a hint skipped the semantic tier is cached unchecked: the
        # next asker who missed at the edge gets it; one who sends no hint only once the
        # semantic tier has missed for it too, and from then on ahead of that tier
        question = "Which ocean is the largest?"
        assert cache.put(key_of(question), "The Pacific.", 4, asker="zoe", checked=False)
        tier, answer, moved = ask(question, "ann", headers=missed)
        assert (tier, answer, moved) == ("origin_cache", "The Pacific.", {"hint=honoured": 1})
        tier, answer, moved = ask(question, "bob")
        assert (tier, answer, moved) == ("origin_cache", "The Pacific.", {"semantic=miss": 1})
        tier, answer, moved = ask(question, "cy")
        assert (tier, answer, moved) == ("origin_cache", "The Pacific.", {})

        # a false hint only spares the origin work for its sender: the paraphrase the release's
        # semantic tier answers is generated for it, and what such a request caches never
        # answers anyone else ahead of the release
        paraphrase = "how can I freeze my card"
        tier, _, moved = ask(paraphrase, "ann", max_tokens=8, headers=missed)
        assert (tier, moved) == ("generated", {"semantic=skipped": 1, "hint=honoured": 1})
        assert cache.put(key_of(paraphrase), "Planted.", 2, asker="mallory", checked=False)
        tier, answer, moved = ask(paraphrase, "bob")
        assert (tier, answer) == ("semantic", f"v1: answer to {QUESTIONS[0]}")
        assert moved == {"semantic=hit": 1}
        tier, answer, _ = ask(paraphrase, "cy", headers=missed)
        assert (tier, answer) == ("origin_cache", "Planted.")  # its sender's own doing
        # nor ahead of the release's exact tier, which a hinted request skips as well
        published = QUESTIONS[2]
        assert cache.put(key_of(published), "Planted.", 2, asker="mallory", checked=False)
        tier, answer, moved = ask(published, "bob")
        assert (tier, answer, moved) == ("exact", f"v1: answer to {published}", {})
        tier, answer, moved = ask(published, "cy", headers=missed)
        assert (tier, answer, moved) == ("origin_cache", "Planted.", {"hint=honoured": 1})

        # end to end: a hinted generation writes such an entry
        question = "Say hello."
        before = _samples(client)
        body = _chat(question, max_tokens=48)
        first = client.post("/v1/chat/completions", json=body, headers=_as("ann", **missed))
        assert first.headers["x-edgeqa-tier"] == "generated"
        assert _moved(before, _samples(client)) == {"semantic=skipped": 1, "hint=honoured": 1}
        choice = first.json()["choices"][0]
        content, finish = choice["message"]["content"], choice["finish_reason"]
        if finish != "stop" or uncacheable(question, content, finish) is not None:
            pytest.skip(f"the model's answer is not one the cache keeps: {content!r}")
        tier, again, moved = ask(question, "bob", max_tokens=48, headers=missed)
        assert (tier, again, moved) == ("origin_cache", content, {"hint=honoured": 1})
        tier, again, moved = ask(question, "cy", max_tokens=48)
        assert (tier, again, moved) == ("origin_cache", content, {"semantic=miss": 1})


def test_every_request_is_logged_with_a_hashed_user_and_tenant(origin: Origin) -> None:
    with origin.client() as client:
        client.post(
            "/v1/chat/completions",
            json=_chat(QUESTIONS[3], user="alice@example.com"),
            headers={"x-edgeqa-tenant": "shop"},
        )
        client.post("/v1/chat/completions", json={"messages": []})
    assert origin.server.logs is not None
    origin.server.logs.flush()
    today = datetime.now(UTC).date()
    rows = read_logs(origin.store, today, today)
    tiers = {r["tier"] for r in rows}
    assert {"exact", "generated", "rejected"} <= tiers
    # the tenant, too, as a salted hash
    assert all(r["tenant"] != "shop" for r in rows)
    shop = origin.server.users("tenant:shop")
    alice = [r for r in rows if r["query"] == QUESTIONS[3] and r["tenant"] == shop]
    assert alice and alice[-1]["user"] and "alice" not in alice[-1]["user"]
    assert alice[-1]["profile"] == PROFILE and alice[-1]["key"]
    assert all("alice@example.com" not in str(r["user"]) for r in rows)
    multi = [r for r in rows if r["turns"] == 2]
    assert multi and all(r["tier"] == "generated" for r in multi)


def test_health_while_loading_and_after_the_engine_died(embedded_model, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    model, tokenizer = embedded_model
    release = threading.Event()
    engine = Engine(model, tokenizer, EngineConfig(max_num_seqs=2, max_model_len=256))

    def load() -> Runtime:
        release.wait(60)
        return Runtime(engine.start(), 16, 0.0, None)

    store = FileStore(tmp_path / "store")
    server = OriginServer(_config(store), load)
    with Server(create_app(server)) as running, httpx.Client(base_url=running.url) as client:
        assert client.get("/health").json()["status"] == "loading"
        busy = client.post("/v1/chat/completions", json=_chat("hi"))
        assert busy.status_code == 503 and busy.headers["retry-after"]
        release.set()
        wait_healthy(running.url)
        ok = client.post("/v1/chat/completions", json=_chat("hi", max_tokens=4), timeout=60)
        assert ok.status_code == 200  # no release anywhere: generated
        assert ok.headers["x-edgeqa-tier"] == "generated"
        engine.loop_error = RuntimeError("CUDA error: an illegal memory access")
        health = client.get("/health")
        assert health.status_code == 503 and health.json()["status"] == "engine_dead"
        assert client.post("/v1/chat/completions", json=_chat("hi")).status_code == 503


def test_vllm_benchmark_client_works_unchanged(origin: Origin, tmp_path: Path) -> None:
    origin.engine.tokenizer.save_pretrained(tmp_path / "tokenizer")
    for backend, endpoint in (
        ("openai", "/v1/completions"),
        ("openai-chat", "/v1/chat/completions"),
    ):
        result = subprocess.run(
            [
                sys.executable,
                "benchmark_serving.py",
                "--backend",
                backend,
                "--base-url",
                origin.url,
                "--endpoint",
                endpoint,
                "--model",
                MODEL,
                "--tokenizer",
                str(tmp_path / "tokenizer"),
                "--dataset-name",
                "random",
                "--random-input-len",
                "32",
                "--random-output-len",
                "12",
                "--num-prompts",
                "8",
                "--request-rate",
                "inf",
                "--save-result",
                "--result-dir",
                str(tmp_path),
                "--result-filename",
                f"{backend}.json",
            ],
            cwd=VLLM_BENCH,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
        )
        assert result.returncode == 0, result.stderr[-3000:]
        report = json.loads((tmp_path / f"{backend}.json").read_text())
        assert report["completed"] == 8, backend
        assert report["mean_ttft_ms"] > 0 and report["total_output_tokens"] > 0


# -- the command ----------------------------------------------------------------------------------


@contextlib.contextmanager
def _origin_command(
    cli_env: dict[str, str], store: FileStore, **env: str
) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """``edgeqa origin serve`` in a child process, beside a busy process (a loaded machine; at
    the lowest priority, so it takes only the cycles that the server and the suite's other tests
    leave)."""
    port = free_port()
    env = {
        **cli_env,
        "EDGEQA_STORE": store.uri,
        "EDGEQA_USER_SALT": "test-salt-0123456789",
        "EDGEQA_MAX_NUM_SEQS": "4",
        "EDGEQA_MAX_MODEL_LEN": "512",
        **env,
    }
    busy = subprocess.Popen([sys.executable, "-c", "import os\nos.nice(19)\nwhile True: pass"])
    child = subprocess.Popen(
        ["edgeqa", "origin", "serve", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, child)
        yield url, child
    finally:
        busy.kill()
        busy.wait(30)
        if child.poll() is None:
            child.kill()
            child.wait(30)


def test_origin_serve_command_graceful_shutdown_flushes_logs(
    cli_env: dict[str, str], tmp_path: Path
) -> None:
    store = FileStore(tmp_path / "store")
    with _origin_command(cli_env, store) as (url, child):
        assert httpx.get(f"{url}/health").json()["release"] is None  # nothing published: fine
        # a stream in flight when SIGTERM arrives is finished (within the 30 s grace), then the
        # server exits
        with (
            httpx.Client(base_url=url, timeout=120) as client,
            client.stream(
                "POST",
                "/v1/chat/completions",
                json=_chat("Describe the sea.", max_tokens=48, ignore_eos=True, stream=True),
            ) as response,
        ):
            lines = response.iter_lines()
            assert any('"content"' in line for line in lines)
            child.send_signal(signal.SIGTERM)
            rest = [line for line in lines if line]
        assert '"finish_reason": "length"' in rest[-2] and rest[-1] == "data: [DONE]"
        assert child.wait(60) is not None
    today = datetime.now(UTC).date()
    rows = read_logs(store, today, today)
    assert [r["query"] for r in rows] == ["Describe the sea."]
    assert rows[0]["status"] == 200 and rows[0]["tier"] == "generated"


def test_origin_serve_command_drains_then_ends_open_streams_cleanly(
    cli_env: dict[str, str], tmp_path: Path
) -> None:
    """SIGTERM: new requests get 503 while the socket stays open; a stream still running when the
    grace is over ends with an error event and [DONE], not a cut connection; logs flushed."""
    store = FileStore(tmp_path / "store")
    long = _chat("Tell me a long story.", max_tokens=1900, ignore_eos=True, stream=True)
    grace = {"EDGEQA_SHUTDOWN_GRACE_S": "10", "EDGEQA_MAX_MODEL_LEN": "2048"}
    with (
        _origin_command(cli_env, store, **grace) as (url, child),
        httpx.Client(base_url=url, timeout=120) as client,
    ):
        with client.stream("POST", "/v1/chat/completions", json=long) as response:
            lines = response.iter_lines()
            assert any('"content"' in line for line in lines)
            child.send_signal(signal.SIGTERM)
            # draining: the socket is open, admission is not
            health = client.get("/health")
            assert health.status_code == 503 and health.json()["status"] == "draining"
            refused = client.post("/v1/chat/completions", json=_chat("Describe the sea."))
            assert refused.status_code == 503
            assert refused.json()["error"]["code"] == "draining"
            rest = [line for line in lines if line]  # read to the end: never an incomplete body
        assert rest[-1] == "data: [DONE]"
        final = json.loads(rest[-2][len("data: ") :])
        assert final["error"]["code"] == "shutting_down"
        assert child.wait(60) is not None
    today = datetime.now(UTC).date()
    rows = read_logs(store, today, today)
    cut = [r for r in rows if r["query"] == "Tell me a long story."]
    assert [(r["tier"], r["status"]) for r in cut] == [("generated", 503)]
    # refused before its body was read: no question, but the refusal is logged
    assert [(r["tier"], r["status"]) for r in rows if r not in cut] == [("rejected", 503)]
