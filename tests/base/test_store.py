"""The store: the same behaviour over file:// and s3:// (moto server on loopback)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from base.store import (
    FileStore,
    ObjectNotFoundError,
    ObjectTooLargeError,
    PreconditionFailedError,
    S3Store,
    Store,
    TransientStoreError,
    open_store,
    with_retries,
)
from tests.s3proxy import FaultyS3


@pytest.fixture(params=["file", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    if request.param == "file":
        return open_store(f"file://{tmp_path}/root")
    bucket = request.getfixturevalue("s3_bucket")
    return open_store(f"s3://{bucket}/some/prefix")


def test_put_get_list_exists_delete(store: Store) -> None:
    store.put("a/b/one.json", b'{"x": 1}', "application/json")
    store.put("a/two.bin", b"\x00\x01")
    store.put("other/three", b"3")
    assert store.get("a/b/one.json") == b'{"x": 1}'
    assert store.exists("a/two.bin")
    assert not store.exists("a/missing")
    assert store.list("a") == ["a/b/one.json", "a/two.bin"]
    assert store.list() == ["a/b/one.json", "a/two.bin", "other/three"]
    assert store.list("nothing/here") == []
    assert store.list("a/b") == ["a/b/one.json"]
    # a prefix is a folder: "a/tw" is not a prefix of "a/two.bin"
    assert store.list("a/tw") == []
    store.delete("a/two.bin")
    assert store.list("a") == ["a/b/one.json"]
    assert store.delete_prefix("a") == 1
    assert store.list() == ["other/three"]
    with pytest.raises(ObjectNotFoundError):
        store.get("a/b/one.json")


def test_child_store_is_rooted_at_its_prefix(store: Store) -> None:
    store.put("p/x/y", b"1")
    child = store.child("p")
    assert child.get("x/y") == b"1"
    assert child.list() == ["x/y"]


def test_conditional_pointer_write(store: Store) -> None:
    first = store.put_if("profile/current.json", b'{"version": "1"}', None)
    # a second "first write" loses
    with pytest.raises(PreconditionFailedError):
        store.put_if("profile/current.json", b'{"version": "x"}', None)
    data, etag = store.get_with_etag("profile/current.json")
    assert data == b'{"version": "1"}' and etag == first
    second = store.put_if("profile/current.json", b'{"version": "2"}', etag)
    # writing against the old ETag loses and changes nothing
    with pytest.raises(PreconditionFailedError):
        store.put_if("profile/current.json", b'{"version": "3"}', etag)
    data, etag = store.get_with_etag("profile/current.json")
    assert data == b'{"version": "2"}' and etag == second


def test_racing_conditional_writes_have_exactly_one_winner(store: Store) -> None:
    store.put_if("p/current.json", b"0", None)
    _, etag = store.get_with_etag("p/current.json")
    barrier = threading.Barrier(8)
    outcomes: list[str] = []

    def writer(n: int) -> None:
        barrier.wait()
        try:
            store.put_if("p/current.json", f"{n}".encode() * 3, etag)
            outcomes.append(f"won:{n}")
        except PreconditionFailedError:
            outcomes.append("lost")

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [o for o in outcomes if o.startswith("won")]
    assert len(winners) == 1 and outcomes.count("lost") == 7
    assert store.get("p/current.json") == winners[0].split(":")[1].encode() * 3


def test_put_file_and_large_object(store: Store, tmp_path: Path) -> None:
    local = tmp_path / "big.bin"
    payload = bytes(range(256)) * 40_000  # 10 MB
    local.write_bytes(payload)
    store.put_file("shards/00000.faiss", local)
    assert store.get("shards/00000.faiss") == payload
    # a bounded read takes what fits and refuses the rest without reading it
    assert store.get("shards/00000.faiss", max_bytes=len(payload)) == payload
    with pytest.raises(ObjectTooLargeError, match=str(len(payload) - 1)):
        store.get("shards/00000.faiss", max_bytes=len(payload) - 1)
    with pytest.raises(ObjectTooLargeError):
        store.get_with_etag("shards/00000.faiss", max_bytes=0)
    # written to a local file a chunk at a time (11 chunks of 1 MiB here), bounded the same way
    copy = tmp_path / "copy.bin"
    assert store.get_file("shards/00000.faiss", copy, max_bytes=len(payload)) == len(payload)
    assert copy.read_bytes() == payload
    copy.write_bytes(b"older and longer" * 10**6)  # replaced, not appended to
    assert store.get_file("shards/00000.faiss", copy) == len(payload)
    assert copy.read_bytes() == payload
    with pytest.raises(ObjectTooLargeError, match=str(len(payload) - 1)):
        store.get_file("shards/00000.faiss", copy, max_bytes=len(payload) - 1)
    with pytest.raises(ObjectNotFoundError):
        store.get_file("shards/missing.faiss", copy)


def test_bad_paths_and_uris_are_refused(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    with pytest.raises(ValueError, match=r"\.\."):
        store.put("../escape", b"x")
    for uri in ("", "s3://", "ftp://host/x"):
        with pytest.raises(ValueError):
            open_store(uri)
    assert isinstance(open_store("s3://bucket/pre/fix"), S3Store)
    assert open_store(f"file://{tmp_path}").root == tmp_path.resolve()  # type: ignore[attr-defined]
    assert open_store(str(tmp_path)).root == tmp_path.resolve()  # type: ignore[attr-defined]


def test_with_retries_gives_up_after_the_budget() -> None:
    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise TransientStoreError("try again")
        return "ok"

    assert with_retries(flaky, retries=3, base_s=0.001) == "ok"

    def always() -> str:
        calls.append(1)
        raise TransientStoreError("down")

    calls.clear()
    with pytest.raises(TransientStoreError):
        with_retries(always, retries=2, base_s=0.001)
    assert len(calls) == 3  # the call and two retries


def test_s3_transient_errors_are_retried(
    s3_bucket: str, s3_proxy: type[FaultyS3], tmp_path: Path
) -> None:
    store = open_store(f"s3://{s3_bucket}/r", retries=3)
    s3_proxy.failures_left = 2
    store.put("x.json", b"{}")
    assert s3_proxy.failures_left == 0
    s3_proxy.failures_left = 3
    assert store.get("x.json") == b"{}"
    s3_proxy.failures_left = 2
    assert store.get_file("x.json", tmp_path / "x.json") == 2
    assert (tmp_path / "x.json").read_bytes() == b"{}" and s3_proxy.failures_left == 0
    s3_proxy.failures_left = 10
    with pytest.raises(TransientStoreError, match="SlowDown"):
        store.get("x.json")
    assert s3_proxy.failures_left == 10 - 4  # the call and 3 retries: botocore adds none


def test_bulk_writes_never_overwrite_and_deletes_go_in_batches(store: Store) -> None:
    """``put_many`` writes only where nothing is (a second pass writes nothing and changes
    nothing); the listing is lazy and dated; ``delete_prefix`` deletes in bulk: on S3 as
    ``DeleteObjects`` batches of 1,000 keys."""
    items = [(f"a/{i % 7:02x}/{i:05d}.json", f'{{"n": {i}}}'.encode(), None) for i in range(1050)]
    first = store.put_many(items)
    assert (first.written, first.existed) == (1050, 0) and first.bytes > 0
    again = store.put_many((path, b"changed", None) for path, _, _ in items)
    assert (again.written, again.existed, again.bytes) == (0, 1050, 0)
    assert store.get("a/03/00003.json") == b'{"n": 3}'
    assert store.put_new("a/03/00003.json", b"x") is False and store.put_new("b/new", b"x")
    listed = list(store.scan("a"))
    assert sorted(found.path for found in listed) == sorted(path for path, _, _ in items)
    assert all(found.size > 0 and found.modified > 1.7e9 for found in listed)
    batches: list[int] = []
    if isinstance(store, S3Store):

        def count(params: dict, **_: object) -> None:  # type: ignore[type-arg]
            batches.append(len(params["Delete"]["Objects"]))

        store.client.meta.events.register("provide-client-params.s3.DeleteObjects", count)
    assert store.delete_prefix("a") == 1050
    assert store.list("a") == [] and store.list("b") == ["b/new"]
    if isinstance(store, S3Store):
        assert sorted(batches) == [50, 1000]


def test_a_bulk_transfer_keeps_its_workers_busy_and_its_results_in_order() -> None:
    """``bounded_map``: ``workers`` calls at once (eight calls meet at a barrier only when eight
    run together), results in the items' order, and no more than ``workers × ahead`` items taken
    from the iterable before their results are handed back."""
    from base.store import bounded_map

    meet = threading.Barrier(8, timeout=60)
    taken = []

    def items():  # type: ignore[no-untyped-def]
        for i in range(200):
            taken.append(i)
            yield i

    def work(i: int) -> int:
        if i < 8:
            meet.wait()  # broken (an error) unless eight run at once
        return i * i

    results = []
    for result in bounded_map(work, items(), workers=8, ahead=2):
        results.append(result)
        assert len(taken) - len(results) <= 8 * 2
    assert results == [i * i for i in range(200)]


def test_the_s3_pool_is_as_large_as_the_requests_in_flight(
    s3_bucket: str, monkeypatch: pytest.MonkeyPatch, s3_proxy: type[FaultyS3]
) -> None:
    from base.config import ConfigError

    store = open_store(f"s3://{s3_bucket}/r")
    assert isinstance(store, S3Store) and store.concurrency == 128
    assert store.client.meta.config.max_pool_connections == 128
    monkeypatch.setenv("EDGEQA_S3_CONCURRENCY", "256")
    wide = open_store(f"s3://{s3_bucket}/r")
    assert isinstance(wide, S3Store) and wide.client.meta.config.max_pool_connections == 256
    assert wide.child("x").concurrency == 256
    monkeypatch.setenv("EDGEQA_S3_CONCURRENCY", "0")
    with pytest.raises(ConfigError, match="EDGEQA_S3_CONCURRENCY must be at least 1"):
        open_store(f"s3://{s3_bucket}/r")
    # a batch delete that meets a throttle is tried again
    store.put_many((f"d/{i}", b"x", None) for i in range(3))
    s3_proxy.failures_left = 1
    assert store.delete_many(f"d/{i}" for i in range(3)) == 3
    assert s3_proxy.failures_left == 0 and store.list("d") == []


def test_files_written_on_processes_are_written_once_and_a_failure_stops_the_write(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``put_files`` on two processes, three files handed to one at a time, each process
    opening the store again by its URI: every file written once (a second pass writes
    nothing), the counts and bytes those of ``put_many``; a file that is not there fails the
    write, naming it."""
    import base.store as store_module
    from base.store import put_files

    monkeypatch.setattr(store_module, "PROCESS_BATCH", 3)
    files = tmp_path / "files"
    files.mkdir()
    items = []
    for i in range(10):
        (files / f"{i}.json").write_bytes(f'{{"n": {i}}}'.encode())
        items.append((f"a/{i:02d}.json", files / f"{i}.json", "application/json"))
    first = put_files(store, iter(items), 2)
    size = sum(path.stat().st_size for _, path, _ in items)
    assert (first.written, first.existed, first.bytes) == (10, 0, size)
    again = put_files(store, iter(items), 2)
    assert (again.written, again.existed, again.bytes) == (0, 10, 0)
    assert store.get("a/03.json") == b'{"n": 3}' and len(store.list("a")) == 10
    with pytest.raises(Exception, match=r"missing\.json"):
        put_files(store, iter([("b/x.json", files / "missing.json", None)]), 2)
