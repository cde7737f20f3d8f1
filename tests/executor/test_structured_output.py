"""Structured output in the engine: with the embedded model's random weights, only the grammar's
mask can make the output parse, so every completion that ends with "stop" must match."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from allocator_service.local_block_allocator import LocalBlockAllocator
from executor_service.engine.build import EngineOptions, build_engine
from executor_service.engine.offline import generate
from executor_service.engine.token_mask import TokenMaskWorker
from executor_service.model.embedded import EOS_TOKEN_ID, VOCAB_SIZE, embedded_model_dir
from pagedserve.common.errors import InvalidArgument
from pagedserve.protocol.sampling_params import InvalidSamplingParams, SamplingParams
from pagedserve.protocol.structured_output import StructuredOutput

PROMPT = list(b"Answer: ")
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "role": {"enum": ["admin", "user"]},
        "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]{1,4}$"},
                 "maxItems": 3},
        "contact": {"anyOf": [{"type": "null"},
                              {"type": "object", "properties": {"email": {"type": "string",
                                                                          "maxLength": 6}},
                               "required": ["email"], "additionalProperties": False}]},
    },
    "required": ["name", "age", "role", "contact"],
    "additionalProperties": False,
}


def check_person(value) -> None:
    """PERSON's constraints, checked by hand (no schema validator is a dependency)."""
    assert isinstance(value, dict) and set(value) <= set(PERSON["properties"])
    assert {"name", "age", "role", "contact"} <= set(value)
    assert isinstance(value["name"], str) and len(value["name"]) <= 8
    assert type(value["age"]) is int and 0 <= value["age"] <= 150
    assert value["role"] in ("admin", "user")
    for tag in value.get("tags", []):
        assert re.fullmatch("[a-z]{1,4}", tag)
    assert len(value.get("tags", [])) <= 3
    assert value["contact"] is None or (set(value["contact"]) == {"email"}
                                        and len(value["contact"]["email"]) <= 6)


def text(tokens: list[int]) -> str:
    return bytes(t for t in tokens if t < 256).decode()


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    directory: Path = embedded_model_dir(tmp_path_factory.mktemp("cache"))
    return build_engine(directory, EngineOptions(num_blocks=128, max_num_seqs=16),
                        LocalBlockAllocator())


def constrained(kind: str, spec: str = "", **fields) -> SamplingParams:
    fields = {"temperature": 1.0, "max_tokens": 200, **fields}
    return SamplingParams(structured=StructuredOutput(kind, spec), **fields)


def test_json_schema_output_always_validates_for_every_choice(engine):
    params = constrained("json_schema", json.dumps(PERSON), n=3, seed=7)
    (completion,) = generate(engine, [PROMPT], params)
    for tokens, reason in zip(completion.choices, completion.finish_reasons):
        assert reason == "stop"
        check_person(json.loads(text(tokens)))
    assert len({tuple(tokens) for tokens in completion.choices}) > 1, "n children share state"


def test_best_of_samples_each_follow_their_own_grammar_state(engine):
    params = constrained("json_schema", json.dumps(PERSON), n=2, best_of=4, seed=3,
                         logprobs=0)
    (completion,) = generate(engine, [PROMPT], params)
    for tokens in completion.choices:
        check_person(json.loads(text(tokens)))


def test_json_object_is_one_json_object(engine):
    # The random model rarely writes a closing quote or brace, and unlike the schema above
    # "any object" bounds no string: biases on '"' and '}' let most texts end within
    # max_tokens (when they end is the model's choice). What they end as is the grammar's.
    bias = ((ord('"'), 6.0), (ord("}"), 9.5))
    completions = generate(engine, [PROMPT] * 6, [
        constrained("json_object", seed=seed, logit_bias=bias, max_tokens=300)
        for seed in range(6)])
    finished = [c for c in completions if c.finish_reasons == ["stop"]]
    assert len(finished) >= 3
    for completion in finished:
        assert isinstance(json.loads(text(completion.choices[0])), dict)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_regex_choice_and_grammar_outputs_match(engine, temperature):
    grammar = 'root ::= "SELECT " col " FROM " [a-z]{1,6}\ncol ::= "id" | "name" | "*"'
    regex, choices = r"\d{3}-[a-z]{2,5}( ok)?", ["yes", "no", "maybe later"]
    completions = generate(engine, [PROMPT] * 3, [
        constrained("regex", regex, temperature=temperature, seed=1),
        constrained("choice", json.dumps(choices), temperature=temperature, seed=1),
        constrained("grammar", grammar, temperature=temperature, seed=1)])
    outputs = [text(c.choices[0]) for c in completions]
    assert all(c.finish_reasons == ["stop"] for c in completions)
    assert re.fullmatch(regex, outputs[0])
    assert outputs[1] in choices
    assert re.fullmatch(r"SELECT (id|name|\*) FROM [a-z]{1,6}", outputs[2])


@pytest.mark.parametrize("ignore_eos", [False, True])
def test_a_complete_grammar_forces_eos_and_stops(engine, ignore_eos):
    (completion,) = generate(engine, [PROMPT], constrained("choice", '["ab"]',
                                                           ignore_eos=ignore_eos))
    assert completion.choices == [[*b"ab", EOS_TOKEN_ID]]
    assert completion.finish_reasons == ["stop"]


