"""The tiers at the origin: a question the edge could not answer may still have an answer here.

Only a single question with default sampling, the served system prompt (or none) and no personal
data is looked up (``cache_key``), through the one tier cascade (``edge_index/tiers.py``): the
current release's exact tier, the online cache of answers generated here lately, the release's
semantic tier. A hit is cut to the request's ``max_tokens`` as generation would have cut it.

A client that has just missed at the edge in the release the origin serves for the question
(``skips_release``, the hint ``base/missed.py``) spares the origin both of that release's tiers:
the edge has just looked the question up in its key map and embedded and searched it; only the
online cache is new here. Its generated answer is cached unchecked (``CachedAnswer.checked``); such
an entry answers a caller that sends no hint only once the release's exact and semantic tiers
have both missed for it too, so a hint, true or not, can never put an answer in front of the
release's for someone else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from base.keys import InvalidQueryError, key_of_normalized, normalize
from base.missed import Missed
from edge_index import tiers
from edge_index.lookup import Hit, Miss
from origin.server.cache import CachedAnswer, OnlineCache
from origin.server.protocol import ParsedRequest
from origin.server.responses import Answer
from policy.pii import has_pii

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from edge_index.lookup import ReleaseIndex

# misses that never reached a semantic search: nothing served, or a release serving exact hits only
_NOT_SEARCHED = frozenset({"no_release", "semantic_off"})


@dataclass(frozen=True)
class Looked:
    """The tiers' answer (None: generate) and what the release's semantic tier did: ``hit``,
    ``miss`` (searched), ``skipped`` (a client's hint: the release's exact tier skipped too), or
    None (not reached)."""

    answer: Answer | None
    semantic: str | None


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


def skips_release(
    missed: Missed | None, profile: str | None, index: ReleaseIndex | None
) -> bool | None:
    """Whether a client's ``missed`` hint spares the release's tiers, the semantic one and the
    exact one: it names the release the origin is about to look the question up in
    (``profile``'s ``index``). None without a hint; False for a hint naming another profile or
    version (a client behind, or ahead of, this origin), which is ignored."""
    if missed is None:
        return None
    return index is not None and (profile, index.version) == (missed.profile, missed.version)


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
    release: bool = True,
    network: str = "",
) -> Looked:
    """The tiers' answer, cut at ``max_tokens`` (the request's, within the room its prompt
    leaves), or None. ``cache_key``: ``key`` in the caller's tenant (``scoped_key``);
    ``asker``, ``network``: the caller's hashed identity and network, counted toward the cache's
    k; ``release=False``: the caller has just missed in ``index``'s tiers at the edge
    (``skips_release``): the online cache only."""
    held: list[CachedAnswer] = []  # an unchecked entry, waiting for the release's tiers' miss

    def online(key: str) -> Hit | None:
        entry = cache.get(cache_key, asker, network)
        if entry is None:
            return None
        if release and not entry.checked:
            held.append(entry)
            return None
        return _cached(key, parsed.question, entry)

    found = await tiers.lookup(index, parsed.question, normalized, key, online, release)
    semantic_outcome = _semantic_outcome(found)
    if isinstance(found, Miss) and held:  # the release's tiers have both missed for it now
        cache.check(cache_key)
        found = _cached(key, parsed.question, held[0])
    answer = fit(tokenizer, max_tokens, found) if isinstance(found, Hit) else None
    return Looked(answer, semantic_outcome)


def _cached(key: str, question: str, entry: CachedAnswer) -> Hit:
    return Hit("origin_cache", key, question, entry.answer, 1.0, None, entry.completion_tokens)


def _semantic_outcome(found: Hit | Miss) -> str | None:
    """What the release's semantic tier did in the cascade that ended with ``found``."""
    if isinstance(found, Hit):
        return "hit" if found.tier == "semantic" else None
    if found.reason in _NOT_SEARCHED:
        return None
    return "skipped" if found.reason == "skipped" else "miss"


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
