"""A mined question and its wordings: what mining (``mining.py``) hands to generation and build,
and what a run's work area keeps (``hot/``, a Parquet dataset of ``hot_schema`` rows: one per
question, its wordings nested) for the stages after mine and the next night to carry."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa


def askers(users: Collection[str], networks: Collection[str]) -> int:
    """Distinct people, as far as the logs can tell: users and networks, the fewer (no networks:
    evidence from before they were logged)."""
    return askers_count(len(users), len(networks))


def askers_count(users: int, networks: int) -> int:
    """``askers`` from the counts of distinct users and networks."""
    return min(users, networks) if networks else users


def askers_counts(users: np.ndarray, networks: np.ndarray) -> np.ndarray:
    """``askers_count`` of each pair of counts, over arrays (every cluster of a night at once)."""
    import numpy as np

    return np.where(networks > 0, np.minimum(users, networks), users)


def crowd(wordings: Iterable[Phrasing]) -> tuple[int, int]:
    """The crowd rule's counts over ``wordings`` (``MiningConfig.verified_crowd``): their distinct
    signed users and distinct autonomous systems, each once whichever wordings it typed (plus
    those counted beyond the kept ones, per wording)."""
    signers: set[str] = set()
    asns: set[str] = set()
    more = [0, 0]
    for wording in wordings:
        signers.update(wording.latest_by_signer)
        asns.update(wording.latest_by_asn)
        more[0] += wording.more_signers
        more[1] += wording.more_asns
    return len(signers) + more[0], len(asns) + more[1]


@dataclass
class Phrasing:
    """One wording (one key) and who asked it. ``users``/``networks`` hold the latest askers,
    at most ``MiningConfig.askers_kept`` (>= k) of each, with their latest asks; ``more_users``
    and ``more_networks`` count the others (``logwindow.py``: why that decides k exactly), and
    ``more_weight`` sums the others' recency weights as of the run (not kept in ``hot/``).
    ``latest_by_signer``: those of the kept users who came with a signed token, ``more_signers``
    the others who did; ``latest_by_asn`` and ``more_asns``: the viewers' autonomous systems,
    kept and counted as networks (the crowd rule's evidence, ``mining.py``)."""

    key: str
    normalized: str
    question: str  # the most common raw form
    users: set[str]
    hits: int
    latest_by_user: dict[str, datetime]
    networks: set[str] = field(default_factory=set)
    latest_by_network: dict[str, datetime] = field(default_factory=dict)
    more_users: int = 0
    more_networks: int = 0
    more_weight: float = 0.0
    latest_by_signer: dict[str, datetime] = field(default_factory=dict)
    latest_by_asn: dict[str, datetime] = field(default_factory=dict)
    more_signers: int = 0
    more_asns: int = 0

    @property
    def user_count(self) -> int:
        return len(self.users) + self.more_users

    @property
    def askers(self) -> int:
        """Distinct people, as far as the logs can tell: users and networks, the fewer."""
        return askers_count(self.user_count, len(self.networks) + self.more_networks)

    def as_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "normalized": self.normalized,
            "question": self.question,
            "users": sorted(self.users),
            "hits": self.hits,
            "latest_by_user": {u: t.isoformat() for u, t in self.latest_by_user.items()},
            "networks": sorted(self.networks),
            "latest_by_network": {n: t.isoformat() for n, t in self.latest_by_network.items()},
            **({"more_users": self.more_users} if self.more_users else {}),
            **({"more_networks": self.more_networks} if self.more_networks else {}),
            "latest_by_signer": {s: t.isoformat() for s, t in self.latest_by_signer.items()},
            "latest_by_asn": {a: t.isoformat() for a, t in self.latest_by_asn.items()},
            **({"more_signers": self.more_signers} if self.more_signers else {}),
            **({"more_asns": self.more_asns} if self.more_asns else {}),
        }

    def as_row(self) -> dict[str, Any]:
        """``phrasing_type``'s value: the askers and their latest asks as lists, times as times."""
        return {
            "key": self.key,
            "normalized": self.normalized,
            "question": self.question,
            "users": sorted(self.users),
            "hits": self.hits,
            "latest_by_user": _seen_rows(self.latest_by_user),
            "networks": sorted(self.networks),
            "latest_by_network": _seen_rows(self.latest_by_network),
            "more_users": self.more_users,
            "more_networks": self.more_networks,
            "latest_by_signer": _seen_rows(self.latest_by_signer),
            "latest_by_asn": _seen_rows(self.latest_by_asn),
            "more_signers": self.more_signers,
            "more_asns": self.more_asns,
        }

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Phrasing:
        if "users" not in row:  # without its askers (``without_askers``): counted, not named
            return cls(
                row["key"],
                row["normalized"],
                row["question"],
                set(),
                row["hits"],
                {},
                more_users=row["more_users"],
                more_networks=row["more_networks"],
                more_signers=row["more_signers"],
                more_asns=row["more_asns"],
            )
        return cls(
            row["key"],
            row["normalized"],
            row["question"],
            set(row["users"]),
            row["hits"],
            _seen(row["latest_by_user"]),
            set(row["networks"]),
            _seen(row["latest_by_network"]),
            row["more_users"],
            row["more_networks"],
            latest_by_signer=_seen(row["latest_by_signer"]),
            latest_by_asn=_seen(row["latest_by_asn"]),
            more_signers=row["more_signers"],
            more_asns=row["more_asns"],
        )

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Phrasing:
        latest = {u: datetime.fromisoformat(t) for u, t in d["latest_by_user"].items()}
        users, networks = set(d["users"]), set(d.get("networks", ()))
        by_network = {
            n: datetime.fromisoformat(t) for n, t in d.get("latest_by_network", {}).items()
        }
        if networks - set(by_network):  # mined before networks were dated: as old as the oldest ask
            oldest = min(latest.values())
            by_network.update({n: oldest for n in networks - set(by_network)})
        return cls(
            d["key"],
            d["normalized"],
            d["question"],
            users,
            d["hits"],
            latest,
            networks,
            by_network,
            int(d.get("more_users", 0)),
            int(d.get("more_networks", 0)),
            # mined before they were kept: no signed user, no AS (the crowd rule's safe side)
            latest_by_signer={
                s: datetime.fromisoformat(t) for s, t in d.get("latest_by_signer", {}).items()
            },
            latest_by_asn={
                a: datetime.fromisoformat(t) for a, t in d.get("latest_by_asn", {}).items()
            },
            more_signers=int(d.get("more_signers", 0)),
            more_asns=int(d.get("more_asns", 0)),
        )


