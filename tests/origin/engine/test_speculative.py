from __future__ import annotations

import pytest

from origin.chat import prompt_ids
from origin.engine import Engine, EngineConfig, generate_many, seed_answers
from origin.engine.proposers import SuffixIndex, find_continuation
from origin.engine.request import Request
from origin.engine.speculative import SpecConfig, Speculator
from origin.sampling import SamplingParams
from tests.origin.engine.conftest import checked, needs_kernels, tiny_model

QUESTIONS = [
    "What is the capital of France?",
    "Tell me the capital city of France.",
    "Explain what photosynthesis is.",
    "Explain the process of photosynthesis.",
    "How many legs does a spider have?",
]
PARAMS = SamplingParams(max_tokens=40)


# the engine's default: batch-invariant fixed-order kernels (docs/engine.md), so a token verified
# inside a proposal is computed exactly as when decoded alone, on every CPU
WEIGHTS = "none"


@pytest.fixture(scope="module")
def reference(embedded_model) -> list[str]:  # type: ignore[no-untyped-def]
    model, tokenizer = embedded_model
    engine = Engine(
        model, tokenizer, EngineConfig(max_num_seqs=4, max_model_len=512, quantization=WEIGHTS)
    )
    return [c.text for c in generate_many(engine, QUESTIONS, PARAMS, progress=False)]


def _engine(embedded_model, method: str, **config: object) -> Engine:  # type: ignore[no-untyped-def]
    model, tokenizer = embedded_model
    draft = (model, tokenizer) if "draft" in method else None
    options: dict[str, object] = {"max_num_seqs": 4, "max_model_len": 512, "quantization": WEIGHTS}
    options.update(config)
    return checked(
        Engine(model, tokenizer, EngineConfig(speculative=method, **options), draft=draft)
    )  # type: ignore[arg-type]


def test_find_continuation_prefers_the_longest_latest_match() -> None:
    haystack = [1, 2, 3, 9, 1, 2, 3, 4, 5, 6, 1, 2, 3]
    assert find_continuation(haystack, haystack, (3, 2), 3) == [4, 5, 6]
    assert find_continuation([7, 8], haystack, (3, 2), 3) == []


def test_suffix_index_looks_up_and_evicts_oldest() -> None:
    index = SuffixIndex(sizes=(3, 2), max_tokens=20)
    index.add([10, 11, 12, 13, 14, 15])
    assert index.lookup([99, 11, 12], 2) == [13, 14]
    assert index.lookup([5, 6], 2) == []
    for start in range(100, 140, 8):  # 40 more tokens: the first answer is dropped
        index.add(list(range(start, start + 8)))
    assert index.lookup([99, 11, 12], 2) == []
    assert index.num_tokens <= 20
    assert index.lookup([133, 134, 135], 3) == [136, 137, 138]  # the newest is kept


def test_spec_config_is_checked() -> None:
    with pytest.raises(ValueError, match="speculative method must be one of"):
        SpecConfig(method="medusa")
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        SpecConfig(method="ngram", num_speculative_tokens=0)
    assert SpecConfig(method="ngram+suffix").methods == ["ngram", "suffix"]


@needs_kernels  # a verified token equals a decoded one only with them
@pytest.mark.parametrize("method", ["ngram", "suffix", "draft", "ngram+suffix"])
def test_greedy_output_is_identical_at_batch_1_and_4(
    embedded_model,
    reference: list[str],
    method: str,  # type: ignore[no-untyped-def]
) -> None:
    engine = _engine(embedded_model, method)
    one_by_one = [generate_many(engine, [q], PARAMS, progress=False)[0].text for q in QUESTIONS]
    batched = [c.text for c in generate_many(engine, QUESTIONS, PARAMS, progress=False)]
    assert one_by_one == reference
    assert batched == reference
    metrics = engine.metrics()["spec_decode"]
    assert metrics["num_drafts"] > 0 and metrics["num_draft_tokens"] >= metrics["num_drafts"]
    assert 0 < metrics["num_accepted_tokens"] <= metrics["num_draft_tokens"]
    assert sum(metrics["num_accepted_tokens_per_pos"]) == metrics["num_accepted_tokens"]
    if method == "draft":  # the model drafting for itself agrees on (nearly) every token
        assert metrics["acceptance_rate"] > 0.9


