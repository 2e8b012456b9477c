"""The official OpenAI Python client against a running `pagoda serve`.

Run by scripts/test-openai-client.sh, which starts the server on the default
SmolLM2 model (with tests/chat_templates/smollm2_hermes_tools.jinja: the
model's template plus Hermes-style tools) and passes its base URL as
PAGODA_BASE_URL (ending in /v1). Plain Python: each `test_*` function is run
in turn; the last line printed is "N passed, M failed" and the exit status
is non-zero on any failure.

References are independent of the server where possible: the transformers
golden file (tests/golden/smollm2_q4_1.json) for the greedy first token and
the logit gap behind it, and otherwise properties every OpenAI-compatible
server must hold (greedy is deterministic, streamed deltas add up to the
whole text, a greedy token is its own top alternative, logprobs are <= 0).
"""

import json
import math
import os
import sys
import traceback
from pathlib import Path

import jsonschema
import openai

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = json.loads((ROOT / "tests/golden/smollm2_q4_1.json").read_text())
CLIENT = openai.OpenAI(
    base_url=os.environ["PAGODA_BASE_URL"],
    api_key=os.environ.get("PAGODA_API_KEY", "unused"),
    max_retries=0,
    timeout=120,
)
MODEL = os.environ.get("PAGODA_MODEL", "SmolLM2-135M-Instruct.Q4_1")
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def greedy_chat(**kw):
    return CLIENT.chat.completions.create(
        model=MODEL, messages=QUESTION, max_tokens=24, temperature=0, **kw
    )


def test_models_lists_the_served_model():
    ids = [m.id for m in CLIENT.models.list().data]
    assert ids == [MODEL], ids


def test_completion_matches_transformers_greedy():
    main = GOLDEN["main"]
    # Prompt as token ids, exactly the golden run's (no BOS).
    r = CLIENT.completions.create(
        model=MODEL, prompt=main["prompt_ids"], max_tokens=2, temperature=0
    )
    assert len(r.choices) == 1 and r.object == "text_completion"
    # The first two golden tokens are " Paris" and "." (margin 2.5 logits).
    assert r.choices[0].text == " Paris.", repr(r.choices[0].text)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens == len(main["prompt_ids"])
    assert r.usage.completion_tokens == 2
    assert r.usage.total_tokens == r.usage.prompt_tokens + 2


