"""docs/capacity.md's machine table is the fleet Terraform builds: each row names a node group of
the Ray module with its instance types, capacity type and ceiling, and each must be what the HCL
says (the module's defaults, as the root module passes them); every node group of the module is a
row. A change to one side only fails here."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tests.infra.test_terraform import _blocks, _flat, _one, parsed  # noqa: F401 (the fixture)

ROOT = Path(__file__).parents[2]
PLAN = ROOT / "docs" / "capacity.md"
HEADER = ["role", "node group", "instance types", "capacity", "max nodes"]
RAY = "modules/ray/main.tf"


def machine_table(text: str) -> list[dict[str, str]]:
    """The rows of the one table whose header is ``HEADER``."""
    tables, rows, inside = 0, [], False
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if "|" in line else None
        if cells == HEADER:
            tables, inside = tables + 1, True
            continue
        if inside and cells is not None and set("".join(cells)) <= set("-: "):
            continue
        if inside and cells is not None:
            rows.append(dict(zip(HEADER, cells, strict=True)))
            continue
        inside = False
    assert tables == 1, f"docs/capacity.md has {tables} machine tables ({' | '.join(HEADER)})"
    return rows


def _resolve(parsed: dict[str, Any], value: Any) -> Any:  # noqa: F811
    """A node group's attribute as the deployment gets it: a literal, or a variable of the ray
    module at its default unless the root module passes its own (whose default must agree)."""
    value = _flat(value)
    if len(value) == 1 and isinstance(value[0], str):
        found = re.fullmatch(r"\$\{(?:\[)?var\.(\w+)(?:\])?\}", value[0])
        if found:
            name = found.group(1)
            module_vars = {
                k: v for b in parsed["modules/ray/variables.tf"]["variable"] for k, v in b.items()
            }
            default = _flat(module_vars[name]["default"])
            root_call = {k: v for b in parsed["main.tf"]["module"] for k, v in b.items()}["ray"]
            if name in root_call:
                passed = re.fullmatch(r"\$\{var\.(\w+)\}", _one(root_call[name]))
                assert passed, f"the root passes {name} as {root_call[name]}"
                root_vars = {k: v for b in parsed["variables.tf"]["variable"] for k, v in b.items()}
                root_default = _flat(root_vars[passed.group(1)]["default"])
                assert root_default == default, (
                    f"{name}: the ray module defaults to {default}, the root's "
                    f"{passed.group(1)} to {root_default}"
                )
            return default
    return value


def test_the_plans_machines_are_the_node_groups_terraform_builds(
    parsed: dict[str, Any],  # noqa: F811
) -> None:
    rows = machine_table(PLAN.read_text())
    groups = _blocks(parsed, RAY, "resource", "aws_eks_node_group")
    named = {row["node group"].strip("`"): row for row in rows}
    assert len(named) == len(rows), "each node group is one row"
    assert set(named) == set(groups), (
        f"the plan's machines {sorted(named)} are not Terraform's node groups {sorted(groups)}"
    )
    for name, row in named.items():
        group = groups[name]
        types = [t.strip(" `") for t in row["instance types"].split(",")]
        assert types == [str(t) for t in _resolve(parsed, group["instance_types"])], name
        capacity = row["capacity"].strip("`").split()[0].upper().replace("-", "_")
        assert capacity == _one(group["capacity_type"]), (name, capacity)
        ceiling = _resolve(parsed, _one(group["scaling_config"])["max_size"])
        assert int(row["max nodes"].strip("`*")) == int(_one(ceiling)), (name, ceiling)
        # the worker pools scale from zero between nights; the system group holds the head
        floor = _one(_one(group["scaling_config"])["min_size"])
        assert floor == (1 if name == "system" else 0), (name, floor)


def test_the_table_reader_sees_one_side_changed() -> None:
    text = PLAN.read_text()
    rows = machine_table(text)
    first = rows[0]
    changed = text.replace(
        f"| {first['max nodes']} |", f"| {int(first['max nodes'].strip('`*')) + 1} |", 1
    )
    assert machine_table(changed)[0]["max nodes"] != first["max nodes"]
    doubled = text + "\n\n| " + " | ".join(HEADER) + " |\n|---|---|---|---|---|\n"
    try:
        machine_table(doubled)
    except AssertionError:
        return
    raise AssertionError("a second machine table went unnoticed")


def cpu_worker(text: str) -> dict[str, Any]:
    """What the plan says of the CPU worker: its pod (the ``cpu_spot`` row), DuckDB's budget, the
    volume, and each listed type's published shape."""
    rows = {row["node group"].strip("`"): row for row in machine_table(text)}
    pod = re.search(r"one ([\d,]+)-CPU / ([\d,]+) GiB worker a node", rows["cpu_spot"]["role"])
    budget = re.search(r"`EDGEQA_MINING_MEMORY_MB=([\d,]+)`", text)
    volume = re.search(r"Its root volume is\s+([\d,]+) GiB gp3", text)
    assert pod and budget and volume, "the plan names the CPU worker's pod, budget and volume"
    types = [t.strip(" `") for t in rows["cpu_spot"]["instance types"].split(",")]
    shapes = {}
    for t in types:
        found = re.search(rf"^\| {re.escape(t)} \((\d+) vCPU, ([\d,]+) GiB\)", text, re.MULTILINE)
        assert found, f"the plan publishes no price row for {t}"
        shapes[t] = {"vcpu": int(found.group(1)), "gib": int(found.group(2).replace(",", ""))}
    number = lambda s: int(s.replace(",", ""))  # noqa: E731
    return {
        "cpu": number(pod.group(1)),
        "memory": f"{number(pod.group(2))}Gi",
        "budget_mb": number(budget.group(1)),
        "volume_gib": number(volume.group(1)),
        "shapes": shapes,
    }


def test_the_plans_cpu_worker_is_the_pod_budget_and_volume_terraform_sets(
    parsed: dict[str, Any],  # noqa: F811
) -> None:
    plan = cpu_worker(PLAN.read_text())
    variables = {k: v for b in parsed["modules/ray/variables.tf"]["variable"] for k, v in b.items()}

    def default(name: str) -> Any:
        return _one(variables[name]["default"])

    assert plan["cpu"] == default("cpu_worker_cpu")
    assert plan["memory"] == default("cpu_worker_memory")
    assert plan["budget_mb"] == default("cpu_mining_memory_mb")
    assert plan["volume_gib"] == default("cpu_volume_size")
    # the shapes the plan prices are the ones the module checks the pod against
    module_shapes = _one(_one(parsed[RAY]["locals"])["cpu_shapes"])
    for t, shape in plan["shapes"].items():
        assert module_shapes[t] == shape, t


def test_the_cpu_worker_reader_sees_one_side_changed() -> None:
    text = PLAN.read_text()
    plan = cpu_worker(text)
    changed = text.replace(f"one {plan['cpu']}-CPU", f"one {plan['cpu'] + 4}-CPU", 1).replace(
        "`EDGEQA_MINING_MEMORY_MB=", "`EDGEQA_MINING_MEMORY_MB=9", 1
    )
    after = cpu_worker(changed)
    assert after["cpu"] != plan["cpu"] and after["budget_mb"] != plan["budget_mb"]
