"""Mining's rule 7, token-level k: what a cluster that reached k may publish as text.

A content token (``semantic.guard.content_tokens``) is k-safe in a cluster when the wordings
holding it were typed by at least k of its askers, who pass the crowd rule between them
(``MiningConfig.verified_crowd``: enough signed users, enough autonomous systems); a wording is
published only when all its tokens are, else held back (``rare_tokens``). When none is, the
canonical question is built from k-safe tokens (``safe_question``), or nothing is published
(``no_k_safe_text``). So nothing published holds a token fewer than k people typed (a name, an
account detail, a rare circumstance), nor one only a rented crowd of addresses typed.
"""

from __future__ import annotations

from collections.abc import Container, Iterable
from dataclasses import dataclass

from base.keys import key, normalize
from precompute.config import MiningConfig
from precompute.questions import Phrasing, askers
from precompute.textrules import text_problem
from semantic.guard import content_tokens, numbers, remove_tokens


@dataclass
class Evidence:
    """Who typed each content token (``semantic.guard.content_tokens``) of a cluster's
    wordings: the users, networks, signed users and autonomous systems of every wording holding
    it, each counted once."""

    tokens: dict[str, set[str]]  # wording key -> its content tokens
    users: dict[str, set[str]]  # token -> users of the wordings holding it
    networks: dict[str, set[str]]
    signers: dict[str, set[str]]
    asns: dict[str, set[str]]
    # token -> signed users and ASes beyond the kept ones, summed over its wordings (an upper
    # bound, as a cluster's: a wording has them only past ``MiningConfig.askers_kept`` users)
    more: dict[str, list[int]]

    @classmethod
    def of(cls, members: Iterable[Phrasing]) -> Evidence:
        evidence = cls({}, {}, {}, {}, {}, {})
        for member in members:
            tokens = evidence.tokens[member.key] = content_tokens(member.question)
            for token in tokens:
                evidence.users.setdefault(token, set()).update(member.users)
                evidence.networks.setdefault(token, set()).update(member.networks)
                evidence.signers.setdefault(token, set()).update(member.latest_by_signer)
                evidence.asns.setdefault(token, set()).update(member.latest_by_asn)
                more = evidence.more.setdefault(token, [0, 0])
                more[0] += member.more_signers
                more[1] += member.more_asns
        return evidence

    def safe(self, config: MiningConfig) -> set[str]:
        """The tokens typed by at least k askers of the cluster who pass the crowd rule."""
        return {
            t
            for t, users in self.users.items()
            if askers(users, self.networks[t]) >= config.k
            and config.verified_crowd(
                len(self.signers[t]) + self.more[t][0], len(self.asns[t]) + self.more[t][1]
            )
        }


def safe_question(text: str, safe: set[str]) -> str | None:
    """``text`` without its content tokens not in ``safe`` (``guard.remove_tokens``), when what
    is left is made of ``safe`` tokens only, keeps at least half of ``text``'s content tokens
    and all its numbers ("the limit for 100" never becomes "the limit for"), and passes the text
    rules; else None."""
    tokens = content_tokens(text)
    question = remove_tokens(text, tokens - safe)
    left = content_tokens(question)
    if (
        not tokens
        or not left <= safe
        or 2 * len(left & tokens) < len(tokens)
        or numbers(question) != numbers(text)
        or text_problem(question)
    ):
        return None
    return question


def publishable_parts(
    members: list[Phrasing], config: MiningConfig
) -> tuple[list[Phrasing], list[Phrasing], dict[str, int], list[str]]:
    """What a cluster that reached k may publish, but for the keys in use: its k-safe wordings
    (every content token typed by k of the cluster's askers who pass the crowd rule,
    ``config``), canonical first; the wordings held back, with how many rare tokens each holds;
    and, when no wording is k-safe, the questions it may build from k-safe tokens, best first
    (from the wording that loses the smallest share of its tokens; the most asked among
    equals): the first whose key is free is its canonical question (``publishable``)."""
    evidence = Evidence.of(members)
    safe = evidence.safe(config)
    published = [m for m in members if evidence.tokens[m.key] <= safe]
    held_back = [m for m in members if not evidence.tokens[m.key] <= safe]
    rare = {m.key: len(evidence.tokens[m.key] - safe) for m in held_back}
    if published:
        return published, held_back, rare, []
    candidates = []
    for member in sorted(members, key=lambda m: rare[m.key] / len(evidence.tokens[m.key])):
        question = safe_question(member.question, safe)
        if question is not None:
            candidates.append(question)
    return [], held_back, rare, candidates


def built_question(candidates: Iterable[str], taken: Container[str]) -> Phrasing | None:
    """The first of ``candidates`` (``publishable_parts``) whose key is not ``taken``, as the
    cluster's built canonical question; None when every one's is."""
    for question in candidates:
        if key(question) not in taken:
            return Phrasing(key(question), normalize(question), question, set(), 0, {})
    return None


def publishable(
    members: list[Phrasing], config: MiningConfig, taken: Container[str]
) -> tuple[list[Phrasing], list[Phrasing], dict[str, int], bool]:
    """What a cluster that reached k publishes: its k-safe wordings, canonical first, or else a
    question built from k-safe tokens whose key is not ``taken`` (keys in use), or else nothing
    (``no_k_safe_text``); the wordings held back, with how many rare tokens each holds; and
    whether the canonical question was built (``publishable_parts``, ``built_question``)."""
    published, held_back, rare, candidates = publishable_parts(members, config)
    if published:
        return published, held_back, rare, False
    built = built_question(candidates, taken)
    return ([built] if built else []), held_back, rare, built is not None
