"""Generation on an engine Ray Data's LLM API drives (``precompute/fleet/llm.py``): for real with
its HTTP processor against the project's own origin on loopback (the release the in-process
engine builds, partition checkpoints and all), and vLLM's configuration as the same code builds
it for the fleet (vLLM itself is the fleet image's: not installed here)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from base.config import ConfigError
from base.errors import EdgeQAError
from base.store import FileStore
from precompute.config import PipelineConfig, PrecomputeSettings
from precompute.samplelogs import generate_rows, write_logs

UNTIL = date(2026, 11, 28)
SINCE = UNTIL - timedelta(days=6)
MAX_TOKENS = 32
NIGHTLY = {"EDGEQA_MAX_TOKENS": str(MAX_TOKENS)}
NOW = datetime(2026, 11, 28, 23, 59, 59, tzinfo=UTC)


@pytest.fixture(scope="module")
def origin_url(embedded_model: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The project's origin on loopback, serving the embedded model at the nightly's precision
    (int8, batch-invariant, no speculation), its tiers off: every answer generated."""
    from edgeqa.local import LocalServer
    from origin.config import OriginSettings
    from origin.runtime import Runtime
    from origin.server.app import create_app
    from origin.server.state import OriginServer
    from precompute.generate import nightly_engine
    from tests.serving import wait_healthy

    store = FileStore(tmp_path_factory.mktemp("origin-store"))
    settings = OriginSettings.from_env(
        {
            **NIGHTLY,
            "EDGEQA_STORE": store.uri,
            "EDGEQA_ORIGIN_TIERS": "false",
            "EDGEQA_LOG_REQUESTS": "false",
            "EDGEQA_MAX_QUEUED_REQUESTS": "256",
        }
    )
    engine = nightly_engine(settings, "int8", embedded_model).start()
    server = OriginServer(settings, lambda: Runtime(engine, MAX_TOKENS, 0.0))
    try:
        with LocalServer(create_app(server)) as running:
            wait_healthy(running.url)
            yield running.url
    finally:
        engine.stop()


def _logs(tmp_path: Path) -> FileStore:
    logs = FileStore(tmp_path / "logs")
    write_logs(logs, generate_rows(UNTIL, intents=3, users=45, asks=180, tail_questions=2))
    return logs


def test_the_http_processor_on_ray_builds_the_release_the_in_process_engine_builds(
    ray_address: str, embedded_model: Any, origin_url: str, tmp_path: Path
) -> None:
    """The same logs, answered once by the in-process engine and once through
    ``ray.data.llm``'s HTTP processor on the session's Ray against the origin: the same release
    (its version is its content's digest), the same answers and tokens, the same report
    fields; a partition lost from the work area is the only one answered again."""
    from precompute.pipeline import RunParams, run_pipeline, run_stage
    from precompute.workarea import WorkArea

    logs = _logs(tmp_path)
    here = PipelineConfig.from_env(NIGHTLY, partition_size=3)
    reference = run_pipeline(
        RunParams(logs.uri, FileStore(tmp_path / "here").uri, SINCE, UNTIL, here),
        model=embedded_model,
    )
    assert reference["status"] == "published", reference
    env = {**NIGHTLY, "EDGEQA_GENERATION_ENGINE": "http", "EDGEQA_GENERATION_URL": origin_url}
    config = PipelineConfig.from_env(env, partition_size=3)
    out = FileStore(tmp_path / "served")
    params = RunParams(logs.uri, out.uri, SINCE, UNTIL, config)
    served = run_pipeline(params, model=embedded_model)  # mine's embedding here, as the other's
    assert served["status"] == "published", served
    assert served["profile"] == reference["profile"]  # the same model, the same precision
    assert served["version"] == reference["version"]  # the same rows, answers and dates
    mine, theirs = served["generation"], reference["generation"]
    for field in ("partitions", "answers", "generated", "reused", "tokens", "flagged"):
        assert mine[field] == theirs[field], field
    assert mine["generated"] > 0 and mine["tokens"] > 0 and mine["redone"] == []
    assert set(mine) == set(theirs)  # the run report's fields, whichever engine
    assert "via ray.data.llm's HTTP processor" in mine["ran_on"], mine["ran_on"]
    assert mine["ran_on"].startswith("ray (local, ")
    assert mine["tokens_per_s"] > 0 and mine["seconds"] > 0

    # the checkpoints are the in-process engine's partitions: one lost is the one redone
    work = WorkArea(out, served["profile"], served["run_id"])
    lost = work.partition(1)
    before = work.get_table(lost)
    out.delete(lost)
    out.delete_prefix(f"{work.prefix}/pieces/00001/")  # and the answers kept as they came
    run = f"{served['profile']}/{served['run_id']}"
    redo = run_stage("generate", params, run)
    assert redo["partitions_reused"] == mine["partitions"] - 1
    assert redo["generated"] == before.column("reused_from").null_count > 0
    assert redo["redone"] == [1]
    assert work.get_table(lost).equals(before)

    # a server that lists the model but refuses every completion: the partition is not written
    # (a checkpoint of engine errors would stand for the night), the run fails in one line
    out.delete(lost)
    out.delete_prefix(f"{work.prefix}/pieces/00001/")  # and the answers kept as they came
    with _refusing_server() as refusing:
        env["EDGEQA_GENERATION_URL"] = refusing
        config = PipelineConfig.from_env(env, partition_size=3)
        with pytest.raises(EdgeQAError, match="every answer asked for was an engine error") as e:
            run_stage("generate", RunParams(logs.uri, out.uri, SINCE, UNTIL, config), run)
    assert "\n" not in str(e.value) and "unauthorized" in str(e.value)
    assert not out.exists(lost)

    # the answers kept as they came are the checkpoint: a partition whose every question a
    # piece answers is written from its pieces, nothing asked (the refusing server is not)
    import pyarrow as pa

    kept = [
        {"partition": 1, "position": i, "text": r["answer"], "tokens": r["tokens"],
         "finish_reason": r["finish_reason"], "error": ""}
        for i, r in enumerate(before.to_pylist())
    ]  # fmt: skip
    work.put_table(f"{work.prefix}/pieces/00001/00000-kept.parquet", pa.Table.from_pylist(kept))
    with _refusing_server() as refusing:
        env["EDGEQA_GENERATION_URL"] = refusing
        config = PipelineConfig.from_env(env, partition_size=3)
        again = run_stage("generate", RunParams(logs.uri, out.uri, SINCE, UNTIL, config), run)
    assert again["partitions_reused"] == mine["partitions"] - 1
    assert again["flagged"] == mine["flagged"]  # the run's answers, flagged as they were
    assert work.get_table(lost).equals(before)  # the release's partition, from the pieces
    # the pieces stay with the run's work area (the GPU workers' role may not delete there)
    assert f"{work.prefix}/pieces/00001/00000-kept.parquet" in out.list(f"{work.prefix}/pieces/")