@needs_kernels
def test_rejection_in_the_middle_of_a_proposal(embedded_model, reference: list[str]) -> None:  # type: ignore[no-untyped-def]
    engine = _engine(embedded_model, "suffix", num_speculative_tokens=8)
    true_answer = reference[2]
    words = true_answer.split(" ")
    assert len(words) > 8
    # a stored answer that agrees for a few words, then says something else
    seed_answers(
        engine, [" ".join(words[:5]) + " nothing but purple elephants dancing on the moon."]
    )
    out = generate_many(engine, [QUESTIONS[2]], PARAMS, progress=False)[0]
    assert out.text == true_answer
    stats = engine.speculator.stats  # type: ignore[union-attr]
    per_position = stats.accepted_per_position
    assert per_position[0] > 0 and stats.num_accepted_tokens < stats.num_draft_tokens
    # some drafts were accepted part-way: more accepted at position 1 than at the last one
    assert per_position[0] > per_position[-1]


def test_cancellation_during_verification_frees_the_slot(embedded_model) -> None:  # type: ignore[no-untyped-def]
    engine = _engine(embedded_model, "draft")
    outputs = []
    prompt = prompt_ids(engine.tokenizer, QUESTIONS[2])
    request = engine.add_request(prompt, SamplingParams(max_tokens=100), outputs.append)
    for _ in range(3):
        engine.step()
    # one step by hand: schedule (with a proposal), cancel while it is verified, commit
    with engine._lock:
        for incoming in engine._incoming:
            engine.scheduler.add(incoming)
        engine._incoming.clear()
    out = engine.scheduler.schedule()
    assert out.scheduled and out.scheduled[0].proposal
    request.cancelled = True
    engine.scheduler.update(out, engine._execute(out))
    engine.scheduler.check_invariants()
    step = engine.step()
    assert step.aborted == [request]
    assert engine.runner.cache.num_free == 4 and engine.num_running == 0


@needs_kernels
def test_back_off_when_the_batch_is_large(embedded_model, reference: list[str]) -> None:  # type: ignore[no-untyped-def]
    engine = _engine(embedded_model, "ngram", spec_max_batch=2)
    batched = [c.text for c in generate_many(engine, QUESTIONS, PARAMS, progress=False)]
    assert batched == reference
    steps_with_many = engine.speculator.stats.num_drafts  # type: ignore[union-attr]
    single = _engine(embedded_model, "ngram", spec_max_batch=2)
    generate_many(single, [QUESTIONS[3]], PARAMS, progress=False)
    # with five requests decoding most steps speculate not at all
    assert steps_with_many < 5 * single.speculator.stats.num_drafts  # type: ignore[union-attr]


def test_back_off_when_acceptance_is_low(embedded_model) -> None:  # type: ignore[no-untyped-def]
    _, tokenizer = embedded_model
    speculator = Speculator(SpecConfig(method="ngram", min_accepted=0.4, cooldown_steps=5), [])
    request = Request("r", [1, 2, 3], SamplingParams(), tokenizer, {2})
    speculator.observe(request, "ngram", proposed=5, accepted=3)
    assert request.spec.cooldown == 0  # good drafts keep it going
    rejected = 0
    while request.spec.cooldown == 0:
        speculator.observe(request, "ngram", proposed=5, accepted=0)
        rejected += 1
    assert 2 <= rejected <= 8 and request.spec.cooldown == 5
    assert speculator.propose([request], [5], num_decoding=1) == [("", [])]
    assert request.spec.cooldown == 4


def test_sampled_requests_never_speculate(embedded_model) -> None:  # type: ignore[no-untyped-def]
    engine = _engine(embedded_model, "ngram")
    params = SamplingParams(max_tokens=24, temperature=0.8, seed=3)
    generate_many(engine, [QUESTIONS[2]], params, progress=False)
    assert engine.metrics()["spec_decode"]["num_drafts"] == 0


def test_draft_with_another_tokenizer_is_refused(embedded_model) -> None:  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    from semantic.loading import embedded_embedder_path

    model, tokenizer = embedded_model
    other = AutoTokenizer.from_pretrained(embedded_embedder_path())
    with pytest.raises(ValueError, match="tokenizer differs from the target's"):
        Engine(
            model,
            tokenizer,
            EngineConfig(max_num_seqs=2, max_model_len=256, speculative="draft"),
            draft=(tiny_model("llama"), other),
        )
    with pytest.raises(ValueError, match="needs a draft model"):
        Engine(
            model, tokenizer, EngineConfig(max_num_seqs=2, max_model_len=256, speculative="draft")
        )
