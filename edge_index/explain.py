"""Why a lookup ends as it does (``ReleaseIndex.explain``, ``edgeqa release explain``), as typed
models: the key and the exact tier's state, the nearest phrasings, the features the semantic tier
decided on against the release's decision, the guard's verdict and the outcome.

``as_json()`` is what ``--json`` prints (scripts read it: its field names are kept); a step the
lookup never reached (``features``, ``guard``) is left out, as a miss's answer is.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    def as_json(self) -> Any:
        return self.model_dump(mode="json", exclude_none=True)


class ExactState(Model):
    """The exact tier for the query's key: published in the release, served (not expired,
    not revoked), revoked."""

    published: bool
    served: bool
    revoked: bool


class Phrasing(Model):
    key: str
    question: str


class Candidate(Phrasing):
    """One of the nearest phrasings, with its cosine score."""

    cluster: str
    score: float


class Features(Model):
    """What the semantic tier decided on (``semantic.matcher.features``)."""

    score: float
    margin: float
    agreement: float
    nearest: Phrasing


class DecisionBars(Model):
    """The release's decision (``semantic.matcher.Decision``): the bars the features meet."""

    threshold: float
    margin: float
    agreement: float
    vote_k: int


class Outcome(Model):
    """A hit (its tier, key, question and answer) or a miss (its reason)."""

    hit: bool
    tier: str | None = None
    key: str | None = None
    question: str | None = None
    answer: str | None = None
    reason: str | None = None


class Trace(BaseModel):
    """What ``ReleaseIndex.decide`` records as it goes (the steps it reached)."""

    features: Features | None = None
    guard: str | None = None  # "passed", or the check that refused


class Explanation(Model):
    query: str
    normalized: str
    key: str
    version: str | None
    exact: ExactState
    candidates: list[Candidate]
    decision: DecisionBars
    features: Features | None = None
    guard: str | None = None
    outcome: Outcome