@dataclass
class HotQuestion:
    """A cluster of wordings answered once. ``phrasings``: those published, canonical first;
    ``held_back``: those asked but not published, as a content token of theirs was typed by
    fewer than k of the cluster's askers (``rare_tokens``: how many, by wording key). Their
    askers count all the same. ``synthesized``: no wording was k-safe, and the canonical
    question was built from k-safe tokens (``safe_question``): typed by no one as it is."""

    canonical: Phrasing
    phrasings: list[Phrasing]  # published, canonical first
    users: int  # the cluster's askers: distinct users and networks (the fewer), each once
    hits: int
    score: float
    held_back: list[Phrasing] = field(default_factory=list)
    rare_tokens: dict[str, int] = field(default_factory=dict)
    synthesized: bool = False

    @property
    def key(self) -> str:
        return self.canonical.key

    @property
    def question(self) -> str:
        return self.canonical.question

    @property
    def wordings(self) -> list[Phrasing]:
        """What people typed: the published wordings (not a built question) and the held back."""
        typed = self.phrasings[1:] if self.synthesized else self.phrasings
        return [*typed, *self.held_back]

    def report_row(self, status: str) -> dict[str, Any]:
        """The run's row for this cluster: how many askers, which wordings were published, which
        held back and why (by key: their text is what must not leave the work area)."""
        return {
            "cluster": self.key,
            "status": status,
            "identities": self.users,
            "question": self.question,
            "synthesized": self.synthesized,
            "published": [
                {"key": p.key, "question": p.question, "identities": p.askers}
                for p in self.phrasings
            ],
            "held_back": held_back_rows(self.held_back, self.rare_tokens),
        }

    def as_dict(self) -> dict[str, Any]:
        return {
            "phrasings": [p.as_dict() for p in self.phrasings],  # canonical first
            "held_back": [p.as_dict() for p in self.held_back],
            "rare_tokens": self.rare_tokens,
            "synthesized": self.synthesized,
            "users": self.users,
            "hits": self.hits,
            "score": self.score,
        }

    def as_row(self) -> dict[str, Any]:
        """``hot_schema``'s row: the question's key and text first (what generation reads), its
        wordings nested."""
        return {
            "key": self.key,
            "question": self.question,
            "phrasings": [p.as_row() for p in self.phrasings],  # canonical first
            "held_back": [p.as_row() for p in self.held_back],
            "rare_tokens": [{"key": k, "count": n} for k, n in self.rare_tokens.items()],
            "synthesized": self.synthesized,
            "users": self.users,
            "hits": self.hits,
            "score": self.score,
        }

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> HotQuestion:
        phrasings = [Phrasing.from_row(p) for p in row["phrasings"]]
        return cls(
            phrasings[0],
            phrasings,
            row["users"],
            row["hits"],
            row["score"],
            [Phrasing.from_row(p) for p in row["held_back"]],
            {r["key"]: r["count"] for r in row["rare_tokens"]},
            row["synthesized"],
        )

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> HotQuestion:
        phrasings = [Phrasing.from_dict(p) for p in d["phrasings"]]
        return cls(
            phrasings[0],
            phrasings,
            d["users"],
            d["hits"],
            d["score"],
            [Phrasing.from_dict(p) for p in d.get("held_back", ())],  # mined before it was kept
            dict(d.get("rare_tokens", {})),
            bool(d.get("synthesized", False)),
        )


