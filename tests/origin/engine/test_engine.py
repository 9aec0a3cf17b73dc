from __future__ import annotations

import asyncio
import dataclasses

import pytest

from origin.chat import prompt_ids
from origin.engine import Engine, EngineConfig, RequestOutput, generate_many, open_stream
from origin.engine.runner import HFRunner
from origin.engine.scheduler import SHARED_PREFIX_MIN
from origin.sampling import SamplingParams
from tests.origin.engine.conftest import checked, needs_kernels
from tests.origin.reference import answer

QUESTIONS = [
    "What is the capital of France?",
    "Name three primary colors.",
    "How many legs does a spider have?",
    "What is 2 + 2?",
    "Who wrote Romeo and Juliet?",
    "What color is the sky on a clear day?",
]
GREEDY = SamplingParams(max_tokens=24)


@needs_kernels  # the library kernels promise no batch invariance (docs/engine.md)
def test_batched_greedy_equals_one_at_a_time(engine_fp32: Engine, embedded_model) -> None:  # type: ignore[no-untyped-def]
    model, tokenizer = embedded_model
    results = generate_many(engine_fp32, QUESTIONS, GREEDY, progress=False)  # 6 requests, 4 slots
    for question, result in zip(QUESTIONS, results, strict=True):
        assert result.text == answer(model, tokenizer, question, GREEDY), question
        assert result.finish_reason in ("stop", "length")
    assert "Paris" in results[0].text
    assert engine_fp32.num_running == 0 and engine_fp32.runner.cache.num_free == 4


def test_stream_yields_the_same_text_and_timings(engine_fp32: Engine) -> None:
    async def run() -> tuple[str, list]:
        parts, outputs = [], []
        async with open_stream(engine_fp32, QUESTIONS[0], GREEDY) as stream:
            async for output in stream:
                parts.append(output.delta_text)
                outputs.append(output)
        return "".join(parts), outputs

    engine_fp32.start()
    try:
        text, outputs = asyncio.run(run())
    finally:
        engine_fp32.stop()
    assert text == generate_many(engine_fp32, [QUESTIONS[0]], GREEDY, progress=False)[0].text
    last = outputs[-1]
    assert last.finished and last.finish_reason == "stop"
    t = last.times
    assert t.arrival <= t.scheduled <= t.first_token <= t.tokens[-1] <= t.finished  # type: ignore[operator]
    assert len(t.tokens) == last.completion_tokens
    assert t.queue_s is not None and t.ttft_compute_s is not None and t.ttft_s is not None


def test_leaving_a_stream_early_cancels_and_frees_the_slot(engine_fp32: Engine) -> None:
    async def run() -> int:
        seen = 0
        long = SamplingParams(max_tokens=200)
        async with open_stream(engine_fp32, "Write a long essay about rivers.", long) as stream:
            async for output in stream:
                seen += len(output.delta_token_ids)
                if seen >= 3:
                    break
        return seen

    engine_fp32.start()
    try:
        assert asyncio.run(run()) >= 3
        for _ in range(200):
            if engine_fp32.num_running == 0 and engine_fp32.num_waiting == 0:
                break
            asyncio.run(asyncio.sleep(0.02))
        assert engine_fp32.num_running == 0
        assert engine_fp32.runner.cache.num_free == 4
        assert engine_fp32.stats.requests_finished.get("abort", 0) >= 1
    finally:
        engine_fp32.stop()


def test_cancel_by_id_takes_effect_at_the_next_step(engine_fp32: Engine) -> None:
    outputs = []
    request = engine_fp32.add_request(
        prompt_ids(engine_fp32.tokenizer, "Tell me a story."),
        SamplingParams(max_tokens=100),
        outputs.append,
    )
    engine_fp32.step()
    assert engine_fp32.num_running == 1
    assert engine_fp32.cancel(request.request_id)
    out = engine_fp32.step()
    assert out.aborted == [request] and engine_fp32.num_running == 0
    assert outputs[-1].finished and outputs[-1].finish_reason == "abort"
    assert not engine_fp32.cancel(request.request_id)  # already gone


