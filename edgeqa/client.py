"""The edgeqa client for Python callers: the web client (``web/edgeqa.js``) in Python.

A question goes to the cheapest layer that can answer it: the CDN's exact tier (the bucket of the
release's key index that holds the key spec's key, under the version ``current.json`` names, then
the answer object it lists, by its content), then the edge index service (exact and semantic
tiers), then the origin, whose answer is streamed. After a miss at the edge, the
request to the origin says which release missed (``x-edgeqa-missed: <profile>/<version>``, from
the edge's miss body), so the origin does not embed and search the question in it again. The two
clients take the same path for the same question: the key and missed-hint vectors test both
clients' functions, and the demo and the browser test check the tiers each one lands on.
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx

from base.answer_objects import (
    answer_object_problem,
    bucket_entry,
    bucket_of,
    bucket_path,
    bucket_problem,
    object_path,
)
from base.keys import key
from base.languages import language_of
from base.missed import MISSED_HEADER, missed_hint
from base.pointers import client_verdict

MAX_BUCKETS = 64  # buckets of the key index a client keeps (~30 KB each at a million keys)


@dataclass(frozen=True)
class Answered:
    question: str
    tier: str  # exact, semantic, origin_cache or generated
    source: str  # cdn, edge or origin
    answer: str
    first_byte_ms: float
    key: str


class EdgeQAClient:
    """``cdn``: where releases are read (CloudFront); ``edge``: the edge index service;
    ``origin``: the origin server. ``cdn`` and ``edge`` may be empty (those layers skipped).
    ``profiles``: the release profile of each language (``/config.json``'s), a question's chosen
    by its script (``base.languages.language_of``); ``profile``: one profile for every
    question instead. ``public_keys``: the keys releases are signed with
    (``EDGEQA_RELEASE_PUBLIC_KEYS``); an answer object from the CDN is shown only when the bucket
    naming it proves itself against a release one of them signed, so without them the CDN is
    skipped."""

    def __init__(
        self,
        origin: str,
        cdn: str = "",
        edge: str = "",
        profile: str = "",
        api_key: str = "",
        user_token: str = "",
        public_keys: tuple[str, ...] = (),
        pointer_ttl_s: float = 30.0,
        client: httpx.Client | None = None,
        profiles: dict[str, str] | None = None,
    ) -> None:
        self.origin, self.cdn, self.edge, self.profile = origin, cdn, edge, profile
        self.profiles = dict(profiles or {})
        self.api_key = api_key
        # the signed user token the deployment's backend minted (docs/security.md#identity)
        self.user_headers = {"x-edgeqa-user": user_token} if user_token else {}
        self.public_keys = public_keys
        self.pointer_ttl_s = pointer_ttl_s
        self.http = client or httpx.Client(timeout=120)
        # by profile: ((version, answers root) or None, read at)
        self._pointers: dict[str, tuple[tuple[str, str] | None, float]] = {}
        # by profile: the newest pointer verified, (sequence, manifest sha256): an older one put
        # back in the store is refused (base/pointers.py)
        self.newest: dict[str, tuple[int, str]] = {}
        # by profile: why the CDN's pointer was last refused (unsigned, rollback, stale)
        self.pointer_problems: dict[str, str] = {}
        # by (profile, version, bucket, answers root): a bucket of the key index that proved
        # itself; a release's buckets never change, the last MAX_BUCKETS read are kept
        self._buckets: OrderedDict[tuple[str, str, str, str], dict[str, Any]] = OrderedDict()

    def profile_for(self, question: str) -> str:
        """The profile ``question`` is looked up under ("" when none is known)."""
        return self.profile or self.profiles.get(language_of(question), "")

    def current_release(self, profile: str | None = None) -> tuple[str, str] | None:
        """(version, answers root) of ``profile``'s current release (default: ``profile``'s)
        when its pointer is signed by one of ``public_keys``, fresh, and not older than one read
        before; None when not (``pointer_problems`` says why), or when the CDN is down (the
        other layers answer)."""
        profile = profile if profile is not None else self.profile
        if not self.cdn or not profile or not self.public_keys:
            return None
        cached = self._pointers.get(profile)
        if cached and time.monotonic() - cached[1] < self.pointer_ttl_s:
            return cached[0]
        pointer = self._json("GET", f"{self.cdn}/{profile}/current.json")
        release = None
        if pointer is not None:
            now = datetime.fromtimestamp(time.time(), UTC)
            signed, problem = client_verdict(
                pointer, profile, self.public_keys, self.newest.get(profile), now
            )
            if problem is None and signed is not None:
                self.newest[profile] = (signed.sequence, signed.manifest_sha256)
                release = (signed.version, signed.answers_root)
                self.pointer_problems.pop(profile, None)
            else:
                self.pointer_problems[profile] = str(problem)
        self._pointers[profile] = (release, time.monotonic())
        return release

    def ask(self, question: str, on_text: Callable[[str], None] | None = None) -> Answered:
        """The answer from the first layer that has one; ``on_text`` gets it as it arrives."""
        started = time.perf_counter()
        k = key(question)
        on_text = on_text or (lambda text: None)

        def done(tier: str, source: str, answer: str, first_byte: float) -> Answered:
            return Answered(question, tier, source, answer, (first_byte - started) * 1000, k)

        profile = self.profile_for(question)
        release = self.current_release(profile)
        if release:
            answer = self.exact_answer(profile, release, k)
            if answer is not None:
                on_text(answer)
                return done("exact", "cdn", answer, time.perf_counter())
        missed = None  # the release the edge has just missed in, for the origin
        if self.edge:
            # POST: the question stays out of URLs and so out of access logs
            body = {"q": question, **({"profile": self.profile} if self.profile else {})}
            url = f"{self.edge}/v1/lookup"
            found = self._json("POST", url, body, self.user_headers, statuses=(200, 404))
            if found is not None and isinstance(found.get("answer"), str):
                on_text(found["answer"])
                return done(found["tier"], "edge", found["answer"], time.perf_counter())
            if found is not None and found.get("miss") is True:
                missed = missed_hint(found.get("profile"), found.get("version"))
        return self._generate(question, on_text, done, missed)

    def bucket(self, profile: str, release: tuple[str, str], bucket: str) -> dict[str, Any] | None:
        """Bucket ``bucket`` of ``profile``'s ``release`` (version, answers root) once it proves
        itself to the root, from memory or the CDN; None when it is missing or refused."""
        version, root = release
        kept_as = (profile, version, bucket, root)
        kept = self._buckets.pop(kept_as, None)
        if kept is None:
            url = f"{self.cdn}/{profile}/releases/{version}/{bucket_path(bucket)}"
            kept = self._json("GET", url)
            if kept is None or bucket_problem(kept, bucket, profile, version, root) is not None:
                return None
        self._buckets[kept_as] = kept  # the most recently used last
        while len(self._buckets) > MAX_BUCKETS:
            self._buckets.popitem(last=False)
        return kept

    def exact_answer(self, profile: str, release: tuple[str, str], k: str) -> str | None:
        """The CDN's answer for key ``k`` under ``release``: its bucket proves itself and lists
        ``k``, and the object's bytes hash to the sha256 listed (``answer_object_problem``)."""
        bucket = self.bucket(profile, release, bucket_of(k))
        digest = bucket_entry(bucket, k) if bucket is not None else None
        if digest is None:
            return None
        try:
            response = self.http.get(f"{self.cdn}/{profile}/{object_path(digest)}")
        except httpx.HTTPError:
            return None
        if response.status_code != 200:
            return None
        data = response.content  # hashed as sent, then parsed
        if answer_object_problem(data, k, profile, digest, time.time()) is not None:
            return None
        return str(json.loads(data)["answer"])

    def _json(
        self,
        method: str,
        url: str,
        body: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
        statuses: tuple[int, ...] = (200,),
    ) -> dict[str, Any] | None:
        """The JSON object at ``url`` when it answers one of ``statuses`` with one; None
        otherwise. ``headers``: the user token goes to the services that count askers, never to
        the CDN."""
        try:
            response = self.http.request(method, url, json=body, headers=headers)
            found = response.json() if response.status_code in statuses else None
        except (httpx.HTTPError, ValueError):
            return None
        return found if isinstance(found, dict) else None

    def _generate(
        self,
        question: str,
        on_text: Callable[[str], None],
        done: Callable[[str, str, str, float], Answered],
        missed: str | None = None,
    ) -> Answered:
        headers = dict(self.user_headers)
        if self.api_key:
            headers["authorization"] = f"Bearer {self.api_key}"
        if missed:
            headers[MISSED_HEADER] = missed
        body = {"messages": [{"role": "user", "content": question}], "stream": True}
        text, first = "", None
        url = f"{self.origin}/v1/chat/completions"
        with self.http.stream("POST", url, json=body, headers=headers) as response:
            if response.status_code != 200:
                response.read()
                raise httpx.HTTPStatusError(
                    f"origin: {response.status_code} {response.text[:200]}",
                    request=response.request,
                    response=response,
                )
            tier = response.headers.get("x-edgeqa-tier", "generated")
            for line in response.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    raise RuntimeError(f"origin: {chunk['error']['message']}")
                choices = chunk.get("choices")
                delta = choices[0]["delta"].get("content") if choices else None
                if delta:
                    first = first or time.perf_counter()
                    text += delta
                    on_text(delta)
        return done(tier, "origin", text, first or time.perf_counter())
