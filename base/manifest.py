"""The release manifest (``manifest.json``) as one typed model, validated once when it is read.

``docs/release-format.md`` describes the document; ``Manifest`` is that description in code. A
manifest is read from a store whose writer may be hostile, so the model holds it to the release
layout before anything it names is fetched: every file entry is a plain name under ``shards/``
or ``embedder/`` with a data format's suffix (never a pickle), an integer size under its kind's
cap and a 64-hex sha256; no file is listed twice; the release stays under ``MAX_RELEASE_FILES``
files and ``MAX_RELEASE_BYTES`` bytes.

A manifest is written back exactly as it was read (a derived release copies its parent's):
fields it does not name are kept (``extra="allow"``), fields it lacks stay absent
(``as_dict``: only the fields set), and numbers keep their type (``7`` stays ``7``, ``7.0``
stays ``7.0``), because its bytes are what the pointer and the signature hash. Fields added
after format 2 are optional, with the default readers have always used for a release without
them.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Annotated, Any, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)

from base.errors import EdgeQAError
from base.languages import DEFAULT_LANGUAGE

FORMAT = 3  # 3: answer objects addressed by content, shared by releases, under a key index
# read too: format 2 (an object per key inside each release), so the release that is current
# when a deployment moves to format 3 is still served, revoked from and built on; never written
READ_FORMATS = (2, 3)

# the most a release file may claim (and be) before it is fetched, parsed or deserialized
MAX_SHARD_FILE_BYTES = 1 << 30
MAX_EMBEDDER_FILE_BYTES = 512 << 20
MAX_RELEASE_FILES = 4096  # shard and embedder files a manifest may list (each once)
MAX_RELEASE_BYTES = 64 << 30
# what each folder of a release may hold: data formats only (an embedder never ships pickles)
SUFFIXES = {
    "shards": (".faiss", ".parquet"),
    "objects": (".parquet",),  # the digests of the answer objects the release holds (private)
    "embedder": (".json", ".safetensors", ".txt", ".model", ".md"),
}
PLAIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
_SHA256 = re.compile(r"[0-9a-f]{64}")


class FormatError(EdgeQAError, ValueError):
    """A release document (a manifest, a pointer) is not JSON of the release format's shape; the
    message names the fields at fault."""


def _number(value: Any) -> int | float:
    # JSON's int or float, kept as it is: a lax float would write 7 back as 7.0
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{value!r:.40} is not a number")
    return value


def _optional_number(value: Any) -> int | float | None:
    return None if value is None else _number(value)


Number = Annotated[int | float, PlainValidator(_number)]
OptionalNumber = Annotated[int | float | None, PlainValidator(_optional_number)]


def problems(error: ValidationError, limit: int = 3) -> str:
    """``error`` in one line, each problem led by the field it is in (``shards.0.rows.sha256``)."""
    found = []
    for item in error.errors(include_url=False)[:limit]:
        where = ".".join(str(part) for part in item["loc"])
        message = item["msg"].removeprefix("Value error, ")
        found.append(f"{where}: {message}" if where else message)
    more = error.error_count() - limit
    return "; ".join(found) + (f" (and {more} more)" if more > 0 else "")


class Document(BaseModel):
    """A JSON document of the release format, or a part of one."""

    model_config = ConfigDict(
        extra="allow", frozen=True, validate_by_name=True, validate_by_alias=True
    )

    @classmethod
    def of(cls, value: Any) -> Self:
        """``value`` (parsed JSON, or keyword fields) validated; ``FormatError`` naming the
        fields at fault."""
        if isinstance(value, cls):
            return value
        try:
            return cls.model_validate(value)
        except ValidationError as error:
            raise FormatError(problems(error)) from None

    @classmethod
    def from_json(cls, data: bytes | str) -> Self:
        try:
            value = json.loads(data)
        except (ValueError, RecursionError) as error:  # nested past the parser's depth
            raise FormatError(f"not JSON: {error}") from None
        return cls.of(value)

    def as_dict(
        self, *, include: set[str] | None = None, exclude: set[str] | None = None
    ) -> dict[str, Any]:
        """The document as JSON holds it: the fields it was given (absent ones stay absent),
        unknown ones included, under their JSON names."""
        return self.model_dump(by_alias=True, exclude_unset=True, include=include, exclude=exclude)


class FileEntry(Document):
    """A file of the release: ``shards/<n>.faiss`` or ``.parquet``, or one under ``embedder/``."""

    path: StrictStr
    size_bytes: StrictInt = Field(alias="bytes")
    sha256: StrictStr

    @field_validator("path")
    @classmethod
    def _in_layout(cls, path: str) -> str:
        folder, _, rest = path.partition("/")
        suffixes = SUFFIXES.get(folder, ())
        if not suffixes or not all(PLAIN_NAME.fullmatch(n) for n in rest.split("/")):
            raise ValueError(
                f"manifest path {path!r:.200} is not a plain file under {' or '.join(SUFFIXES)}/"
            )
        if not path.endswith(suffixes):
            raise ValueError(
                f"manifest path {path!r:.200}: {folder}/ holds only {', '.join(suffixes)}"
            )
        return path

    @model_validator(mode="after")
    def _capped(self) -> Self:
        # the caps are read here, at validation, so that a test may lower them
        shard = self.path.startswith(("shards/", "objects/"))
        cap = MAX_SHARD_FILE_BYTES if shard else MAX_EMBEDDER_FILE_BYTES
        if not 0 <= self.size_bytes <= cap:
            raise ValueError(
                f"manifest path {self.path!r}: size {self.size_bytes!r:.40} is not within 0..{cap}"
            )
        if not _SHA256.fullmatch(self.sha256):
            raise ValueError(
                f"manifest path {self.path!r}: sha256 {self.sha256!r:.80} is not a sha256"
            )
        return self


class ShardEntry(Document):
    """One shard: a FAISS index and its rows, ``count`` of each."""

    id: StrictInt | None = None
    count: StrictInt
    index: FileEntry
    rows: FileEntry


class Finetuned(Document):
    """How a shipped embedder was tuned (``precompute.build.finetuned_embedder``)."""

    base: StrictStr
    steps: StrictInt
    examples: StrictInt
    sha256: StrictStr


class EmbedderEntry(Document):
    """What embedded the release's phrasings; ``files``: the embedder itself, when it ships."""

    name: StrictStr
    dim: StrictInt
    finetuned: Finetuned | None = None
    files: list[FileEntry] = []


