#!/usr/bin/env python3
"""Golden chat-template renderings with tools, from Hugging Face transformers.

Run with the reference venv from the repository root:
    /work/refenv/bin/python scripts/golden/chat_template_tools.py

Renders tests/chat_templates/smollm2_hermes_tools.jinja (Qwen 2.5's tool
logic on SmolLM2's ChatML) with transformers' own Jinja rendering, for
conversations in OpenAI's request form (tool call arguments as JSON text)
turned into what templates get as vLLM does (arguments parsed into a
mapping), with `tools` and extra keyword arguments. Writes
tests/golden/chat_template_tools.json: per case the OpenAI-form messages,
tools, kwargs and the rendering.
"""
import copy
import json
import os

from transformers.utils.chat_template_utils import render_jinja_template

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TEMPLATE = os.path.join(ROOT, "tests", "chat_templates", "smollm2_hermes_tools.jinja")
OUT = os.path.join(ROOT, "tests", "golden", "chat_template_tools.json")

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the weather in a city, e.g. \"Zürich\"",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "unit": {"type": "string", "enum": ["C", "F"]},
                },
                "required": ["city"],
            },
        },
    },
    {"type": "function", "function": {"name": "now", "parameters": {"type": "object"}}},
]


def call(call_id, name, args):
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": json.dumps(args)}}


CASES = [
    {
        "name": "two_turns_with_calls_and_results",
        "messages": [
            {"role": "system", "content": "You help with the weather."},
            {"role": "user", "content": "Weather in Zürich and the time?"},
            {"role": "assistant", "content": None, "tool_calls": [
                call("call_1", "get_weather", {"city": "Zürich", "unit": "C"}),
                call("call_2", "now", {}),
            ]},
            {"role": "tool", "tool_call_id": "call_1", "content": "12 C"},
            {"role": "tool", "tool_call_id": "call_2", "content": "10:00"},
            {"role": "assistant", "content": "It is 12 C at 10:00."},
            {"role": "user", "content": "And in Oslo?"},
            {"role": "assistant", "content": "Checking.", "tool_calls": [
                call("call_3", "get_weather", {"city": "Oslo"}),
            ]},
            {"role": "tool", "tool_call_id": "call_3", "content": "3 C"},
        ],
        "tools": TOOLS,
        "kwargs": {},
    },
    {
        "name": "no_tools_thinking_off",
        "messages": [{"role": "user", "content": "Hi"}],
        "tools": None,
        "kwargs": {"enable_thinking": False},
    },
]


def for_template(messages):
    """vLLM's step: tool call arguments (JSON text) become mappings."""
    out = copy.deepcopy(messages)
    for m in out:
        for c in m.get("tool_calls") or []:
            c["function"]["arguments"] = json.loads(c["function"]["arguments"])
    return out


def main():
    template = open(TEMPLATE).read()
    cases = []
    for case in CASES:
        rendered, _ = render_jinja_template(
            conversations=[for_template(case["messages"])],
            tools=case["tools"],
            chat_template=template,
            add_generation_prompt=True,
            **case["kwargs"],
        )
        cases.append({**case, "rendered": rendered[0]})
    with open(OUT, "w") as f:
        json.dump({"template": "tests/chat_templates/smollm2_hermes_tools.jinja",
                   "cases": cases}, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
