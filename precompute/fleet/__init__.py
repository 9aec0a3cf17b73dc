"""Where the nightly job's model stages run: Ray, on this machine or on a GPU fleet.

Embedding the night's distinct wordings (mining's rule 5) and generating the hot questions'
answers are Ray Data jobs: ``map_batches`` over an actor pool, one model (embedder or engine)
per actor, built once and kept for every batch the actor is handed — one actor per GPU on a
cluster, one per CPU slot locally. The code in the actor is the in-process code
(``clustering.embed``'s ``encode_chunks``, ``generate.generate_partition`` with the origin's
``build_engine``), so the vectors and the tokens are the ones this process would make.

Where Ray is (``EDGEQA_RAY_ADDRESS``):

- unset: a local Ray, started by the first job of the process with one CPU slot per core
  (``EDGEQA_RAY_WORKERS`` to cap it) and kept for the process: ``make demo``, the tests,
  ``edgeqa precompute run`` on a laptop. A Ray this process already joined (a test session's)
  is used as it is; a stage run as a Ray Job joins its job's Ray (Ray's ``RAY_ADDRESS``).
- set: the cluster there (``ray://head:10001``, Ray Client: this process is the driver, the
  actors run on the cluster's GPU workers, which its autoscaler starts for the job). The
  workers run the project's image (``Dockerfile``) and reach the store with their own role.
  ``auto`` joins whichever Ray Ray's discovery finds (``RAY_ADDRESS``, else the one last started
  on this machine, whoever started it): it is handed none of this process's ``AWS_*``
  credentials, even on this machine; its workers reach the store with their own.

The actors of a local Ray (one this process started, or named on this machine) get this
process's store credentials (``AWS_*``). Ray 2.60 binds a local Ray's GCS, raylet and workers to
every interface, not loopback (``ray.init`` replaces a node address of 127.0.0.1 with the
routable one): Ray's token authentication, on by default for a new local Ray, is what keeps the
network out, so none is started with ``RAY_AUTH_MODE=disabled``; its dashboard is not started.

This module connects (``connect``) and says where things ran; the jobs are ``embedding.py``
(mining's wordings) and ``generation.py`` (the answers, checkpointed per partition; with
``llm.py``'s vLLM or HTTP server instead of the project's engine: ``EDGEQA_GENERATION_ENGINE``;
``generation_job.py``: what such a job is, whichever engine answers);
``jobs.py`` submits a whole stage as a Ray Job (what each task of the Airflow DAG does).
"""

from __future__ import annotations

import logging
import os
import re
import socket
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from base.config import usable_cpus
from base.errors import EdgeQAError

if TYPE_CHECKING:
    from origin.config import EngineSettings
    from precompute.config import PrecomputeSettings

log = logging.getLogger(__name__)

# what a local Ray keeps in shared memory: the blocks in flight (a chunk of wordings, their
# vectors, a partition's questions), never the night's data
LOCAL_OBJECT_STORE_BYTES = 256 << 20
# times a lost worker's actor is restarted (and its batch retried) before the job fails
ACTOR_RESTARTS = 3
# the GPU workers a job on a fleet asks its autoscaler for at most (``EDGEQA_RAY_WORKERS``
# unset): a fleet scaled to zero has none to count
FLEET_WORKERS = 8
# the environment a local Ray's workers need from this process to reach the same store as it
# (a cluster's workers have their own: the role of their service account, the image's)
_LOCAL_ENV = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_DEFAULT_REGION",
    "AWS_REGION",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "HF_HUB_OFFLINE",
)
# the settings an actor never needs: left out of what is shipped to it
_SECRETS = ("user_salt", "identity_secret", "signing_key", "signing_kms_key", "metrics_token")


class FleetError(EdgeQAError, RuntimeError):
    """Ray could not be started or reached, or a job failed."""