def held_back_rows(wordings: Iterable[Phrasing], rare: dict[str, int]) -> list[dict[str, Any]]:
    return [
        {"key": p.key, "reason": "rare_tokens", "rare_tokens": rare[p.key], "identities": p.askers}
        for p in wordings
    ]


def hot_schema() -> pa.Schema:
    """A mined question as one Parquet row (``HotQuestion.as_row``): ``key`` and ``question``
    first, for what reads only them (generation), the wordings nested (``phrasing_type``)."""
    import pyarrow as pa

    wording = phrasing_type()
    return pa.schema(
        [
            ("key", pa.string()),
            ("question", pa.string()),
            ("phrasings", pa.list_(wording)),
            ("held_back", pa.list_(wording)),
            ("rare_tokens", pa.list_(pa.struct([("key", pa.string()), ("count", pa.int64())]))),
            ("synthesized", pa.bool_()),
            ("users", pa.int64()),
            ("hits", pa.int64()),
            ("score", pa.float64()),
        ]
    )


# what a wording keeps without its askers (``without_askers``), and how each count is made:
# the askers named (a list), and those only counted
_KEPT = ("key", "normalized", "question", "hits")
_COUNTS = {
    "more_users": "users",
    "more_networks": "networks",
    "more_signers": "latest_by_signer",
    "more_asns": "latest_by_asn",
}


def without_askers(table: pa.Table) -> pa.Table:
    """Mined questions (``hot_schema``) with each wording's askers, networks, signers and
    autonomous systems, and their latest asks, left out, their numbers kept (``more_users``
    and the like: every one counted, none named, so ``user_count`` and ``askers`` are the
    same): what ranking, counting and building a release need, read back as ``HotQuestion``s
    (``from_row``) 9.3× as fast (``scale.py --hot-read``: 55.2 µs a question of five wordings
    against 511.2), for decoding the nested lists and times into Python was most of a read."""
    import pyarrow as pa
    import pyarrow.compute as pc

    out = table.drop_columns(["phrasings", "held_back"])
    for name in ("phrasings", "held_back"):
        lists = table.column(name).combine_chunks()
        wordings = lists.flatten()  # the wordings of every row, in order (offsets honoured)
        fields = [pc.struct_field(wordings, field) for field in _KEPT]
        for more, named in _COUNTS.items():
            listed = pc.fill_null(pc.list_value_length(pc.struct_field(wordings, named)), 0)
            fields.append(pc.add(listed, pc.struct_field(wordings, more)))
        slim = pa.StructArray.from_arrays(fields, names=[*_KEPT, *_COUNTS])
        offsets = pc.subtract(lists.offsets, lists.offsets[0])
        out = out.append_column(name, pa.ListArray.from_arrays(offsets, slim))
    return out


def cluster_report_schema() -> pa.Schema:
    """A row of the run's cluster report (``HotQuestion.report_row``, ``mining.py``): a cluster
    that reached k, its askers, the wordings it published and those held back (by key), and
    what became of it; ``signed_users`` and ``asns`` only for an ``unverified_crowd``."""
    import pyarrow as pa

    string, integer = pa.string(), pa.int64()
    published = pa.struct([("key", string), ("question", string), ("identities", integer)])
    held_back = pa.struct(
        [("key", string), ("reason", string), ("rare_tokens", integer), ("identities", integer)]
    )
    return pa.schema(
        [
            ("cluster", string),
            ("status", string),
            ("identities", integer),
            ("signed_users", integer),
            ("asns", integer),
            ("question", string),
            ("synthesized", pa.bool_()),
            ("published", pa.list_(published)),
            ("held_back", pa.list_(held_back)),
        ]
    )


def phrasing_type() -> pa.DataType:
    """A wording (``Phrasing.as_row``): the latest askers as lists of (id, time), in UTC."""
    import pyarrow as pa

    seen = pa.list_(pa.struct([("id", pa.string()), ("at", pa.timestamp("us", tz="UTC"))]))
    return pa.struct(
        [
            ("key", pa.string()),
            ("normalized", pa.string()),
            ("question", pa.string()),
            ("users", pa.list_(pa.string())),
            ("hits", pa.int64()),
            ("latest_by_user", seen),
            ("networks", pa.list_(pa.string())),
            ("latest_by_network", seen),
            ("more_users", pa.int64()),
            ("more_networks", pa.int64()),
            ("latest_by_signer", seen),
            ("latest_by_asn", seen),
            ("more_signers", pa.int64()),
            ("more_asns", pa.int64()),
        ]
    )


def _seen_rows(latest: dict[str, datetime]) -> list[dict[str, Any]]:
    return [{"id": who, "at": at} for who, at in latest.items()]


def _seen(rows: Iterable[dict[str, Any]]) -> dict[str, datetime]:
    return {row["id"]: row["at"] for row in rows}
