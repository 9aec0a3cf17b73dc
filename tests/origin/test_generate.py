from __future__ import annotations

from origin.chat import chat_messages
from origin.detokenizer import IncrementalDetokenizer
from origin.sampling import SamplingParams
from tests.origin.reference import GenerationStats, stream_chat


def _run(embedded_model, question: str, params: SamplingParams) -> tuple[str, GenerationStats]:  # type: ignore[no-untyped-def]
    model, tokenizer = embedded_model
    stats = GenerationStats()
    text = "".join(stream_chat(model, tokenizer, chat_messages(question), params, stats))
    return text, stats


def test_greedy_is_deterministic_and_stops_at_eos(embedded_model) -> None:  # type: ignore[no-untyped-def]
    first, stats = _run(
        embedded_model, "What is the capital of France?", SamplingParams(max_tokens=40)
    )
    second, _ = _run(
        embedded_model, "What is the capital of France?", SamplingParams(max_tokens=40)
    )
    assert first == second and "Paris" in first
    assert stats.finish_reason == "stop"
    assert stats.prompt_tokens > 10 and 0 < stats.completion_tokens < 40
    assert len(stats.token_times_ms) == stats.completion_tokens
    assert 0 < stats.ttft_ms <= stats.token_times_ms[-1] <= stats.total_ms


def test_max_tokens_ends_with_length(embedded_model) -> None:  # type: ignore[no-untyped-def]
    _, stats = _run(
        embedded_model, "Write a long story about a dragon.", SamplingParams(max_tokens=5)
    )
    assert stats.finish_reason == "length" and stats.completion_tokens == 5


def test_seeded_sampling_is_reproducible(embedded_model) -> None:  # type: ignore[no-untyped-def]
    params = SamplingParams(max_tokens=16, temperature=1.0, top_p=0.95, top_k=50, seed=7)
    a, _ = _run(embedded_model, "Tell me a fun fact.", params)
    b, _ = _run(embedded_model, "Tell me a fun fact.", params)
    assert a == b
    others = {
        _run(
            embedded_model,
            "Tell me a fun fact.",
            SamplingParams(max_tokens=16, temperature=1.0, seed=s),
        )[0]
        for s in range(1, 5)
    }
    assert len(others) > 1


def test_detokenizer_never_splits_multibyte_characters(embedded_model) -> None:  # type: ignore[no-untyped-def]
    _, tokenizer = embedded_model
    text = "héllo 你好 👩🏽‍💻 naïve — ok"
    ids = tokenizer.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer)
    deltas = [detok.push(i) for i in ids]
    assert "".join(deltas) == tokenizer.decode(ids)
    assert all("\ufffd" not in d for d in deltas)
