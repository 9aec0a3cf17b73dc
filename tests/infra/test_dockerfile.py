"""The image (the top-level ``Dockerfile``) installs what ``pyproject.toml`` declares, the way the
Makefile does: the project with its dependencies, the embedded LLM at the Makefile's pin without
dependencies, the ``gpu`` extra through a build argument; on a Python the project supports, as a
non-root user, without secrets or hub access. Read from the files: no Docker daemon needed."""

from __future__ import annotations

import fnmatch
import re
import shlex
import tomllib
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).parents[2]
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
# where a build is documented (--build-arg EXTRAS=...)
BUILD_DOCS = (DOCKERFILE, ROOT / "infra/terraform/README.md", ROOT / "infra/terraform/variables.tf")
RAY_MODULE = ROOT / "infra/terraform/modules/ray/main.tf"
# pip options followed by a value (not a target)
_VALUED = {"-r", "--requirement", "-c", "--constraint", "-e", "--editable", "-i", "--index-url"}
_VALUED |= {"--extra-index-url", "-f", "--find-links", "-t", "--target", "--prefix", "--root"}
_SEPARATORS = {"&&", "||", ";", "|"}
# the project itself: `.`, with extras written out or taken from a build argument
_PROJECT = re.compile(r"\./?(\[[^\]]*\]|\$\{\w+:\+\[\$\{?\w+\}?\]\})?")
_SECRET_NAME = re.compile(r"SECRET|PASSWORD|TOKEN|SALT|API_KEY|ACCESS_KEY|PRIVATE", re.IGNORECASE)


@dataclass(frozen=True)
class Instruction:
    keyword: str
    args: str
    stage: int  # the FROM it follows (-1: global, before the first FROM)


@dataclass(frozen=True)
class PipInstall:
    stage: int
    options: frozenset[str]
    targets: tuple[str, ...]


def instructions(text: str) -> list[Instruction]:
    """The instructions, continuation lines joined and comments dropped, as Docker reads them."""
    found: list[Instruction] = []
    stage, pending = -1, ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("#") or (not line and not pending):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, args = (pending + line).partition(" ")
        pending = ""
        if keyword.upper() == "FROM":
            stage += 1
        found.append(Instruction(keyword.upper(), args.strip(), stage))
    return found


def arg_defaults(found: list[Instruction], stage: int) -> dict[str, str]:
    """The ARG defaults a stage sees (``stage`` -1: the global ones, which FROM lines see)."""
    defaults: dict[str, str] = {}
    for ins in found:
        if ins.keyword == "ARG" and ins.stage == stage:
            for token in shlex.split(ins.args):
                name, _, value = token.partition("=")
                defaults[name] = value
    return defaults


def expand(text: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args[m.group(1) or m.group(2)], text)


def env(found: list[Instruction], stage: int) -> dict[str, str]:
    values: dict[str, str] = {}
    for ins in found:
        if ins.keyword == "ENV" and ins.stage == stage:
            for token in shlex.split(ins.args):
                name, _, value = token.partition("=")
                values[name] = value
    return values


