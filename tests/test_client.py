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