class ProfileEntry(Document):
    """The profile's name and the inputs hashed into it (model, template, prompt, ...)."""

    name: StrictStr
    inputs: dict[str, Any] = {}

    @property
    def language(self) -> str:
        """``en`` for a release made before languages."""
        return str(self.inputs.get("language", DEFAULT_LANGUAGE))

    @property
    def model(self) -> str:
        """The model that answered, '' when the inputs name none (a release made without)."""
        return str(self.inputs.get("model", ""))


class IndexSettings(Document):
    """The FAISS factory of the largest shard and its knobs."""

    factory: StrictStr
    ef_construction: StrictInt
    ef_search: StrictInt
    nprobe: StrictInt


class Threshold(Document):
    """The semantic tier's decision (``semantic.matcher``) and what calibration showed of it;
    ``semantic``: whether readers serve semantic hits at all. Every field has the default
    readers gave a release without it (``vote_k`` None: the matcher's ``VOTE_K``)."""

    value: Number = 0.9
    margin: OptionalNumber = 0.0
    agreement: OptionalNumber = 0.0
    vote_k: StrictInt | None = None
    calibrated: StrictBool | None = None
    semantic: StrictBool = False
    semantic_off_reason: StrictStr | None = None
    target_precision: OptionalNumber = None
    precision: OptionalNumber = None
    precision_lower_bound: OptionalNumber = None
    hit_rate: OptionalNumber = None
    recall: OptionalNumber = None
    out_of_scope_hit_rate: OptionalNumber = None
    out_of_scope_share: OptionalNumber = None
    samples: StrictInt | None = None
    held_back_samples: StrictInt | None = None
    z: OptionalNumber = None
    method: StrictStr | None = None
    # [threshold, leave-one-out precision (None: no hit), hit rate] along the calibration grid
    curve: list[list[OptionalNumber]] = []


class GuardFlags(Document):
    """The guard's checks the threshold was calibrated with (``semantic.guard.Guard``): a
    check this reader does not know is refused, never skipped."""

    model_config = ConfigDict(extra="forbid")

    numbers: StrictBool = True
    negations: StrictBool = True
    entities: StrictBool = True


class Objects(Document):
    """The exact tier (``answer_objects.py``): ``count`` answer objects under the profile's
    ``prefix`` (``a/``), addressed by their sha256 (``integrity``: each row's ``object_sha256``);
    the key index's ``buckets`` under the release's ``index`` (``k/``), a bucket per
    ``key_digits`` hex digits of a key; ``digests``: every object's sha256, sorted (what prune
    keeps and the next night does not write again)."""

    prefix: StrictStr
    count: StrictInt
    integrity: StrictStr
    index: StrictStr | None = None  # None in format 2 only (as the three below)
    buckets: StrictInt | None = None
    key_digits: StrictInt | None = None
    digests: FileEntry | None = None