def test_requests_leaving_their_slots_release_the_runners_caches(embedded_model) -> None:  # type: ignore[no-untyped-def]
    model, tokenizer = embedded_model
    runner = HFRunner(model, num_slots=4, max_len=256)  # a transformers cache per slot
    engine = checked(
        Engine(model, tokenizer, EngineConfig(max_num_seqs=4, max_model_len=256), runner=runner)
    )
    outputs: list[RequestOutput] = []
    finishing = [
        engine.add_request(prompt_ids(tokenizer, q), SamplingParams(max_tokens=6), outputs.append)
        for q in QUESTIONS[:2]
    ]
    essay = prompt_ids(tokenizer, "Write a long essay about rivers.")
    cancelled = engine.add_request(essay, SamplingParams(max_tokens=100), outputs.append)
    engine.step()
    assert sorted(runner._caches) == [0, 1, 2]  # one per running request
    assert engine.cancel(cancelled.request_id)
    engine.step()
    assert cancelled.finish_reason == "abort" and sorted(runner._caches) == [0, 1]
    while engine.scheduler.has_work:
        engine.step()
    assert all(r.finish_reason in ("stop", "length") for r in finishing)
    assert runner._caches == {}
    assert sum(o.finished for o in outputs) == 3


def test_stop_strings_and_max_tokens(engine_fp32: Engine) -> None:
    stop, length = generate_many(
        engine_fp32,
        [QUESTIONS[0], "Write a poem about the sea."],
        [SamplingParams(max_tokens=24, stop=("Paris",)), SamplingParams(max_tokens=5)],
        progress=False,
    )
    assert stop.finish_reason == "stop" and "Paris" not in stop.text
    assert stop.text.startswith("The capital of France is")
    assert length.finish_reason == "length" and len(length.token_ids) == 5


def test_seeded_sampling_is_reproducible(engine_fp32: Engine) -> None:
    params = SamplingParams(max_tokens=16, temperature=0.9, top_p=0.9, seed=11)
    first = generate_many(engine_fp32, ["Tell me a fun fact."] * 2, params, progress=False)
    second = generate_many(engine_fp32, ["Tell me a fun fact."] * 2, params, progress=False)
    assert [c.text for c in first] == [c.text for c in second]


@needs_kernels
def test_preemption_under_a_small_kv_cache_keeps_greedy_output(embedded_model) -> None:  # type: ignore[no-untyped-def]
    model, tokenizer = embedded_model
    engine = checked(
        Engine(
            model,
            tokenizer,
            EngineConfig(max_num_seqs=4, max_model_len=160, kv_cache_tokens=200, token_budget=256),
        )
    )
    roomy = Engine(model, tokenizer, EngineConfig(max_num_seqs=4, max_model_len=160))
    params = SamplingParams(max_tokens=60, ignore_eos=True)
    results = generate_many(engine, QUESTIONS[:4], params, progress=False)
    assert engine.stats.preemptions > 0
    expected = generate_many(roomy, QUESTIONS[:4], params, progress=False)
    assert roomy.stats.preemptions == 0
    assert [r.text for r in results] == [r.text for r in expected]
    assert all(len(r.token_ids) == 60 for r in results)


@needs_kernels  # prefixes are shared only with them
@pytest.mark.parametrize("quantization", ["none", "gguf-a8"])
def test_requests_sharing_a_prefix_start_from_it_and_answer_the_same(
    embedded_model, quantization
) -> None:  # type: ignore[no-untyped-def]
    """Prefix sharing: a chat template's system prompt (and a repeated question) is computed
    once; with the fixed-order kernels a copied prefix is what the request would have computed,
    so every answer is the one computed without sharing."""
    model, tokenizer = embedded_model
    config = EngineConfig(max_num_seqs=2, max_model_len=512, quantization=quantization)
    shared = checked(Engine(model, tokenizer, config))
    alone = Engine(model, tokenizer, dataclasses.replace(config, prefix_caching=False))
    questions = [*QUESTIONS[:4], QUESTIONS[0]]  # 2 slots: sources running and freed; a repeat
    short = SamplingParams(max_tokens=8)  # what is shared is the prompt: a few tokens show it
    got = generate_many(shared, questions, short, progress=False)
    want = generate_many(alone, questions, short, progress=False)
    assert [r.text for r in got] == [r.text for r in want]
    assert alone.scheduler.prefix_tokens_shared == 0
    prompt = len(prompt_ids(tokenizer, QUESTIONS[0]))
    # the three admitted after the first step share the template; the repeat all but one token
    assert shared.scheduler.prefix_tokens_shared >= 2 * SHARED_PREFIX_MIN + prompt - 1
    assert shared.metrics()["prefix_tokens_shared"] == shared.scheduler.prefix_tokens_shared