def pip_installs(found: list[Instruction]) -> list[PipInstall]:
    """Every ``pip install`` of every RUN, with its options and its targets."""
    installs = []
    for ins in found:
        if ins.keyword != "RUN":
            continue
        lexer = shlex.shlex(ins.args, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        command: list[str] = []
        for token in [*lexer, ";"]:
            if token not in _SEPARATORS:
                command.append(token)
                continue
            words = [w for w in command if w not in {"python", "-m"}]
            if len(words) > 1 and words[0].endswith("pip") and words[1] == "install":
                options, targets, rest = set(), [], iter(words[2:])
                for word in rest:
                    if word.startswith("-"):
                        options.add(word)
                        if word in _VALUED:
                            next(rest, None)
                    else:
                        targets.append(word)
                installs.append(PipInstall(ins.stage, frozenset(options), tuple(targets)))
            command = []
    return installs


@pytest.fixture(scope="module")
def dockerfile() -> list[Instruction]:
    return instructions(DOCKERFILE.read_text())


@pytest.fixture(scope="module")
def project() -> dict[str, Any]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        pyproject: dict[str, Any] = tomllib.load(f)
    return pyproject


def _final_stage(found: list[Instruction]) -> int:
    return max(ins.stage for ins in found)


def _project_install(found: list[Instruction]) -> PipInstall:
    installs = [p for p in pip_installs(found) if any(_PROJECT.fullmatch(t) for t in p.targets)]
    assert len(installs) == 1, (
        f"the Dockerfile installs the project (`pip install .`) once: {installs}"
    )
    return installs[0]


def test_the_base_image_runs_a_python_the_project_supports(
    dockerfile: list[Instruction], project: dict[str, Any]
) -> None:
    requires = SpecifierSet(project["project"]["requires-python"])
    global_args = arg_defaults(dockerfile, -1)
    bases = [expand(i.args.split()[0], global_args) for i in dockerfile if i.keyword == "FROM"]
    versions = set()
    for base in bases:
        match = re.fullmatch(r"python:(\d+\.\d+)(?:\.\d+)?-slim(?:-\w+)?", base)
        assert match, f"{base}: the stages build on python:<version>-slim"
        versions.add(match.group(1))
    # the venv is copied from the build stage: both stages must have the same interpreter
    assert len(versions) == 1, versions
    (version,) = versions
    assert Version(version) in requires, f"python {version} is not {requires} (requires-python)"


def test_the_project_is_installed_with_all_its_dependencies(
    dockerfile: list[Instruction], project: dict[str, Any]
) -> None:
    install = _project_install(dockerfile)
    # pip resolves every [project].dependencies entry (the torch pin included) only with deps on
    assert not install.options & {"--no-deps", "--no-index"}, install.options
    copied = {
        source.rstrip("/")
        for ins in dockerfile
        if ins.keyword == "COPY" and ins.stage == install.stage
        for source in shlex.split(ins.args)[:-1]
        if not source.startswith("--")
    }
    found = project["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = {pattern.rstrip("*") for pattern in found}
    # setup.py: the build of the origin's C kernels (an extension the install compiles)
    needed = {"pyproject.toml", "setup.py", project["project"]["readme"], *packages}
    assert needed <= copied, f"the build stage does not copy {sorted(needed - copied)}"
    # whatever is installed beside the project agrees with the project's own pins
    declared = {Requirement(d).name: Requirement(d) for d in project["project"]["dependencies"]}
    for p in pip_installs(dockerfile):
        for target in p.targets:
            if _PROJECT.fullmatch(target) or "$" in target:
                continue
            req = Requirement(target)
            pins = [s.version for s in req.specifier if s.operator == "=="]
            if req.name in declared:
                for pin in pins:
                    assert declared[req.name].specifier.contains(pin, prereleases=True), (
                        f"the Dockerfile pins {target}; pyproject.toml wants {declared[req.name]}"
                    )
    # the Ray cluster's runtime (dashboard, job API, Ray Client server) resolved with ray[data]
    if "ray" in declared:
        extras = [Requirement(t).extras for t in install.targets if t.startswith("ray")]
        assert {"default"} in extras, "the project's install names ray[default] beside it"


def test_the_kernels_are_compiled_in_the_build_stage_and_must_load(
    dockerfile: list[Instruction],
) -> None:
    """The install compiles the origin's batch-invariant C kernels (setup.py), an extension pip
    treats as optional (an install without a compiler runs on the library kernels): the image
    must not, so the stage that installs the project has a C compiler and, after the install,
    fails the build unless the kernels load; the final stage has no compiler, only the OpenMP
    runtime they link against."""
    install = _project_install(dockerfile)
    runs = [(i, ins.args) for i, ins in enumerate(dockerfile) if ins.keyword == "RUN"]
    stage_of = {i: dockerfile[i].stage for i, _ in runs}
    at = next(
        i
        for i, _ in runs
        if any(_PROJECT.fullmatch(t) for p in pip_installs([dockerfile[i]]) for t in p.targets)
    )
    compiler = re.compile(r"apt-get install[^&;]*\b(gcc|clang|build-essential)\b")
    assert any(compiler.search(args) and i < at for i, args in runs if stage_of[i] == install.stage)
    assert any(
        "unavailable_reason" in args and i > at for i, args in runs if stage_of[i] == install.stage
    ), "the build stage checks that the kernels load after installing the project"
    final = [args for i, args in runs if stage_of[i] == _final_stage(dockerfile)]
    assert not any(compiler.search(args) for args in final), "the runtime image has a compiler"
    assert any("libgomp1" in args for args in final)


def test_the_embedded_llm_is_the_makefiles_pin_without_dependencies(
    dockerfile: list[Instruction],
) -> None:
    makefile = (ROOT / "Makefile").read_text()
    pin = re.search(r"^EMBEDDED_LLM\s*:?=\s*(\S+)", makefile, re.MULTILINE)
    assert pin, "the Makefile names EMBEDDED_LLM"
    installed = [
        expand(target, arg_defaults(dockerfile, p.stage))
        for p in pip_installs(dockerfile)
        if "--no-deps" in p.options
        for target in p.targets
    ]
    assert pin.group(1) in installed, (
        f"the Makefile installs {pin.group(1)} (--no-deps); the Dockerfile installs {installed}"
    )


def test_the_gpu_extra_is_one_pyproject_declares(
    dockerfile: list[Instruction], project: dict[str, Any]
) -> None:
    extras = set(project["project"]["optional-dependencies"])
    install = _project_install(dockerfile)
    target = next(t for t in install.targets if _PROJECT.fullmatch(t))
    assert "EXTRAS" in target, f"the project's extras come from the EXTRAS build argument: {target}"
    default = arg_defaults(dockerfile, install.stage).get("EXTRAS", "")
    assert default in {"", *extras} and default != "dev", f"EXTRAS defaults to {default!r}"
    documented = {
        (path.name, name)
        for path in BUILD_DOCS
        for value in re.findall(r"--build-arg EXTRAS=([\w,-]+)", path.read_text())
        for name in value.split(",")
    }
    assert documented, "the CUDA build (--build-arg EXTRAS=<the gpu extra>) is documented"
    unknown = sorted((path, name) for path, name in documented if name not in extras)
    assert not unknown, f"{unknown} build extras pyproject.toml does not declare ({sorted(extras)})"


def test_the_image_runs_as_the_non_root_user_the_ray_pods_name(
    dockerfile: list[Instruction],
) -> None:
    final = _final_stage(dockerfile)
    users = [i.args for i in dockerfile if i.keyword == "USER" and i.stage == final]
    assert users, "the final stage sets a USER"
    user = users[-1].split(":")[0]
    assert user not in {"root", "0"}, f"the image runs as {users[-1]}"
    created = re.search(
        rf"useradd\b[^&;]*--uid (\d+)[^&;]*\b{re.escape(user)}\b", DOCKERFILE.read_text()
    )
    assert created, f"the Dockerfile creates {user} with a fixed uid"
    # the pods' runAsNonRoot needs the uid: the image's user is named, not numeric
    pod_uid = re.search(r"image_uid\s*=\s*(\d+)", RAY_MODULE.read_text())
    assert pod_uid and pod_uid.group(1) == created.group(1), (
        f"the image's {user} is uid {created.group(1)}; the ray module runs its pods as "
        f"{pod_uid and pod_uid.group(1)}"
    )


def test_no_secrets_no_hub_and_a_small_build_context(dockerfile: list[Instruction]) -> None:
    assert env(dockerfile, _final_stage(dockerfile)).get("HF_HUB_OFFLINE") == "1"
    for ins in dockerfile:
        if ins.keyword in {"ARG", "ENV"}:
            for token in shlex.split(ins.args):
                name = token.partition("=")[0]
                assert not _SECRET_NAME.search(name), f"{ins.keyword} {name}: no secrets in images"
    ignored = {
        line.strip().removeprefix("/").removeprefix("**/").rstrip("/")
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    missing = {".venv", ".git", "*.tfvars", "*.tfstate"} - ignored
    assert not missing, f".dockerignore does not exclude {sorted(missing)}"
    # and nothing the Dockerfile copies is left out of the context
    for ins in dockerfile:
        if ins.keyword == "COPY" and "--from" not in ins.args:
            for source in shlex.split(ins.args)[:-1]:
                if source.startswith("--"):
                    continue
                clash = [p for p in ignored if fnmatch.fnmatch(source.rstrip("/"), p)]
                assert not clash, f"COPY {source} is excluded by .dockerignore {clash}"


def test_the_gpu_target_adds_vllm_at_rays_pin_and_is_not_the_default(
    dockerfile: list[Instruction],
) -> None:
    """The Ray cluster's image (``--target gpu``): the build stage's venv plus vLLM at the version
    the project's Ray pins for its ``llm`` extra (``ray.data.llm`` drives that vLLM), and what
    MWAA's workers also run at the image's constraints; ``docker build .`` still builds the
    runtime (the last stage)."""
    names = {
        ins.args.split()[-1]: ins.stage
        for ins in dockerfile
        if ins.keyword == "FROM" and " AS " in ins.args.upper()
    }
    assert "gpu" in names, "the Dockerfile has a gpu target"
    stage = names["gpu"]
    assert stage != _final_stage(dockerfile), "the default target stays the runtime image"
    copies = [i.args for i in dockerfile if i.keyword == "COPY" and i.stage == stage]
    assert any("--from=build" in c and "/opt/edgeqa" in c for c in copies), copies
    assert any("infra/image/constraints.txt" in c for c in copies), copies
    installs = [p for p in pip_installs(dockerfile) if p.stage == stage]
    (install,) = [p for p in installs if any(t.startswith("vllm==") for t in p.targets)]
    args = arg_defaults(dockerfile, stage)
    (target,) = [expand(t, args) for t in install.targets if t.startswith("vllm==")]
    assert "-c" in install.options, "the gpu target installs under the image's constraints"
    try:
        ray_requires = metadata.requires("ray") or []
    except metadata.PackageNotFoundError:
        pytest.skip("ray is not installed here: its llm extra's vLLM pin is read from it")
    pins = [Requirement(r) for r in ray_requires if r.startswith("vllm")]
    llm = [r for r in pins if r.marker is not None and r.marker.evaluate({"extra": "llm"})]
    assert llm, f"ray names no vllm for its llm extra: {ray_requires}"
    wanted = {s.version for s in llm[0].specifier if s.operator == "=="}
    assert target == f"vllm=={wanted.pop()}", f"{target}: ray's llm extra wants {llm[0]}"
    assert env(dockerfile, stage).get("HF_HUB_OFFLINE") == "1"
    users = [i.args for i in dockerfile if i.keyword == "USER" and i.stage == stage]
    final_users = [
        i.args for i in dockerfile if i.keyword == "USER" and i.stage == _final_stage(dockerfile)
    ]
    assert users and users[-1] == final_users[-1], "the gpu target runs as the pods' user"