class Counts(Document):
    clusters: StrictInt
    rows: StrictInt


class Expiry(Document):
    ttl_days: Number
    jitter: Number


class LogRange(Document):
    """The log days mined (ISO dates, both included)."""

    since: StrictStr
    until: StrictStr


class Mining(Document):
    """The mining rules the release was built with (``precompute.config.MiningConfig``)."""

    k: StrictInt
    top_n: StrictInt
    half_life_days: Number
    carry_half_lives: OptionalNumber = None
    cluster_threshold: Number


class Revoked(Document):
    """The revocations in force when the release was built (``precompute/revocations.py``):
    their ids, clusters and phrasing keys (never served), and the signed list's ``sequence``
    (0: an unsigned list, or one from before lists were signed)."""

    ids: list[StrictStr] = []
    clusters: list[StrictStr] = []
    keys: list[StrictStr] = []
    sequence: StrictInt = 0


class Derived(Document):
    """A release derived from another without some rows (a revocation)."""

    from_version: StrictStr = Field(alias="from")
    by: StrictStr
    runner: StrictStr


class Manifest(Document):
    """``manifest.json``: a release, completely (``docs/release-format.md``)."""

    format: StrictInt
    version: StrictStr
    profile: ProfileEntry
    embedder: EmbedderEntry
    metric: StrictStr
    index: IndexSettings
    threshold: Threshold
    guard: GuardFlags
    shards: list[ShardEntry]
    objects: Objects
    counts: Counts
    expiry: Expiry
    content_sha256: StrictStr
    answers_root: StrictStr  # the Merkle root over the answer objects (``proofs.py``)
    created_at: StrictStr  # ISO 8601 with a zone
    excluded_clusters: dict[str, StrictInt] = {}  # left out at generation and build, by reason
    excluded_rows: dict[str, StrictInt] = {}  # log rows mining left out, by reason
    parent: StrictStr | None = None  # the release it was built on
    run_id: StrictStr | None = None  # the run's work area (``precompute/workarea.py``)
    runner: StrictStr | None = None  # airflow, cli, demo
    log_range: LogRange | None = None
    mining: Mining | None = None
    revoked: Revoked | None = None
    derived: Derived | None = None

    @field_validator("format")
    @classmethod
    def _this_format(cls, found: int) -> int:
        if found not in READ_FORMATS:
            raise ValueError(f"format {found} is not {FORMAT}, the one this reader reads")
        return found

    @model_validator(mode="after")
    def _objects_of_its_format(self) -> Self:
        fields = (self.objects.index, self.objects.buckets, self.objects.digests)
        if self.format == FORMAT and any(field is None for field in fields):
            raise ValueError("objects: a format-3 release names its key index and digests")
        return self

    @field_validator("created_at")
    @classmethod
    def _a_time(cls, found: str) -> str:
        try:
            zoned = datetime.fromisoformat(found).tzinfo is not None
        except ValueError:
            zoned = False
        if not zoned:
            raise ValueError(f"{found!r:.60} is not an ISO 8601 time with a zone")
        return found

    @model_validator(mode="after")
    def _bounded(self) -> Self:
        files = self.files
        paths = {entry.path for entry in files}
        if len(paths) != len(files) or len(files) > MAX_RELEASE_FILES:
            raise ValueError(f"files listed twice, or more than {MAX_RELEASE_FILES}")
        total = sum(entry.size_bytes for entry in files)
        if total > MAX_RELEASE_BYTES:
            raise ValueError(f"{total} bytes listed, over {MAX_RELEASE_BYTES}")
        return self

    @property
    def files(self) -> list[FileEntry]:
        """Every file the manifest lists: each shard's index and rows, then the embedder's."""
        shards = [e for s in self.shards for e in (s.index, s.rows)]
        digests = [self.objects.digests] if self.objects.digests is not None else []
        return [*shards, *digests, *self.embedder.files]

    @property
    def created(self) -> datetime:
        return datetime.fromisoformat(self.created_at)

    def to_json(self) -> bytes:
        """``manifest.json``'s bytes: what the pointer's ``manifest_sha256`` hashes."""
        return json.dumps(self.as_dict(), indent=2, sort_keys=True).encode()