@dataclass(frozen=True)
class Fleet:
    """The Ray this process runs its model stages on."""

    address: str  # "" = a local Ray started by this process
    local: bool  # this machine's Ray (started here, or joined on loopback: a test session's)
    workers: int  # the most actors one job runs at once
    gpus: float  # per actor: 1 where the actors answer on GPUs, else 0
    cpu_resource: str = ""  # what a CPU worker offers (``EDGEQA_RAY_CPU_RESOURCE``; "": none)
    # found by Ray's discovery (``EDGEQA_RAY_ADDRESS=auto``): not this run's to hand credentials
    discovered: bool = False

    def where(self, workers: int) -> str:
        """What the run report says a job ran on: ``ray (local, 2 workers)``."""
        kind = "GPU workers" if self.gpus else "workers"
        kind = kind[:-1] if workers == 1 else kind
        return f"ray ({self.address or 'local'}, {workers} {kind})"

    def actors(self, blocks: int) -> dict[str, Any]:
        """``map_batches``' arguments for an actor pool over ``blocks`` blocks: never more
        actors than blocks (an idle actor still loads its model), and locally the CPU slots'
        threads shared out among them; on a cluster the pool starts at one and grows as the
        autoscaler brings GPUs (``reserve_gpus`` asks for them all at once). A batch goes only
        to an idle actor: the first actor ready would otherwise queue the first batches while
        the others still load their models (measured: 40,000 wordings in 3 blocks ran at 281/s
        on 2 workers, against 457/s in one process)."""
        from ray.data import ActorPoolStrategy

        most = max(1, min(self.workers, blocks))
        resources: dict[str, Any] = {"num_gpus": self.gpus} if self.gpus else {"num_cpus": 1}
        # a lost worker's actor is restarted and its batch retried, a few times, not forever: a
        # partition that kills every worker it meets (out of memory, a CUDA fault) fails the
        # job, whose finished partitions stay written for the retry
        resources.update(max_restarts=ACTOR_RESTARTS, max_task_retries=ACTOR_RESTARTS)
        if self.local:
            # a Ray found by discovery may be anyone's on this machine: no AWS_* for it
            shipped = [k for k in _LOCAL_ENV if not (self.discovered and k.startswith("AWS_"))]
            env = {k: os.environ[k] for k in shipped if k in os.environ}
            if not self.gpus:  # a pool smaller than the CPU slots shares out their threads
                env["OMP_NUM_THREADS"] = str(max(1, self.workers // most))
            resources["runtime_env"] = {"env_vars": env}
            pool = ActorPoolStrategy(size=most, max_tasks_in_flight_per_actor=1)
            return {"compute": pool, **resources}
        pool = ActorPoolStrategy(min_size=1, max_size=most, max_tasks_in_flight_per_actor=1)
        return {"compute": pool, **resources}


_connected: dict[str, Any] = {}  # the process's Ray, once connected; whether it started it


def connect(settings: PrecomputeSettings) -> Fleet:
    """Ray for this process: joined (``EDGEQA_RAY_ADDRESS``) or started locally, once."""
    import ray

    if "fleet" in _connected and ray.is_initialized():
        fleet: Fleet = _connected["fleet"]
        return fleet
    address = settings.ray_address
    quiet = {"logging_level": logging.WARNING, "log_to_driver": False}
    if address and not ray.is_initialized():
        _check_reachable(address)  # Ray itself waits minutes on a GCS that is not there
    # a Ray Job's driver (a stage the DAG submitted: ``jobs.py``) runs its model stages on the
    # job's own cluster, which Ray names in RAY_ADDRESS: a fleet, unless it is this machine alone
    in_job = not address and bool(os.environ.get("RAY_ADDRESS")) and not ray.is_initialized()
    starting = not address and not in_job and not ray.is_initialized()
    if starting and os.environ.get("RAY_AUTH_MODE", "").strip().lower() == "disabled":
        raise FleetError(
            "RAY_AUTH_MODE=disabled: a local Ray listens on every interface of this machine "
            "(Ray cannot bind it to loopback only), and its token authentication is what keeps "
            "others out; unset RAY_AUTH_MODE, or name a Ray (EDGEQA_RAY_ADDRESS)"
        )
    try:
        if ray.is_initialized():  # joined already (a test session's, a Ray job's driver)
            gcs = ray.get_runtime_context().gcs_address
            address = "" if _loopback(gcs) else gcs
        elif in_job:
            ray.init(**quiet)  # type: ignore[arg-type]
            gcs = ray.get_runtime_context().gcs_address
            address = "" if _only_this_machine() else gcs
        elif address:
            ray.init(address=address, **quiet)  # type: ignore[arg-type]
        else:
            # Ray's default for a new local cluster, token authentication, is kept: not said
            logging.getLogger("ray._private.authentication").setLevel(logging.ERROR)
            _connected["started"] = True
            ray.init(
                address="local",  # a Ray of its own, never one found running on the machine
                num_cpus=settings.ray_workers or usable_cpus(),
                include_dashboard=False,
                object_store_memory=LOCAL_OBJECT_STORE_BYTES,
                **quiet,  # type: ignore[arg-type]
            )
    except (ConnectionError, RuntimeError, ValueError) as error:
        where = address or "a local Ray"
        raise FleetError(
            f"Ray at {where} could not be reached (EDGEQA_RAY_ADDRESS): {error}"
        ) from None
    _quiet_ray_data()
    if address == "auto":  # the cluster Ray found: named by its GCS
        address = ray.get_runtime_context().gcs_address
    local = not address or _loopback(address)
    resources = ray.cluster_resources()
    gpus_now = int(resources.get("GPU", 0))
    if local:  # one actor per GPU if there are any, else per CPU slot
        workers = settings.ray_workers or max(1, gpus_now or int(resources.get("CPU", 1)))
        gpus = 1.0 if gpus_now and settings.device != "cpu" else 0.0
    else:  # a fleet: GPUs, which its autoscaler brings only once a job asks for them
        workers = settings.ray_workers or max(FLEET_WORKERS, gpus_now)
        gpus = 0.0 if settings.device == "cpu" else 1.0
    discovered = settings.ray_address == "auto"
    if discovered:
        log.info("joined the Ray at %s (auto): handed no AWS_* credentials", address)
    fleet = Fleet(address, local, workers, gpus, settings.ray_cpu_resource, discovered)
    _connected["fleet"] = fleet
    log.info("model stages run on %s", fleet.where(fleet.workers))
    return fleet


def reserve_gpus(fleet: Fleet, count: int, cpu_worker: bool = False) -> None:
    """On a fleet, ask its autoscaler for ``count`` GPUs at once (Ray Data's pool would
    otherwise grow a node at a time), and with ``cpu_worker`` for one CPU worker besides (the
    build's, kept up through generation); ``count`` 0 hands them back. A request stands until
    the next (Ray's ``request_resources`` is not additive), and keeps the workers it needs from
    being let go idle. Nothing locally."""
    if fleet.local or not fleet.gpus:
        return
    from ray.autoscaler.sdk import request_resources

    bundles: list[dict[str, float]] = [{"GPU": 1.0}] * count
    if cpu_worker and count and fleet.cpu_resource:
        bundles.append({fleet.cpu_resource: 1.0})
    try:
        request_resources(bundles=bundles)
    except Exception as error:  # an autoscaler that does not take requests: the pool grows
        log.warning("could not ask the autoscaler for %d GPUs: %s", count, error)


@contextmanager
def handed_back(settings: PrecomputeSettings) -> Iterator[None]:
    """A stage run inside: should it fail, what it asked a fleet for ahead (``ask_ahead``) is
    handed back, so that no pool stays up for a step that will not come."""
    try:
        yield
    except BaseException:
        ask_ahead(settings, "")
        raise


def ask_ahead(settings: PrecomputeSettings, step: str) -> None:
    """Ask a fleet's autoscaler now for the GPUs of the night's next GPU step, so that their
    pool starts (~10 min: nodes, image, model) while the CPU work before it runs: ``step``
    "embedding" as mining's text rules start, "generation" once the wordings are clustered
    (the build asks again as it starts: ``embedding.release_encoder``); "" hands them back (a
    stage that failed). The step asks again and hands them back when done (``reserve_gpus``).
    Nothing locally, or where no Ray is named (a laptop: no pool to start); a fleet that cannot
    be reached is the step's to report, not this."""
    if not (settings.ray_address or os.environ.get("RAY_ADDRESS")):
        return
    try:
        fleet = connect(settings)
    except FleetError as error:
        log.warning("could not reach the fleet to ask for GPUs ahead (%s): %s", step, error)
        return
    if not fleet.local and fleet.gpus:
        log.info("asking for %d GPUs ahead: %s", fleet.workers if step else 0, step or "none")
        reserve_gpus(fleet, fleet.workers if step else 0)


def disconnect() -> None:
    """Stop the local Ray this process started (``connect``); a Ray it only joined (a test
    session's, a cluster) is left as it is. The next job connects again."""
    import ray

    started = _connected.pop("started", False)
    _connected.clear()
    if started and ray.is_initialized():
        ray.shutdown()


def _check_reachable(address: str, timeout_s: float = 10.0) -> None:
    """Raise ``FleetError`` unless the Ray address (``[ray://]host:port``) accepts a TCP
    connection within ``timeout_s``; ``auto`` is Ray's to find."""
    if address == "auto":
        return
    host, port = address.split("://", 1)[-1].rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as error:
        raise FleetError(
            f"Ray at {address} could not be reached (EDGEQA_RAY_ADDRESS): {error}"
        ) from None


def _loopback(address: str) -> bool:
    """Whether a Ray address is this machine's (a test session's Ray joined by a child)."""
    from ray.util import get_node_ip_address

    host = address.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
    return host in ("127.0.0.1", "localhost", "::1", get_node_ip_address())


def _only_this_machine() -> bool:
    """Whether the Ray this process joined is this machine alone, with CPU slots for the actors
    (a laptop's ``ray start --head``). A fleet's head is the job driver's own machine too, but
    it holds no CPU slot (``num-cpus: 0``: the work goes to the workers its autoscaler
    brings), or other machines have joined it."""
    import ray
    from ray.util import get_node_ip_address

    here = get_node_ip_address()
    nodes = [node for node in ray.nodes() if node.get("Alive")]
    slots = sum(node.get("Resources", {}).get("CPU", 0) for node in nodes)
    return slots > 0 and all(node.get("NodeManagerAddress") == here for node in nodes)


def _quiet_ray_data() -> None:
    """Ray Data's progress bars and per-job banners off: the run report says what ran where."""
    from ray.data import DataContext

    context = DataContext.get_current()
    context.enable_progress_bars = False
    context.execution_options.preserve_order = True  # vectors come back in the wordings' order
    for name in ("ray.data", "ray.data._internal"):
        logging.getLogger(name).setLevel(logging.WARNING)
    logging.getLogger("ray.data._internal.progress").setLevel(logging.ERROR)  # "bars disabled"


def shipped(settings: PrecomputeSettings) -> EngineSettings:
    """What an actor is handed: the engine's settings, without a secret."""
    from origin.config import EngineSettings

    values = {k: getattr(settings, k) for k in EngineSettings.model_fields if k not in _SECRETS}
    return EngineSettings.model_construct(**values)


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def map_batches(dataset: Any, fn: Any, **arguments: Any) -> Any:
    """``dataset.map_batches(fn, **arguments)`` (``arguments``: a pool's, ``Fleet.actors``),
    without Ray's deprecation warning for its remote arguments: the bounded restarts of an actor
    (``max_restarts``, ``max_task_retries``) have no named parameter in Ray 2.60, whose warning
    would be every night's output, for nothing a user can change."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*ray_remote_args.* is deprecated")
        return dataset.map_batches(fn, **arguments)


def bound_class(cls: type, **arguments: Any) -> type:
    """``cls`` with its constructor's arguments bound: shipped with the class (small: names and
    settings), not as objects in the store, which a restarted actor could not get back."""

    class Bound(cls):  # type: ignore[valid-type,misc]
        def __init__(self) -> None:
            super().__init__(**arguments)

    Bound.__name__ = Bound.__qualname__ = cls.__name__
    return Bound


def last_line(error: BaseException) -> str:
    """A failed Ray job's error in one line: the remote exception's own (Ray wraps it in the
    actor's name and a traceback), colours removed."""
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line).strip() for line in str(error).splitlines()]
    lines = [line for line in lines if line]
    return lines[-1] if lines else type(error).__name__


def pool_size(pool: Mapping[str, Any]) -> int:
    """The most actors of a pool (``Fleet.actors``)."""
    return int(pool["compute"].max_size)


def ran_on(report: Mapping[str, Any]) -> dict[str, str]:
    """Where each stage of a run ran (``pipeline.run_pipeline``'s report, its stages in
    ``timings_s``): the model stages on Ray (``Fleet.where``), the rest in the process that ran
    the stage."""
    here = "this process"
    where = {stage: here for stage in report.get("timings_s", {})}
    embedded = report.get("mining", {}).get("clustering", {}).get("embedded_on")
    if embedded:
        where["mine"] = f"{here}; embedding: {embedded}"
    if "generation" in report:
        where["generate"] = report["generation"].get("ran_on", here)
    embedded = report.get("build", {}).get("embedded_on", "here")
    if embedded != "here":  # the release's rows on the fleet's GPU workers
        where["build"] = f"{here}; embedding: {embedded}"
    return where
