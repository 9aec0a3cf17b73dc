"""The missed-hint: what a client tells the origin after a miss at the edge.

One definition, two languages, as the key spec's (``keys.py``): the web client implements the
same form (``missedHint``) and both test suites check ``tests/vectors/missed.json``.

A client that has just missed at the edge sends the origin ``MISSED_HEADER``: the release it
missed in, ``<profile>/<version>`` (``missed_hint``, from the edge's miss body). When the origin
serves that very release for the question, it skips both of the release's tiers, exact and
semantic (``origin/server/tiers.py``): the edge has just looked the question up in them. The
value is untrusted (``parse_missed`` checks its form): it can only make the origin skip that
lookup for its sender, never serve what it would not.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MISSED_HEADER = "x-edgeqa-missed"
# a profile and a version are plain names, as the store's paths are (release.py)
_MISSED = re.compile(r"([A-Za-z0-9_][A-Za-z0-9_.-]{0,127})/([A-Za-z0-9_][A-Za-z0-9_.-]{0,127})")


@dataclass(frozen=True)
class Missed:
    """The release a client's lookup at the edge has just missed in."""

    profile: str
    version: str

    def __str__(self) -> str:
        return f"{self.profile}/{self.version}"


def missed_hint(profile: object, version: object) -> str | None:
    """The ``MISSED_HEADER`` value for an edge miss in ``profile``'s ``version`` (the miss body's
    fields), or None when they do not make one: no release was searched, or a name that is not
    plain (the origin would refuse it)."""
    if not isinstance(profile, str) or not isinstance(version, str):
        return None
    hint = f"{profile}/{version}"
    return hint if _MISSED.fullmatch(hint) else None


def parse_missed(value: str) -> Missed:
    """``<profile>/<version>``, each a plain name of at most 128 characters; ``ValueError``
    saying what is wrong otherwise."""
    found = _MISSED.fullmatch(value)
    if found is None:
        raise ValueError(
            f"{MISSED_HEADER} must be <profile>/<version> (each [A-Za-z0-9_][A-Za-z0-9_.-]*, at "
            f"most 128 characters), got {value[:80]!r}"
        )
    return Missed(found[1], found[2])
