"""The Python client: which headers go where."""

from __future__ import annotations

import httpx

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