def test_completion_with_text_prompt_and_ignore_eos():
    r = CLIENT.completions.create(
        model=MODEL,
        prompt="The capital of France is",
        max_tokens=12,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert r.usage.completion_tokens == 12, r.usage
    assert r.choices[0].text.strip(), r


def test_chat_answers_paris():
    r = greedy_chat()
    msg = r.choices[0].message
    assert r.object == "chat.completion"
    assert msg.role == "assistant"
    assert "Paris" in msg.content, msg.content
    assert r.choices[0].finish_reason in ("stop", "length")
    assert 0 < r.usage.completion_tokens <= 24


def test_streaming_chat_equals_non_streaming_greedy():
    whole = greedy_chat().choices[0].message.content
    stream = greedy_chat(stream=True, stream_options={"include_usage": True})
    parts, roles, finishes, usage = [], [], [], None
    for chunk in stream:
        assert chunk.object == "chat.completion.chunk"
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            if c.delta.role:
                roles.append(c.delta.role)
            if c.delta.content:
                parts.append(c.delta.content)
            if c.finish_reason:
                finishes.append(c.finish_reason)
    assert "".join(parts) == whole, ("".join(parts), whole)
    assert roles == ["assistant"], roles
    assert len(finishes) == 1, finishes
    assert usage is not None and usage.completion_tokens > 0


def test_streaming_completion_equals_non_streaming():
    kw = dict(model=MODEL, prompt="Once upon a time", max_tokens=16, temperature=0)
    whole = CLIENT.completions.create(**kw).choices[0].text
    stream = CLIENT.completions.create(stream=True, **kw)
    text = "".join(c.choices[0].text for c in stream if c.choices)
    assert text == whole, (text, whole)


def test_n2_greedy_choices_agree_with_n1():
    one = greedy_chat().choices[0].message.content
    r = greedy_chat(n=2)
    assert sorted(c.index for c in r.choices) == [0, 1]
    assert [c.message.content for c in r.choices] == [one, one]


def test_n2_seeded_sampling_is_reproducible():
    kw = dict(
        model=MODEL,
        prompt="My favourite colour is",
        max_tokens=10,
        n=2,
        temperature=1.0,
        seed=1234,
        extra_body={"ignore_eos": True},
    )
    a = CLIENT.completions.create(**kw)
    b = CLIENT.completions.create(**kw)
    assert [c.text for c in a.choices] == [c.text for c in b.choices]
    assert a.usage.completion_tokens == 20, a.usage


def test_completion_logprobs():
    main = GOLDEN["main"]
    r = CLIENT.completions.create(
        model=MODEL, prompt=main["prompt_ids"], max_tokens=6, temperature=0, logprobs=2
    )
    c = r.choices[0]
    lp = c.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 6
    assert "".join(lp.tokens) == c.text, (lp.tokens, c.text)
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    for tok, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert len(top) == 2, top
        assert all(v <= 0 for v in top.values())
        # Greedy: the chosen token is the most likely one.
        assert math.isclose(logprob, max(top.values()), abs_tol=1e-5), (tok, logprob, top)
        assert sum(math.exp(v) for v in top.values()) <= 1 + 1e-4
    # Step 0 against transformers: the gap between the two most likely
    # tokens equals the gap between their logits (f16 weights: loose).
    gold = main["steps"][0]["top_logits"]
    first = sorted(lp.top_logprobs[0].values(), reverse=True)
    assert abs((first[0] - first[1]) - (gold[0] - gold[1])) < 0.25, (first, gold[:2])


def test_chat_logprobs_and_top_logprobs():
    r = greedy_chat(logprobs=True, top_logprobs=3)
    c = r.choices[0]
    content = c.logprobs.content
    assert len(content) == r.usage.completion_tokens
    tokens = [t.token for t in content]
    if c.finish_reason == "stop":
        # The stop token is listed (as vLLM does) but not part of the text.
        assert tokens[-1] not in c.message.content, tokens
        tokens = tokens[:-1]
    assert "".join(tokens) == c.message.content, (tokens, c.message.content)
    for t in content:
        assert t.logprob <= 0
        assert len(t.top_logprobs) == 3
        values = [a.logprob for a in t.top_logprobs]
        assert values == sorted(values, reverse=True), values
        assert t.top_logprobs[0].token == t.token
        assert math.isclose(t.top_logprobs[0].logprob, t.logprob, abs_tol=1e-5)


def test_negative_temperature_is_a_400():
    try:
        CLIENT.chat.completions.create(
            model=MODEL, messages=QUESTION, max_tokens=4, temperature=-1
        )
    except openai.BadRequestError as e:
        assert e.status_code == 400
        assert "temperature" in str(e), str(e)
        return
    raise AssertionError("temperature=-1 was accepted")


def test_unknown_model_is_a_400():
    try:
        CLIENT.completions.create(model="no-such-model", prompt="hi", max_tokens=1)
    except openai.BadRequestError as e:
        assert e.status_code == 400
        assert "no-such-model" in str(e), str(e)
        return
    raise AssertionError("an unknown model was accepted")


def test_unsupported_options_are_a_400_naming_them():
    for kw in (
        {"extra_body": {"use_beam_search": True}},
        {"extra_body": {"prompt_logprobs": 1}, "stream": True},
    ):
        name = next(iter(kw.get("extra_body", kw)))
        try:
            CLIENT.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=4, **kw)
        except openai.BadRequestError as e:
            assert e.status_code == 400
            assert e.param == name, (e.param, str(e))
            continue
        raise AssertionError(f"{name} was accepted")


def test_logit_bias_of_100_makes_the_model_emit_only_that_token():
    # A token of the golden prompt, named by id in the logprobs.
    token = GOLDEN["main"]["prompt_ids"][2]
    for temperature in (0, 1):
        r = CLIENT.chat.completions.create(
            model=MODEL,
            messages=QUESTION,
            max_tokens=6,
            temperature=temperature,
            seed=1,
            logit_bias={str(token): 100},
            logprobs=True,
            extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True},
        )
        got = [c.token for c in r.choices[0].logprobs.content]
        assert got == [f"token_id:{token}"] * 6, got
        r = CLIENT.completions.create(
            model=MODEL,
            prompt="The capital of France is",
            max_tokens=6,
            temperature=temperature,
            logit_bias={str(token): 100},
            logprobs=1,
            extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True},
        )
        assert r.choices[0].logprobs.tokens == [f"token_id:{token}"] * 6, r


