"""Per-network limits at the origin (issue 48): a free IPv6 /48 is 65,536 /64 askers, so requests
in flight are capped per network (/24, /48) as well as per asker, prompts waiting for the
tokenizer are a bounded queue with a deadline, and the online cache's k counts networks as mining
does.

No model: a fake engine whose queue is always full (a request the tiers do not answer is refused
``queue_full``, never generated) and an online cache that answers the question asked, so a request
admitted past the shares is answered at once. Each request comes from its own peer address.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import httpx
from starlette.applications import Starlette

from base.keys import key_of_normalized, normalize
from base.users import UserHasher
from origin.config import OriginSettings
from origin.runtime import Runtime
from origin.server import OriginServer, create_app, prompts
from origin.server.tiers import scoped_key

QUESTION = "What is the capital of France?"
BODY = {"messages": [{"role": "user", "content": QUESTION}], "max_tokens": 8}
SETTLE_S = 3.0  # how long a refusal that must come at once may take, at most


class FakeTokenizer:
    def get_vocab(self) -> dict[str, int]:
        return {"a": 0, "bb": 1}

    def __len__(self) -> int:
        return 100

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [1] * max(1, len(text) // 4)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "a" * len(ids)

    def apply_chat_template(self, messages: Any, **_: Any) -> dict[str, list[int]]:
        return {"input_ids": [1] * sum(1 + len(m["content"]) // 4 for m in messages)}


class FakeConfig:
    max_num_seqs = 4
    max_model_len = 512

    def room(self, prompt_tokens: int) -> int:
        return self.max_model_len - prompt_tokens


class FullEngine:
    """Alive, its queue always full: nothing is ever generated."""

    alive = True
    loop_error = None
    num_running = 4

    def __init__(self) -> None:
        self.tokenizer = FakeTokenizer()
        self.config = FakeConfig()

    def queue_load(self) -> tuple[int, int]:
        return 1_000_000, 0


def _origin(**env: str) -> OriginServer:
    settings = OriginSettings.from_env(
        {
            "EDGEQA_CACHE_MIN_USERS": "1",
            "EDGEQA_MAX_TOKENS_PER_MINUTE_PER_USER": "0",
            "EDGEQA_MAX_TOKENIZE_QUEUE": "256",
            **env,
        }
    )
    server = OriginServer(settings, lambda: None, users=UserHasher("s" * 32))  # type: ignore[arg-type,return-value]
    server.runtime = Runtime(FullEngine(), 16, 0.0, None)  # type: ignore[arg-type]
    key = scoped_key(key_of_normalized(normalize(QUESTION)), None, "")
    assert server.cache.put(key, "Paris.", 2, "seed")
    return server


async def _ask(app: Starlette, peer: str, body: dict[str, Any] = BODY) -> httpx.Response:
    transport = httpx.ASGITransport(app=app, client=(peer, 5000))
    async with httpx.AsyncClient(transport=transport, base_url="http://origin") as client:
        return await client.post("/v1/chat/completions", json=body, timeout=30)


@contextlib.contextmanager
def _tokenizer_busy() -> Iterator[None]:
    """The tokenizer taken, as a long prompt being tokenized takes it."""
    prompts._TOKENIZING.acquire()
    try:
        yield
    finally:
        prompts._TOKENIZING.release()


def _code(response: httpx.Response) -> str:
    return str(response.json()["error"]["code"])


async def _flood(server: OriginServer, crowd: list[str], outsider: str) -> None:
    """``crowd`` (one network, 65 askers) asks at once while the tokenizer is busy: 64 hold their
    places, the 65th is refused at once (429 ``network_limit``); an asker of another network is
    not refused, and once the tokenizer is free everyone held is answered."""
    app = create_app(server)
    with _tokenizer_busy():
        tasks = [asyncio.create_task(_ask(app, peer)) for peer in crowd]
        done, _ = await asyncio.wait(tasks, timeout=SETTLE_S, return_when=asyncio.FIRST_COMPLETED)
        await asyncio.sleep(0.2)  # anything else refused at once
        refused = [task.result() for task in tasks if task.done()]
        other = asyncio.create_task(_ask(app, outsider))
        await asyncio.sleep(0.2)
        assert not other.done(), other.result().text  # waits for the tokenizer, not refused
    assert done, "nobody refused while the tokenizer was busy"
    assert len(refused) == 1, [r.status_code for r in refused]
    assert refused[0].status_code == 429 and _code(refused[0]) == "network_limit"
    assert int(refused[0].headers["retry-after"]) >= 1
    answered = await asyncio.gather(*(t for t in tasks if t not in done))
    assert [r.status_code for r in answered] == [200] * 64
    assert {r.headers["x-edgeqa-tier"] for r in answered} == {"origin_cache"}
    assert (await other).status_code == 200
    again = await _ask(app, crowd[-1])  # the network's places are free again
    assert again.status_code == 200


def test_an_ipv6_48_of_65_askers_is_capped_while_another_48_is_served() -> None:
    server = _origin(EDGEQA_MAX_IN_FLIGHT_PER_NETWORK="64")
    crowd = [f"2001:db8:48:{i:x}::1" for i in range(1, 66)]  # 65 /64s of one /48
    asyncio.run(_flood(server, crowd, "2001:db8:49:1::1"))


def test_an_ipv4_24_of_65_askers_is_capped_while_another_24_is_served() -> None:
    server = _origin(EDGEQA_MAX_IN_FLIGHT_PER_NETWORK="64")
    crowd = [f"203.0.113.{i}" for i in range(1, 66)]  # 65 addresses of one /24
    asyncio.run(_flood(server, crowd, "198.51.100.7"))


def test_signed_users_count_in_their_network_too() -> None:
    """The cap is on the network, whoever asks from it: three signed users of one /24 with a cap
    of two are two in flight and one refused."""
    from base.users import mint_user_token

    secret = "i" * 40
    server = _origin(EDGEQA_MAX_IN_FLIGHT_PER_NETWORK="2", EDGEQA_IDENTITY_SECRET=secret)
    server.users = UserHasher("s" * 32, secret)
    app = create_app(server)

    async def main() -> list[httpx.Response]:
        async def signed(user: str) -> httpx.Response:
            transport = httpx.ASGITransport(app=app, client=("192.0.2.10", 5000))
            headers = {"x-edgeqa-user": mint_user_token(user, secret)}
            async with httpx.AsyncClient(transport=transport, base_url="http://o") as client:
                return await client.post("/v1/chat/completions", json=BODY, headers=headers)

        with _tokenizer_busy():
            tasks = [asyncio.create_task(signed(u)) for u in ("ann", "bob", "cy")]
            await asyncio.wait(tasks, timeout=SETTLE_S, return_when=asyncio.FIRST_COMPLETED)
        return await asyncio.gather(*tasks)

    responses = asyncio.run(main())
    assert sorted(r.status_code for r in responses) == [200, 200, 429]
    assert [_code(r) for r in responses if r.status_code == 429] == ["network_limit"]


def test_the_tokenizer_queue_is_bounded_and_refuses_at_once_when_full() -> None:
    """Two prompts may wait for the tokenizer: a third, from yet another network, is refused at
    once (429 ``tokenize_queue_full``) instead of waiting; the two are answered once it is free."""
    server = _origin(EDGEQA_MAX_TOKENIZE_QUEUE="2")
    app = create_app(server)

    async def main() -> tuple[list[httpx.Response], list[httpx.Response]]:
        peers = ["192.0.2.1", "198.51.100.1", "203.0.113.1"]
        with _tokenizer_busy():
            tasks = []
            for peer in peers:  # in this order: the first two are waiting when the third asks
                tasks.append(asyncio.create_task(_ask(app, peer)))
                await asyncio.sleep(0.1)
            done, _ = await asyncio.wait(
                tasks, timeout=SETTLE_S, return_when=asyncio.FIRST_COMPLETED
            )
            early = [task.result() for task in done]
        return early, await asyncio.gather(*tasks)

    early, every = asyncio.run(main())
    assert len(early) == 1, "the third prompt waited instead of being refused"
    assert early[0].status_code == 429 and _code(early[0]) == "tokenize_queue_full"
    assert int(early[0].headers["retry-after"]) >= 1
    assert [r.status_code for r in every] == [200, 200, 429]


def test_a_prompt_waiting_past_the_deadline_for_the_tokenizer_is_refused() -> None:
    server = _origin(EDGEQA_MAX_TOKENIZE_WAIT_S="0.3")
    app = create_app(server)

    async def main() -> httpx.Response | None:
        with _tokenizer_busy():
            task = asyncio.create_task(_ask(app, "192.0.2.1"))
            await asyncio.wait([task], timeout=SETTLE_S)
            done = task.done()
        response = await task
        return response if done else None

    response = asyncio.run(main())
    assert response is not None, "the prompt waited for the tokenizer past its deadline"
    assert response.status_code == 429 and _code(response) == "tokenize_timeout"
    assert "tokenizer" in response.json()["error"]["message"]


def test_the_online_cache_does_not_count_five_64s_of_one_48_as_five_networks() -> None:
    """k (``EDGEQA_CACHE_MIN_USERS``, 5) counts the fewer of distinct askers and distinct networks,
    as mining does: the seed's answer asked for by four more /64s of its /48 is still held (the
    request goes on to the engine: ``queue_full`` here); askers from three more /48s make five
    networks, and it is served."""
    server = _origin(EDGEQA_CACHE_MIN_USERS="5")
    app = create_app(server)

    async def main() -> list[httpx.Response]:
        same_48 = [f"2001:db8:5:{i}::1" for i in range(1, 5)]
        other_48s = [f"2001:db8:{n}:1::1" for n in (6, 7, 8)]
        return [await _ask(app, peer) for peer in same_48 + other_48s]

    responses = asyncio.run(main())
    assert [r.status_code for r in responses] == [429] * 6 + [200]
    assert {_code(r) for r in responses[:-1]} == {"queue_full"}
    assert responses[-1].headers["x-edgeqa-tier"] == "origin_cache"