@contextmanager
def _refusing_server() -> Iterator[str]:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from edgeqa.local import LocalServer

    async def models(request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": "SmolLM2-135M-Instruct"}]})

    async def chat(request: Request) -> JSONResponse:
        return JSONResponse({"error": {"message": "unauthorized", "type": "auth"}}, 401)

    routes = [Route("/v1/models", models), Route("/v1/chat/completions", chat, methods=["POST"])]
    with LocalServer(Starlette(routes=routes)) as running:
        yield running.url


def test_a_server_that_serves_another_model_is_refused_before_any_question(
    origin_url: str,
) -> None:
    from precompute.fleet import FleetError
    from precompute.fleet.llm import LLMEngine, check_server

    check_server(LLMEngine("http", "SmolLM2-135M-Instruct", "int8", origin_url))
    with pytest.raises(FleetError, match="serves \\['SmolLM2-135M-Instruct'\\], not 'other'"):
        check_server(LLMEngine("http", "other", "int8", origin_url))


def _checkpoint(folder: Path, quantization: dict[str, Any] | None) -> Path:
    folder.mkdir()
    config: dict[str, Any] = {"architectures": ["LlamaForCausalLM"], "hidden_size": 4096}
    if quantization is not None:
        config["quantization_config"] = quantization
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ x }}"}))
    return folder


W8A8 = {  # what llm-compressor's W8A8 (SmoothQuant + GPTQ) writes
    "quant_method": "compressed-tensors",
    "format": "int-quantized",
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"},
            "input_activations": {"num_bits": 8, "type": "int", "dynamic": True},
        }
    },
}


def test_the_vllm_processor_is_configured_from_the_settings_as_the_fleet_runs_it(
    tmp_path: Path,
) -> None:
    """What the fleet would run, built by the code it runs: vLLM on the W8A8 checkpoint the
    settings name, one engine per GPU up to the fleet's workers, greedy, the answer policy on
    its rows; the release's profile names the checkpoint, not the project's model."""
    from precompute.fleet import Fleet
    from precompute.fleet.llm import LLMEngine, answer_row, processor_config, request_row
    from precompute.fleet.llm import run_profile as profile_of

    folder = _checkpoint(tmp_path / "llama-8b-w8a8", W8A8)
    env = {
        **NIGHTLY,
        "EDGEQA_GENERATION_ENGINE": "vllm",
        "EDGEQA_VLLM_MODEL": str(folder),
        "EDGEQA_RAY_WORKERS": "12",
    }
    settings = PrecomputeSettings.from_env(env)
    llm = LLMEngine.of(settings, "int8")
    assert llm == LLMEngine("vllm", str(folder), "w8a8")
    fleet = Fleet("10.0.0.1:6379", False, 12, 1.0)
    config = processor_config(llm, settings, fleet)
    assert type(config).__name__ == "vLLMEngineProcessorConfig"
    assert config.model_source == str(folder)
    assert config.concurrency == (1, 12)  # the autoscaler brings the GPUs, up to the ceiling
    kwargs = config.engine_kwargs
    assert kwargs["dtype"] == "float16" and kwargs["tensor_parallel_size"] == 1
    assert kwargs["max_model_len"] == 512 + MAX_TOKENS and kwargs["enable_prefix_caching"]
    assert config.should_continue_on_error  # a failed row is flagged, not the night

    asked = {"partition": 3, "position": 1, "key": "k", "question": "what is a tide?"}
    row = request_row(llm, settings, asked)
    assert row["sampling_params"] == {"temperature": 0.0, "max_tokens": MAX_TOKENS}
    assert row["messages"][0] == {"role": "system", "content": settings.system_prompt}
    assert row["messages"][1] == {"role": "user", "content": "what is a tide?"}
    done = answer_row(llm, MAX_TOKENS, {**row, "generated_text": "Sea.", "num_generated_tokens": 3})
    assert done == {
        "partition": 3, "position": 1, "text": "Sea.", "tokens": 3, "finish_reason": "stop",
        "error": "",
    }  # fmt: skip
    assert answer_row(llm, MAX_TOKENS, done) == done  # taken once more as it is
    cut = answer_row(llm, MAX_TOKENS, {**row, "generated_text": "a", "num_generated_tokens": 48})
    assert cut["finish_reason"] == "length"  # flagged "truncated", never published
    failed = answer_row(llm, MAX_TOKENS, {**asked, "__inference_error__": "CUDA OOM"})
    assert failed["error"] == "CUDA OOM" and failed["text"] == ""

    profile = profile_of(settings, "int8", None, "en")
    assert profile.name.startswith("llama-8b-w8a8-en-")
    assert profile.inputs["engine"] == "vllm" and profile.inputs["quantization"] == "w8a8"
    assert "vocab_size" not in profile.inputs  # the checkpoint's digest says it
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ y }}"}))
    assert profile_of(settings, "int8", None, "en").name != profile.name  # another template