def test_neutral_options_and_developer_role_are_accepted():
    r = CLIENT.chat.completions.create(
        model=MODEL,
        messages=[{"role": "developer", "content": "Be terse."}] + QUESTION,
        max_tokens=4,
        temperature=0,
        response_format={"type": "text"},
        user="someone",
        store=False,
        metadata={"k": "v"},
        extra_body={"add_generation_prompt": True, "chat_template_kwargs": {}},
    )
    assert r.choices[0].message.content


WEATHER_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


def weather_call(call_id, city):
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": "get_weather", "arguments": json.dumps({"city": city})},
            }
        ],
    }


# Earlier turns answered by calls, so that the small model calls greedily.
FEW_SHOT = [
    {"role": "user", "content": "What is the weather in Paris?"},
    weather_call("call_1", "Paris"),
    {"role": "user", "content": "What is the weather in London?"},
    weather_call("call_2", "London"),
    {"role": "user", "content": "What is the weather in Rome?"},
    weather_call("call_3", "Rome"),
    {"role": "user", "content": "What is the weather in Berlin?"},
]


def test_two_turn_tool_conversation():
    messages = list(FEW_SHOT)
    r = CLIENT.chat.completions.create(
        model=MODEL, messages=messages, tools=WEATHER_TOOLS, max_tokens=40, temperature=0
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    calls = choice.message.tool_calls
    assert len(calls) == 1 and calls[0].type == "function", choice.message
    assert calls[0].id.startswith("call_"), calls[0].id
    assert calls[0].function.name == "get_weather"
    assert json.loads(calls[0].function.arguments) == {"city": "Berlin"}
    assert choice.message.content is None, choice.message

    # Streamed: the same call, as deltas.
    stream = CLIENT.chat.completions.create(
        model=MODEL, messages=messages, tools=WEATHER_TOOLS, max_tokens=40, temperature=0,
        stream=True,
    )
    name, args, finish, content = None, "", None, ""
    for chunk in stream:
        for c in chunk.choices:
            content += c.delta.content or ""
            for tc in c.delta.tool_calls or []:
                assert tc.index == 0, tc
                if tc.function.name:
                    assert tc.id.startswith("call_") and tc.type == "function", tc
                    name = tc.function.name
                args += tc.function.arguments or ""
            finish = c.finish_reason or finish
    assert (name, finish, content) == ("get_weather", "tool_calls", ""), (name, finish, content)
    assert args == calls[0].function.arguments, args

    # Second turn: the assistant's call and the tool's result go back.
    messages.append(choice.message)
    messages.append({"role": "tool", "tool_call_id": calls[0].id, "content": "18 C, cloudy"})
    r2 = CLIENT.chat.completions.create(
        model=MODEL, messages=messages, tools=WEATHER_TOOLS, max_tokens=16, temperature=0
    )
    assert r2.choices[0].finish_reason in ("stop", "length", "tool_calls"), r2
    assert r2.choices[0].message.content or r2.choices[0].message.tool_calls, r2


def test_tool_choice_none_leaves_the_text():
    r = CLIENT.chat.completions.create(
        model=MODEL, messages=FEW_SHOT, tools=WEATHER_TOOLS, tool_choice="none",
        max_tokens=40, temperature=0,
    )
    msg = r.choices[0].message
    assert not msg.tool_calls and "<tool_call>" in msg.content, msg
    assert r.choices[0].finish_reason == "stop", r


def test_tool_choice_required_forces_a_parseable_call():
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        r = CLIENT.chat.completions.create(
            model=MODEL, messages=QUESTION, tools=WEATHER_TOOLS, tool_choice=choice,
            max_tokens=64, temperature=0,
        )
        calls = r.choices[0].message.tool_calls
        assert calls and calls[0].function.name == "get_weather", r
        assert "city" in json.loads(calls[0].function.arguments), calls[0]


SCHEMAS = json.loads((ROOT / "tests/structured_schemas.json").read_text())


def constrained_chat(prompt, stream, **kw):
    """Greedy chat under a constraint; returns (text, finish_reason)."""
    args = dict(
        model=MODEL,
        messages=[{"role": "user", "content": prompt + " Answer in JSON."}],
        max_tokens=200,
        temperature=0,
        **kw,
    )
    if not stream:
        r = CLIENT.chat.completions.create(**args)
        return r.choices[0].message.content, r.choices[0].finish_reason
    text, finish = "", None
    for c in CLIENT.chat.completions.create(stream=True, **args):
        if c.choices:
            text += c.choices[0].delta.content or ""
            finish = c.choices[0].finish_reason or finish
    return text, finish


def test_json_schema_corpus_outputs_validate_streamed_and_not():
    # Every schema of the corpus, streamed and not, 8 requests at a time
    # (the server batches them): the output must be complete (finish
    # "stop", not truncated), parse, and validate against its schema.
    from concurrent.futures import ThreadPoolExecutor

    assert len(SCHEMAS) >= 50

    def one(job):
        case, stream = job
        rf = {
            "type": "json_schema",
            "json_schema": {"name": case["name"], "schema": case["schema"], "strict": True},
        }
        text, finish = None, None
        try:
            text, finish = constrained_chat(case["prompt"], stream, response_format=rf)
            assert finish == "stop", f"finish {finish}"
            jsonschema.validate(json.loads(text), case["schema"])
        except Exception as e:
            return f"{case['name']} (stream={stream}): {e}: {text!r}"
        return None

    jobs = [(c, s) for c in SCHEMAS for s in (False, True)]
    with ThreadPoolExecutor(8) as pool:
        errors = [e for e in pool.map(one, jobs) if e]
    assert not errors, "\n".join(errors)


def test_json_mode_gives_a_json_object_streamed_and_not():
    for stream in (False, True):
        text, finish = constrained_chat(
            'Return a JSON object with keys "name" and "age" for Alice, 30.',
            stream,
            response_format={"type": "json_object"},
        )
        assert finish == "stop", (finish, text)
        doc = json.loads(text)
        assert isinstance(doc, dict) and "name" in doc, text


def test_prompt_logprobs_via_extra_body():
    main = GOLDEN["main"]
    # The golden prompt and transformers' first 3 greedy tokens: each of
    # those is the most likely token after its prefix.
    prompt = main["prompt_ids"] + main["output_ids"][:3]
    r = CLIENT.completions.create(
        model=MODEL, prompt=prompt, max_tokens=1, temperature=0,
        extra_body={"prompt_logprobs": 2},
    )
    plp = r.choices[0].to_dict()["prompt_logprobs"]
    assert len(plp) == len(prompt) and plp[0] is None, plp
    for k, (tok, entry) in enumerate(zip(prompt[1:], plp[1:]), start=1):
        own = entry[str(tok)]
        assert own["logprob"] <= 0 and isinstance(own["decoded_token"], str), entry
        assert len(entry) in (2, 3), entry
        if k >= len(main["prompt_ids"]):
            assert own["rank"] == 1, (k, entry)
    r = CLIENT.chat.completions.create(
        model=MODEL, messages=QUESTION, max_tokens=2, temperature=0,
        extra_body={"prompt_logprobs": 0},
    )
    plp = r.to_dict()["prompt_logprobs"]
    assert len(plp) == r.usage.prompt_tokens and plp[0] is None
    assert all(len(e) == 1 for e in plp[1:]), plp


def test_gbnf_grammar_via_extra_body():
    r = CLIENT.completions.create(
        model=MODEL, prompt="Year:", max_tokens=8, temperature=0,
        extra_body={"guided_grammar": 'root ::= [12] [0-9]{3} # a year'},
    )
    t = r.choices[0].text
    assert len(t) == 4 and t.isdigit(), t


def test_vllm_guided_fields_and_bad_schema():
    r = CLIENT.completions.create(
        model=MODEL,
        prompt="The sky is",
        max_tokens=8,
        temperature=0,
        extra_body={"guided_choice": ["blue", "green"]},
    )
    assert r.choices[0].text in ("blue", "green"), r.choices[0].text
    r = CLIENT.completions.create(
        model=MODEL,
        prompt="Year:",
        max_tokens=8,
        temperature=0,
        extra_body={"structured_outputs": {"regex": "[12][0-9]{3}"}},
    )
    t = r.choices[0].text
    assert len(t) == 4 and t.isdigit(), t
    try:
        CLIENT.chat.completions.create(
            model=MODEL,
            messages=QUESTION,
            max_tokens=4,
            extra_body={"guided_json": "{not json"},
        )
    except openai.BadRequestError as e:
        assert e.param == "guided_json", (e.param, str(e))
        return
    raise AssertionError("a bad schema was accepted")


def main():
    tests = [(n, f) for n, f in globals().items() if n.startswith("test_") and callable(f)]
    failed = 0
    for name, fn in tests:
        try:
            fn()
            print(f"ok    {name}")
        except Exception:
            failed += 1
            print(f"FAIL  {name}")
            traceback.print_exc(file=sys.stdout)
    print(f"{len(tests) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