def test_bad_requests_are_refused_clearly(engine_fp32: Engine) -> None:
    hi = prompt_ids(engine_fp32.tokenizer, "hi")
    with pytest.raises(ValueError, match="exceeds max_model_len 512"):
        engine_fp32.add_request(hi, SamplingParams(max_tokens=600))
    with pytest.raises(ValueError, match="prompt is empty"):
        engine_fp32.add_request([], GREEDY)
    with pytest.raises(ValueError, match="prompt is empty"):
        generate_many(engine_fp32, [[]], GREEDY, progress=False)


def test_the_core_takes_token_ids_and_the_front_ends_own_the_template(
    engine_fp32: Engine,
) -> None:
    """A str, a mix or an id outside the vocabulary is the front end's job or an error, never a
    request; a question, its chat messages and its ids are one request to the front ends."""
    vocab = len(engine_fp32.tokenizer)
    for bad, error, match in [
        ("What is 2 + 2?", TypeError, "takes token ids"),
        ([1, "2"], TypeError, "must be ints"),
        ([1, True], TypeError, "must be ints"),
        ([1, vocab], ValueError, "outside the vocabulary"),
        ([-1], ValueError, "outside the vocabulary"),
    ]:
        with pytest.raises(error, match=match):
            engine_fp32.add_request(bad, GREEDY)  # type: ignore[arg-type]
    assert engine_fp32.num_waiting == 0  # nothing was queued
    with pytest.raises(TypeError, match="not a mix"):
        prompt_ids(engine_fp32.tokenizer, [{"role": "user", "content": "hi"}, 3])  # type: ignore[list-item]
    question = QUESTIONS[3]
    messages = [{"role": "user", "content": question}]
    ids = prompt_ids(engine_fp32.tokenizer, question)
    assert ids == prompt_ids(engine_fp32.tokenizer, messages)
    short = SamplingParams(max_tokens=6)
    texts = [
        c.text for c in generate_many(engine_fp32, [question, messages, ids], short, progress=False)
    ]
    assert texts[0] and texts == [texts[0]] * 3


def test_int8_engine_answers_and_mostly_agrees(embedded_model) -> None:  # type: ignore[no-untyped-def]
    model, tokenizer = embedded_model
    engine = checked(
        Engine(
            model, tokenizer, EngineConfig(max_num_seqs=4, max_model_len=256, quantization="int8")
        )
    )
    results = generate_many(engine, QUESTIONS[:4], GREEDY, progress=False)
    assert "Paris" in results[0].text
    assert engine.runner.weight_bytes < 0.5 * sum(
        p.numel() * p.element_size() for p in model.parameters()
    )


def test_engine_from_environment(model_cache_dir) -> None:  # type: ignore[no-untyped-def]
    from origin.config import EngineSettings
    from origin.runtime import build_engine

    settings = EngineSettings.from_env(
        {
            "EDGEQA_CACHE_DIR": str(model_cache_dir),
            "EDGEQA_MAX_NUM_SEQS": "2",
            "EDGEQA_MAX_MODEL_LEN": "256",
            "EDGEQA_QUANTIZATION": "none",
            "EDGEQA_PREFIX_CACHING": "false",
        }
    )
    engine = build_engine(settings)
    assert engine.config.max_num_seqs == 2 and engine.config.quantization == "none"
    assert not engine.config.prefix_caching and not engine.scheduler.share_prefixes
    assert engine.runner.cache.num_slots == 2 and engine.runner.cache.max_len == 256
    result = generate_many(engine, [QUESTIONS[0]], GREEDY, progress=False)[0]
    assert "Paris" in result.text


@pytest.mark.gpu
@pytest.mark.parametrize("quantization", ["none", "int8"])
def test_cuda_engine_bf16_and_llm_int8(model_cache_dir, quantization: str) -> None:  # type: ignore[no-untyped-def]
    from origin.model import load_model

    model, tokenizer = load_model("embedded", device="cuda", cache_dir=model_cache_dir)
    engine = checked(
        Engine(
            model,
            tokenizer,
            EngineConfig(max_num_seqs=4, max_model_len=256, quantization=quantization),
        )
    )
    results = generate_many(engine, QUESTIONS[:4], GREEDY, progress=False)
    assert "Paris" in results[0].text
    assert all(r.finish_reason in ("stop", "length") for r in results)
