"""The Python client: which headers go where, and the CDN's exact tier on the shared vectors
(``tests/vectors/proofs.json``, which ``web/test/proofs.test.mjs`` holds the web client to)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from edgeqa.client import EdgeQAClient


def test_the_user_token_goes_to_the_edge_never_to_the_cdn() -> None:
    seen: dict[str, httpx.Headers] = {}

    def answer(request: httpx.Request) -> httpx.Response:
        seen[request.url.host] = request.headers
        if request.url.host == "edge.test":
            return httpx.Response(200, json={"answer": "In the app.", "tier": "semantic"})
        return httpx.Response(404)

    client = EdgeQAClient(
        "http://origin.test",
        cdn="http://cdn.test",
        edge="http://edge.test",
        profile="bank",
        user_token="a.signed.token",
        public_keys=("AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",),
        client=httpx.Client(transport=httpx.MockTransport(answer)),
    )
    answered = client.ask("How do I freeze my card?")
    assert (answered.tier, answered.source) == ("semantic", "edge")
    assert "x-edgeqa-user" not in seen["cdn.test"]  # a cached, shared layer: no identity
    assert seen["edge.test"]["x-edgeqa-user"] == "a.signed.token"


def _ask_after_an_edge_answering(status: int, body: dict[str, object]) -> httpx.Headers:
    """The headers the origin receives when the edge answers ``status`` with ``body``."""
    seen: dict[str, httpx.Headers] = {}

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.host == "edge.test":
            return httpx.Response(status, json=body)
        seen["origin"] = request.headers
        sse = 'data: {"choices": [{"delta": {"content": "Hi."}}]}\n\ndata: [DONE]\n\n'
        return httpx.Response(200, text=sse, headers={"x-edgeqa-tier": "generated"})

    client = EdgeQAClient(
        "http://origin.test",
        edge="http://edge.test",
        client=httpx.Client(transport=httpx.MockTransport(answer)),
    )
    answered = client.ask("Why is the sky blue?")
    assert (answered.tier, answered.source, answered.answer) == ("generated", "origin", "Hi.")
    return seen["origin"]


def test_after_a_miss_at_the_edge_the_origin_is_told_which_release_missed() -> None:
    miss = {"miss": True, "version": "20261130T050905Z-c3887d14", "reason": "below_threshold"}
    headers = _ask_after_an_edge_answering(404, {**miss, "profile": "bank-en"})
    assert headers["x-edgeqa-missed"] == "bank-en/20261130T050905Z-c3887d14"
    # no release searched, a body that is not the edge's, or a failing edge: nothing to say
    nothing = {"miss": True, "version": None, "reason": "no_release", "profile": None}
    for status, body in ((404, nothing), (404, {"error": "not found"}), (503, miss)):
        assert "x-edgeqa-missed" not in _ask_after_an_edge_answering(status, body), body


VECTORS = json.loads((Path(__file__).parent / "vectors" / "proofs.json").read_text())
EDGE_ANSWER = "the edge's answer"


def _client_of_the_vectors_cdn(
    monkeypatch: pytest.MonkeyPatch, changes: dict[str, str | None]
) -> tuple[EdgeQAClient, list[str]]:
    """A client of the vectors' CDN (``changes`` made: None removes a file) at the vectors'
    time, its edge answering EDGE_ANSWER; the CDN paths it fetches."""
    files = {**VECTORS["files"], **changes}
    asked: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.host == "edge.test":
            return httpx.Response(200, json={"answer": EDGE_ANSWER, "tier": "exact"})
        path = request.url.path.lstrip("/")
        asked.append(path)
        text = files.get(path)
        return httpx.Response(404) if text is None else httpx.Response(200, content=text.encode())

    clock = SimpleNamespace(
        time=lambda: VECTORS["now_s"], monotonic=time.monotonic, perf_counter=time.perf_counter
    )
    monkeypatch.setattr("edgeqa.client.time", clock)
    client = EdgeQAClient(
        "http://origin.test",
        cdn="http://cdn.test",
        edge="http://edge.test",
        profile=VECTORS["profile"],
        public_keys=tuple(VECTORS["public_keys"]),
        client=httpx.Client(transport=httpx.MockTransport(answer)),
    )
    return client, asked


@pytest.mark.parametrize("case", VECTORS["lookups"], ids=lambda c: c["name"])
def test_the_cdn_s_answer_is_shown_only_through_a_proved_bucket_and_its_object_s_digest(
    monkeypatch: pytest.MonkeyPatch, case: dict[str, Any]
) -> None:
    client, _ = _client_of_the_vectors_cdn(monkeypatch, case["changes"])
    answered = client.ask(case["question"])
    assert answered.key == case["key"]
    if case["answer"] is not None:
        assert (answered.tier, answered.source, answered.answer) == ("exact", "cdn", case["answer"])
    else:  # refused (or missing): the edge answers
        assert (answered.source, answered.answer) == ("edge", EDGE_ANSWER)


def test_a_bucket_that_proved_itself_is_fetched_once_for_every_question_it_holds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shown = [c for c in VECTORS["lookups"] if c["answer"] is not None]
    shared = [c for c in shown if sum(o["key"][:3] == c["key"][:3] for o in shown) > 1]
    assert len(shared) == 2
    profile, version = VECTORS["profile"], VECTORS["version"]
    path = f"{profile}/releases/{version}/k/{shared[0]['key'][:3]}.json"
    client, asked = _client_of_the_vectors_cdn(monkeypatch, {})
    for case in shared + shared:
        assert client.ask(case["question"]).answer == case["answer"]
    assert asked.count(path) == 1
    assert sum(p.startswith(f"{profile}/a/") for p in asked) == 4
    # a refused bucket is not kept
    client, asked = _client_of_the_vectors_cdn(monkeypatch, {path: "{"})
    for case in shared:
        assert client.ask(case["question"]).source == "edge"
    assert asked.count(path) == 2
