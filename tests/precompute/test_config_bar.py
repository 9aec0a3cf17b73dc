"""A run cannot lower the bar the deployment's settings set (issue 48, item 5): k may be raised
but not lowered below ``EDGEQA_MIN_USERS``; the curated answers' pin is the deployment's alone,
and the stage command (what every DAG task submits) refuses the same; turning the crowd rule off
needs an explicit acknowledgment."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from base.config import ConfigError
from precompute.config import RUN_OPTIONS, PipelineConfig, PrecomputeSettings
from tests.test_cli import edgeqa_here

PIN, OTHER = "ab" * 32, "cd" * 32


def test_a_run_may_raise_k_but_not_lower_it_below_edgeqa_min_users() -> None:
    with pytest.raises(ConfigError, match=r"k=3 is below EDGEQA_MIN_USERS=5"):
        PipelineConfig.from_env({}, k=3)
    with pytest.raises(ConfigError, match=r"k=7 is below EDGEQA_MIN_USERS=8"):
        PipelineConfig.from_env({"EDGEQA_MIN_USERS": "8"}, k=7)
    raised = PipelineConfig.from_env({"EDGEQA_MIN_USERS": "5"}, k=9)
    assert raised.settings.min_users == raised.mining.k == 9
    assert PipelineConfig.from_env({"EDGEQA_MIN_USERS": "5"}, k=5).mining.k == 5
    # the operator lowers the deployment's floor itself, where they mean it
    assert PipelineConfig.from_env({"EDGEQA_MIN_USERS": "2"}, k=2).mining.k == 2
    assert PipelineConfig.from_env({"EDGEQA_MIN_USERS": "6"}).mining.k == 6


def test_a_run_may_not_bring_its_own_pin() -> None:
    assert "answers_sha256" not in {option.name for option in RUN_OPTIONS}
    for environ in ({}, {"EDGEQA_CURATED_ANSWERS_SHA256": PIN}):
        with pytest.raises(ConfigError, match=r"answers_sha256.*EDGEQA_CURATED_ANSWERS_SHA256"):
            PipelineConfig.from_env(environ, answers="faq.jsonl", answers_sha256=OTHER)


def test_the_answers_file_and_its_pin_are_the_deployment_s_settings() -> None:
    deployed = {"EDGEQA_CURATED_ANSWERS": "s3://b/faq.jsonl", "EDGEQA_CURATED_ANSWERS_SHA256": PIN}
    config = PipelineConfig.from_env(deployed)
    assert config.generation.curated_answers == "s3://b/faq.jsonl"
    assert config.settings.curated_answers_sha256 == PIN
    with pytest.raises(ConfigError, match="EDGEQA_CURATED_ANSWERS_SHA256"):
        PipelineConfig.from_env({"EDGEQA_CURATED_ANSWERS": "s3://b/faq.jsonl"})
    # the command line may say where the reviewed file is: read only with the deployment's pin
    config = PipelineConfig.from_env(deployed, answers="/srv/faq.jsonl")
    assert config.generation.curated_answers == "/srv/faq.jsonl"
    assert config.settings.curated_answers_sha256 == PIN


def test_the_stage_command_refuses_a_lower_k_and_a_pin_of_its_own(tmp_path: Path) -> None:
    """What a DAG task submits, refused by the stage process itself, before it reads a log."""
    night = ("precompute", "stage", "mine", "--logs", (tmp_path / "logs").as_uri())
    night += ("--out", (tmp_path / "out").as_uri(), "--since", "2026-11-22")
    night += ("--until", "2026-11-28", "--language", "en")
    env = {"EDGEQA_MIN_USERS": "5", "EDGEQA_CURATED_ANSWERS_SHA256": PIN}
    lowered = edgeqa_here(env, *night, "--k", "2")
    assert lowered.returncode == 2
    assert "k=2 is below EDGEQA_MIN_USERS=5" in lowered.stderr, lowered.stderr[-2000:]
    assert not (tmp_path / "out").exists()  # nothing mined, nothing written
    with pytest.raises(SystemExit):  # an option the command no longer has
        edgeqa_here(env, *night, "--answers", "faq.jsonl", "--answers-sha256", OTHER)


def test_turning_the_crowd_rule_off_needs_an_acknowledgment(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``EDGEQA_MIN_SIGNED_USERS=0`` with ``EDGEQA_MIN_ASNS=0`` leaves k askers anyone can
    mint from k networks: refused unless ``EDGEQA_ALLOW_UNVERIFIED_CROWD`` says so."""
    off = {"EDGEQA_MIN_SIGNED_USERS": "0", "EDGEQA_MIN_ASNS": "0"}
    with pytest.raises(
        ConfigError, match=r"EDGEQA_MIN_SIGNED_USERS=0.*EDGEQA_MIN_ASNS.*EDGEQA_ALLOW_UNVERIFIED"
    ):
        PrecomputeSettings.from_env(off)
    # one half of the rule on is enough
    assert PrecomputeSettings.from_env({**off, "EDGEQA_MIN_ASNS": "3"}).min_asns == 3
    assert PrecomputeSettings.from_env({**off, "EDGEQA_MIN_SIGNED_USERS": "1"}).min_asns == 0
    with caplog.at_level(logging.WARNING, logger="precompute.config"):
        config = PipelineConfig.from_env({**off, "EDGEQA_ALLOW_UNVERIFIED_CROWD": "true"})
    assert config.mining.min_signed_users == config.mining.min_asns == 0
    assert "crowd rule is off" in caplog.text
