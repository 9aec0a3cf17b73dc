"""The origin's HTTP server: an OpenAI-compatible API in front of the engine (vLLM's layout).

    app.py          the ASGI app: routes, CORS, lifespan; ``serve``
    completions.py  POST /v1/chat/completions and /v1/completions: the request flow, top-down
    info.py         /v1/models, /health, /metrics, the web client's page and config
    state.py        what the server holds: settings, runtime (loaded in the background), ...
    auth.py         API keys
    protocol.py     parsing and validating request bodies; the OpenAI error shape
    prompts.py      a parsed request as the engine's prompt; the tokenizer's bounded queue
    tiers.py        the release and the online cache, before generating
    cache.py        the online cache
    admission.py    bounded admission, per asker and per network (429 + Retry-After)
    generation.py   one admitted request: streamed or whole, then accounted for
    responses.py    the OpenAI JSON and SSE of a response
    metrics.py      Prometheus metrics (vLLM's names)

Before generating, a single-turn chat question with default sampling and no personal data is
looked up in the current release and the online cache; a hit is sent in the same format, with
``x-edgeqa-tier`` saying where it came from (``exact``, ``semantic``, ``origin_cache`` or
``generated``). ``docs/origin.md`` documents the API.
"""

from origin.server.app import create_app, serve
from origin.server.state import OriginServer

__all__ = ["OriginServer", "create_app", "serve"]