def test_eos_only_where_the_grammar_may_end(engine):
    # A huge bias makes EOS the model's favourite; the grammar still needs three digits first.
    params = constrained("regex", r"[0-9]{3}[a-z]*", temperature=0.0,
                         logit_bias=((EOS_TOKEN_ID, 100.0),))
    (completion,) = generate(engine, [PROMPT], params)
    assert re.fullmatch(r"[0-9]{3}", text(completion.choices[0]))
    assert completion.choices[0][-1] == EOS_TOKEN_ID


def test_preempted_requests_keep_a_valid_grammar_state(tmp_path_factory):
    directory = embedded_model_dir(tmp_path_factory.mktemp("cache"))
    # 12 blocks of 16 tokens cannot hold six growing sequences at once: some are preempted
    # and recomputed, and their matchers must go on where their tokens left them.
    engine = build_engine(directory, EngineOptions(num_blocks=12, max_num_seqs=6),
                          LocalBlockAllocator())
    params = [constrained("json_schema", json.dumps(PERSON), seed=seed, max_tokens=60)
              for seed in range(6)]
    completions = generate(engine, [PROMPT] * 6, params)
    assert engine.scheduler.num_preemptions > 0
    for completion in completions:
        if completion.finish_reasons == ["stop"]:
            check_person(json.loads(text(completion.choices[0])))
        else:
            assert completion.finish_reasons == ["length"]


@pytest.mark.parametrize("kind, spec, words", [
    ("json_schema", '{"type": "strin"}', "json_schema is invalid"),
    ("json_schema", "[1, 2]", "json_schema is invalid"),
    ("regex", "a(b", "regex is invalid"),
    ("choice", "[]", "choice is invalid"),
    ("grammar", 'root ::= "a" undefined_rule', "grammar is invalid"),
])
def test_invalid_constraint_is_refused_before_anything_runs(engine, kind, spec, words):
    with pytest.raises(InvalidArgument, match=words):
        engine.add_request(f"bad-{kind}", PROMPT, constrained(kind, spec))
    assert f"bad-{kind}" not in engine.requests


def test_a_tokenizer_llguidance_cannot_read_costs_structured_output_only(tmp_path_factory):
    # A WordLevel vocabulary with no decoder (what bench.serve --gpu writes): llguidance has
    # no byte mapping for it. The executor must still start and serve free text.
    from tokenizers import Tokenizer, models

    directory = tmp_path_factory.mktemp("word-level") / "model"
    shutil.copytree(embedded_model_dir(tmp_path_factory.mktemp("cache")), directory)
    Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB_SIZE)}, unk_token="t0")).save(
        str(directory / "tokenizer.json"))
    engine = build_engine(directory, EngineOptions(num_blocks=64, max_num_seqs=4),
                          LocalBlockAllocator())
    with pytest.raises(InvalidArgument, match=r"structured output is off for this model: "
                                              r"llguidance cannot read its tokenizer\.json"):
        engine.add_request("constrained", PROMPT, constrained("json_object"))
    assert "constrained" not in engine.requests
    (completion,) = generate(engine, [PROMPT], SamplingParams(max_tokens=5, ignore_eos=True))
    assert len(completion.choices[0]) == 5


def test_structured_output_with_beam_search_is_refused():
    with pytest.raises(InvalidSamplingParams, match="structured output is not supported with "
                                                    "beam search"):
        constrained("json_object", beam_width=2, temperature=0.0).validate(300)


def test_logit_bias_forces_a_token_and_allowed_ids_restrict(engine):
    forced, allowed = ord("Q"), tuple(b"ab")
    completions = generate(engine, [PROMPT] * 2, [
        SamplingParams(temperature=0.0, max_tokens=5, logit_bias=((forced, 100.0),)),
        SamplingParams(temperature=1.0, seed=2, max_tokens=20, allowed_token_ids=allowed)])
    assert completions[0].choices == [[forced] * 5]
    assert set(completions[1].choices[0]) <= set(allowed)


@pytest.mark.parametrize("params, words", [
    (SamplingParams(logit_bias=((5, 101.0),)), "logit_bias values must be in"),
    (SamplingParams(logit_bias=((10**6, 1.0),)), "logit_bias token ids must be in"),
    (SamplingParams(allowed_token_ids=(-1,)), "allowed_token_ids must be in"),
])
def test_bias_and_allowed_ids_out_of_range_are_refused(params, words):
    with pytest.raises(InvalidSamplingParams, match=words):
        params.validate(300)


def test_compiled_grammars_are_cached_by_kind_and_spec(engine):
    before = engine.grammars.num_compiled
    for _ in range(3):
        engine.grammars.matcher(StructuredOutput("regex", "cached[0-9]"))
    assert engine.grammars.num_compiled == before + 1


def test_a_constrained_sequence_the_mask_thread_missed_gets_its_mask_late(engine):
    engine.add_request("late", PROMPT, constrained("choice", '["xy"]'))
    (seq,) = engine.requests["late"].sequences
    masks = TokenMaskWorker(VOCAB_SIZE).start([]).wait()
    row = masks.row(seq)
    allowed = [t for t in range(VOCAB_SIZE) if (int(row[t // 32]) >> (t % 32)) & 1]
    assert allowed == [ord("x")]
    engine.abort("late")
    engine.drain_outputs()
