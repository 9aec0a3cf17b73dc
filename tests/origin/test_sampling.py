from __future__ import annotations

import pytest
import torch

from origin.sampling import SamplingParams, find_stop, sample_next, sample_rows


def test_sampling_filters_reduce_to_greedy() -> None:
    generator = torch.Generator().manual_seed(0)
    logits = torch.tensor([0.1, 3.0, 2.9, -1.0])
    assert sample_next(logits, SamplingParams(temperature=0.0), None) == 1
    for _ in range(20):
        assert sample_next(logits, SamplingParams(temperature=1.0, top_k=1), generator) == 1
        assert sample_next(logits, SamplingParams(temperature=1.0, top_p=1e-6), generator) == 1
    seen = {
        sample_next(logits, SamplingParams(temperature=5.0, top_k=2), generator) for _ in range(200)
    }
    assert seen == {1, 2}


def test_sample_rows_mixes_greedy_and_seeded_rows() -> None:
    logits = torch.tensor([[0.0, 5.0, 1.0], [2.0, 0.0, 1.0]])
    params = [SamplingParams(), SamplingParams(temperature=1.0, seed=1)]
    first = sample_rows(logits, params, [None, torch.Generator().manual_seed(1)])
    again = sample_rows(logits, params, [None, torch.Generator().manual_seed(1)])
    assert first[0] == 1 and first == again


def test_find_stop_returns_the_earliest_match() -> None:
    assert find_stop("hello world. bye", ["bye", "."]) == 11
    assert find_stop("hello", ["x"]) == -1
    assert find_stop("a.b.c", ["."], start=2) == 3


def test_stop_accepts_one_string() -> None:
    assert SamplingParams(stop="END").stop == ("END",)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_tokens": 0}, "max_tokens must be at least 1"),
        ({"temperature": -0.5}, "temperature must be >= 0"),
        ({"top_p": 0.0}, "top_p must be in"),
        ({"top_k": -1}, "top_k must be >= 0"),
        ({"stop": ("",)}, "stop must be a list"),
    ],
)
def test_bad_sampling_params(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)  # type: ignore[arg-type]
