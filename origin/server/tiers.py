"""The tiers at the origin: a question the edge could not answer may still have an answer here.

Only a single question with default sampling, the served system prompt (or none) and no personal
data is looked up (``cache_key``), through the one tier cascade (``edge_index/tiers.py``): the
current release's exact tier, the online cache of answers generated here lately, the release's
semantic tier. A hit is cut to the request's ``max_tokens`` as generation would have cut it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edge_index import tiers
from edge_index.keys import InvalidQueryError, key_of_normalized, normalize
from edge_index.lookup import Hit
from edge_index.pii import has_pii
from origin.server.cache import OnlineCache
from origin.server.protocol import ParsedRequest
from origin.server.responses import Answer

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from edge_index.lookup import ReleaseIndex


def cache_key(parsed: ParsedRequest, system_prompt: str) -> tuple[str, str] | None:
    """(normalized question, key) when the request may be answered from a cache, else None."""
    if not parsed.single_question or not parsed.default_sampling:
        return None
    systems = [m["content"] for m in parsed.messages if m["role"] == "system"]
    if systems and systems != [system_prompt]:
        return None  # other instructions, other answers
    try:
        normalized = normalize(parsed.question)
    except InvalidQueryError:
        return None
    if has_pii(parsed.question):
        return None
    return normalized, key_of_normalized(normalized)


def tenant_scope(key_id: str | None, tenant: str) -> str:
    """One tenant: an API key and an ``x-edgeqa-tenant`` (hashed) together, what the online
    cache and the engine's prefix sharing keep apart."""
    return f"{key_id or ''}\x1f{tenant}"


def scoped_key(key: str, key_id: str | None, tenant: str) -> str:
    """The online cache's key: a question's key within one tenant (``tenant_scope``), so an
    answer generated for one tenant is never served to another."""
    return f"{tenant_scope(key_id, tenant)}\x1f{key}"


def revoke_cached(cache: OnlineCache, keys: frozenset[str]) -> int:
    """Apply the revocations a release lists (``precompute/revocations.py``) to the online
    cache: the revoked questions' entries dropped, in every tenant's scope, and never cached
    again while they are listed. How many entries were dropped."""
    return cache.revoke(lambda scoped: scoped.rsplit("\x1f", 1)[-1] in keys)


async def lookup(
    index: ReleaseIndex | None,
    cache: OnlineCache,
    tokenizer: PreTrainedTokenizerBase,
    parsed: ParsedRequest,
    normalized: str,
    key: str,
    max_tokens: int,
    cache_key: str,
    asker: str,
) -> Answer | None:
    """The tiers' answer, cut at ``max_tokens`` (the request's, within the room its prompt
    leaves), or None. ``cache_key``: ``key`` in the caller's tenant (``scoped_key``);
    ``asker``: the caller's hashed identity, counted toward the cache's k."""

    def online(key: str) -> Hit | None:
        entry = cache.get(cache_key, asker)
        if entry is None:
            return None
        return Hit(
            "origin_cache", key, parsed.question, entry.answer, 1.0, None, entry.completion_tokens
        )

    found = await tiers.lookup(index, parsed.question, normalized, key, online)
    if not isinstance(found, Hit):
        return None
    return fit(tokenizer, max_tokens, found)


def fit(tokenizer: PreTrainedTokenizerBase, max_tokens: int, hit: Hit) -> Answer:
    """The stored answer as this request would have been answered: cut at ``max_tokens``.
    The hit's token count, when known (the online cache's), spares tokenizing it."""
    if hit.tokens is not None and hit.tokens <= max_tokens:
        return Answer(hit.tier, hit.answer, hit.tokens, "stop")
    ids = tokenizer.encode(hit.answer, add_special_tokens=False)
    if len(ids) <= max_tokens:
        return Answer(hit.tier, hit.answer, len(ids), "stop")
    cut = str(tokenizer.decode(ids[:max_tokens], skip_special_tokens=True))
    return Answer(hit.tier, cut, max_tokens, "length")