def test_a_checkpoint_that_is_not_the_weights_the_settings_say_is_refused_naming_it(
    tmp_path: Path,
) -> None:
    from precompute.fleet.llm import checkpoint

    plain = _checkpoint(tmp_path / "plain", None)
    with pytest.raises(EdgeQAError, match=r"is not an INT8 W8A8 checkpoint .*none"):
        checkpoint(str(plain), "w8a8")
    assert checkpoint(str(plain), "fp16")["quantization"] == "fp16"
    fp8 = {**W8A8, "config_groups": {"g": {"weights": {"num_bits": 8, "type": "float"}}}}
    with pytest.raises(EdgeQAError, match="not an INT8 W8A8"):
        checkpoint(str(_checkpoint(tmp_path / "fp8", fp8)), "w8a8")
    quantized = _checkpoint(tmp_path / "w8a8", W8A8)
    with pytest.raises(EdgeQAError, match="is quantized \\(compressed-tensors\\)"):
        checkpoint(str(quantized), "fp16")
    with pytest.raises(EdgeQAError, match=r"no readable config\.json"):
        checkpoint(str(tmp_path / "nowhere"), "fp16")


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"EDGEQA_GENERATION_ENGINE": "vllm"}, "EDGEQA_VLLM_MODEL"),
        ({"EDGEQA_GENERATION_ENGINE": "http"}, "EDGEQA_GENERATION_URL"),
        ({"EDGEQA_GENERATION_ENGINE": "tgi"}, "EDGEQA_GENERATION_ENGINE"),
        ({"EDGEQA_VLLM_QUANTIZATION": "int4"}, "EDGEQA_VLLM_QUANTIZATION"),
        ({"EDGEQA_GENERATION_URL": "ftp://x:1"}, "EDGEQA_GENERATION_URL"),
        ({"EDGEQA_GENERATION_URL": "http://h:99999"}, "EDGEQA_GENERATION_URL"),
        ({"EDGEQA_GENERATION_URL": "http://:"}, "EDGEQA_GENERATION_URL"),
    ],
)
def test_a_generation_engine_without_what_it_needs_is_refused_naming_the_variable(
    env: dict[str, str], named: str
) -> None:
    with pytest.raises(ConfigError, match=named):
        PrecomputeSettings.from_env(env)


def test_the_generation_servers_key_is_never_handed_to_an_engine_actor_or_said() -> None:
    import pickle

    from precompute.fleet import Fleet, shipped
    from precompute.fleet.generation_job import Job
    from precompute.fleet.llm import LLMEngine, processor_config, without_key

    key = "gen-key-" + "g" * 24
    env = {"EDGEQA_GENERATION_ENGINE": "http", "EDGEQA_GENERATION_URL": "http://o:8000"}
    settings = PrecomputeSettings.from_env({**env, "EDGEQA_GENERATION_API_KEY": key})
    assert key.encode() not in pickle.dumps(shipped(settings))
    llm = LLMEngine.of(settings, "int8")
    assert llm is not None and llm.api_key == key
    assert key not in repr(llm) and key not in llm.describe()
    # the HTTP stage's headers hold it; what the partitions' readers and writers get does not
    fleet = Fleet("", True, 2, 0.0)
    assert processor_config(llm, settings, fleet).headers == {"Authorization": f"Bearer {key}"}
    job = Job("file:///tmp/x", "p", "r", shipped(settings), "int8", NOW, 3, 9, llm=llm)
    assert key.encode() not in pickle.dumps(without_key(job, llm))
