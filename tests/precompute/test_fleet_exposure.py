"""What the nightly job hands to a Ray it did not name (``EDGEQA_RAY_ADDRESS=auto``: whichever
Ray Ray's discovery finds on the machine) and what guards the local Ray it starts, which Ray 2.60
binds to every interface. Ray itself is stood in for (no cluster starts here): ``connect`` is
checked for what it asks of Ray and what its pools ship."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest

import precompute.fleet as fleet_module
from precompute.config import PrecomputeSettings
from precompute.fleet import FleetError, connect

HERE = "192.0.2.7"  # this machine's routable address, as Ray names its node


def _fake_ray(monkeypatch: pytest.MonkeyPatch, gcs: str) -> list[dict[str, Any]]:
    """A stand-in ``ray`` (and ``ray.data``, ``ray.util``) whose ``init`` records its arguments
    and whose cluster is ``gcs``, with two CPUs; the calls to ``init``."""
    inits: list[dict[str, Any]] = []
    state = {"up": False}

    def init(**arguments: Any) -> None:
        inits.append(arguments)
        state["up"] = True

    options = types.SimpleNamespace(preserve_order=False)
    current = types.SimpleNamespace(enable_progress_bars=True, execution_options=options)
    data = types.ModuleType("ray.data")
    vars(data).update(
        DataContext=types.SimpleNamespace(get_current=lambda: current),
        ActorPoolStrategy=types.SimpleNamespace,
    )
    util = types.ModuleType("ray.util")
    vars(util).update(get_node_ip_address=lambda: HERE)
    ray = types.ModuleType("ray")
    vars(ray).update(
        is_initialized=lambda: state["up"],
        init=init,
        get_runtime_context=lambda: types.SimpleNamespace(gcs_address=gcs),
        cluster_resources=lambda: {"CPU": 2.0},
        nodes=list,
        data=data,
        util=util,
    )
    for name, module in (("ray", ray), ("ray.data", data), ("ray.util", util)):
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(fleet_module, "_connected", {})
    return inits


@pytest.fixture()
def credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret-example")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "session-example")
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)


@pytest.mark.usefixtures("credentials")
def test_a_ray_found_by_auto_is_handed_no_aws_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """``auto`` joins whatever Ray runs on this machine (another user's, a stray ``ray start``):
    its workers reach the store with their own credentials, never this process's."""
    inits = _fake_ray(monkeypatch, f"{HERE}:6379")
    fleet = connect(PrecomputeSettings.from_env({"EDGEQA_RAY_ADDRESS": "auto"}))
    assert inits and inits[0]["address"] == "auto"
    shipped = fleet.actors(2)["runtime_env"]["env_vars"]
    assert not [name for name in shipped if name.startswith("AWS_")], shipped


@pytest.mark.usefixtures("credentials")
def test_a_ray_this_run_starts_or_names_is_handed_the_store_s_credentials(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The local Ray the run starts (and one an operator names on this machine) is the run's:
    its workers get the process's store credentials, as before."""
    inits = _fake_ray(monkeypatch, f"{HERE}:6379")
    fleet = connect(PrecomputeSettings.from_env({}))
    assert inits[0]["address"] == "local" and inits[0]["include_dashboard"] is False
    shipped = fleet.actors(2)["runtime_env"]["env_vars"]
    assert shipped["AWS_SECRET_ACCESS_KEY"] == "secret-example"
    _fake_ray(monkeypatch, f"{HERE}:6379")
    monkeypatch.setattr(fleet_module, "_check_reachable", lambda address: None)
    named = connect(PrecomputeSettings.from_env({"EDGEQA_RAY_ADDRESS": f"{HERE}:6379"}))
    assert named.actors(2)["runtime_env"]["env_vars"]["AWS_ACCESS_KEY_ID"] == "AKIAEXAMPLE"


@pytest.mark.usefixtures("credentials")
def test_a_local_ray_is_not_started_without_token_authentication(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ray 2.60 binds a local Ray's GCS, raylet and workers to every interface (a node address of
    127.0.0.1 is replaced with the routable one): Ray's token authentication is what keeps the
    network out, so the run does not start one with it turned off."""
    inits = _fake_ray(monkeypatch, f"{HERE}:6379")
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    with pytest.raises(FleetError, match=r"RAY_AUTH_MODE=disabled.*every interface"):
        connect(PrecomputeSettings.from_env({}))
    assert inits == []
