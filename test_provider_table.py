"""The provider table is the single source (issue 20 item 2) and what is sent is what is pinned
(issue 21 item 2): no provider is named outside its own class, each class owns its wire format,
a request key that changes who answers, what the model is told or may call, or how the answer is
read is refused for every provider in any spelling a server reads, and the body that reaches each
server carries exactly the config's instructions, input and tools. regression.py copied alone
runs on the standard library for every provider but the SDK one.
"""

import ast
import json
import os
import shutil
import subprocess
import sys

import pytest
from hypothesis import given, settings, strategies as st

import fakes
import regression
from fakes import FakeServer
from testkit import ROOT, clean_env, cli_env, read_record, run_main, write_suite  # noqa: F401

TRAJECTORIES = ROOT / "suites" / "agent-trajectories.json"


# ============================================================ no provider named outside its class


def _keys(tree):
    """Literals that are keys, not names: docstrings, dict keys, subscripts (values["replay"] is
    the --replay flag, reserved["echo"] a request key) and flag names (PATH_FLAGS); a subscript
    of PROVIDERS names a provider and counts."""
    skip = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            skip.update(id(key) for key in node.keys if key is not None)
        elif isinstance(node, ast.Subscript) and not (
            isinstance(node.value, ast.Name) and node.value.id == "PROVIDERS"
        ):
            skip.add(id(node.slice))
        elif isinstance(node, ast.Assign) and any(
            getattr(target, "id", "") == "PATH_FLAGS" for target in node.targets
        ):
            skip.update(id(item) for item in ast.walk(node.value))
    return skip


def _literals(path):
    """(line, text, the class it is in) of every string literal of a file that is no key."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip, owner = _keys(tree), {}
    providers = {cls.__name__ for cls in regression.PROVIDERS.values()}
    for cls in tree.body:  # the provider classes are top-level
        if isinstance(cls, ast.ClassDef) and cls.name in providers:
            owner.update({id(node): cls.name for node in ast.walk(cls)})
    return [
        (node.lineno, node.value, owner.get(id(node)))
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip
    ]


@pytest.mark.parametrize("path", [ROOT / "regression.py", ROOT / "compare_runs.py"])
def test_no_provider_is_named_outside_its_own_class(path):
    """A provider's name (or `--provider NAME`) is written only inside its class: everything else
    asks the table (DEFAULT_PROVIDER, record_provider, providers_with, the class attributes)."""
    classes = {name: cls.__name__ for name, cls in regression.PROVIDERS.items()}
    offenders = [
        f"{path.name}:{line}: {text!r}"
        for line, text, owner in _literals(path)
        for name, cls in classes.items()
        if owner != cls
        and (text == name or (path.name == "regression.py" and f"--provider {name}" in text))
    ]
    assert not offenders, offenders


@pytest.mark.parametrize("name", sorted(regression.PROVIDERS))
def test_every_provider_class_owns_its_wire_format(name):
    cls = regression.PROVIDERS[name]
    if cls.replays_record:  # a replay reads with the wire format of the record's provider
        return
    own = {
        attribute
        for klass in cls.__mro__[: cls.__mro__.index(regression.Provider)]
        for attribute in vars(klass)
    }
    assert {"body", "parse", "request"} <= own, own
    assert "call_ids" in own or not cls.base_url_flag
    if cls.base_url_flag:  # the urllib providers share the one transport
        assert issubclass(cls, regression.HTTPProvider) and "post" not in vars(cls)


def test_a_record_that_names_no_provider_was_made_by_the_default_one():
    assert regression.record_provider({}) == {"name": regression.DEFAULT_PROVIDER}
    assert regression.DEFAULT_PROVIDER in regression.PROVIDERS
    replayer = regression.ReplayProvider({"runs": []}, "old.json")
    assert replayer.made_by is regression.PROVIDERS[regression.DEFAULT_PROVIDER]
    chat = regression.ReplayProvider({"provider": {"name": "openai"}, "runs": []}, "chat.json")
    assert chat.parse == regression.OpenAIProvider.parse and not chat.agent_responses


# ========================================================================== reserved request keys


def _reserved():
    """[(key, value that trips it)] of every reserved key of the shared table and every class."""
    found = []
    for table in (
        regression.REQUEST_RESERVED,
        *(cls.reserved for cls in regression.PROVIDERS.values()),
    ):
        for key, why in table.items():
            found += (
                [(key, {sub: {"type": "json_schema"}}) for sub in why]
                if isinstance(why, dict)
                else [(key, "x")]
            )
    return found


RESERVED = _reserved()
CLOSED = {  # every key of each API (as its reference lists it) that changes what is pinned
    "perplexity": [
        "input",
        "instructions",
        "model",
        "models",
        "preset",
        "previous_response_id",
        "profile",
        "response_format",
        "skills",
        "stream",
        "tools",
        "background",
    ],
    "openai": [
        "messages",
        "model",
        "tools",
        "tool_choice",
        "functions",
        "function_call",
        "response_format",
        "n",
        "stream",
        "modalities",
        "audio",
        "web_search_options",
        "prompt",
        "guided_json",
        "grammar",
        "chat_template",
        "documents",
        "lora",
        "route",
        "plugins",
        "transforms",
        "previous_response_id",
    ],
    "anthropic": [
        "messages",
        "model",
        "system",
        "tools",
        "tool_choice",
        "mcp_servers",
        "container",
        "context_management",
        "output_format",
        "stream",
    ],
}
ALLOWED = {
    "seed": 7,
    "temperature": 0.2,
    "top_p": 0.9,
    "top_k": 40,
    "max_tokens": 64,
    "max_completion_tokens": 64,
    "max_output_tokens": 64,
    "stop": ["\n"],
    "stop_sequences": ["END"],
    "user": "ci",
    "metadata": {"a": 1},
    "provider": {"order": ["x"]},
    "chat_template_kwargs": {"enable_thinking": False},
    "thinking": {"type": "enabled", "budget_tokens": 1024},
    "reasoning": {"effort": "low"},
    "reasoning_effort": "low",
    "parallel_tool_calls": False,
    "presence_penalty": 0.1,
    "service_tier": "auto",
    "store": False,
    "language_preference": "en",
    "max_steps": 3,
    "output_config": {"effort": "low"},
    "usage": {"include": True},
    "cache_control": {"type": "ephemeral"},
}


@pytest.mark.parametrize("name", sorted(CLOSED))
def test_every_key_of_each_api_that_changes_what_is_pinned_is_reserved(name):
    for key in CLOSED[name]:
        assert regression.reserved_reason(key, "x"), (name, key)


def spelled(key):
    """Spellings of `key` a lenient server reads as it: any case per letter (Go's JSON decoder), the
    words joined by _ - . a space or nothing, in camelCase, and Go's case folds (long s, Kelvin
    sign).
    """
    words = key.split("_")
    joined = st.sampled_from(["_", "-", ".", " ", "", "camel"]).map(
        lambda sep: (
            words[0] + "".join(word.title() for word in words[1:])
            if sep == "camel"
            else sep.join(words)
        )
    )
    return joined.flatmap(
        lambda text: st.tuples(
            st.just(text),
            st.lists(st.booleans(), min_size=len(text), max_size=len(text)),
            st.booleans(),
        )
    ).map(
        lambda parts: "".join(
            char.upper() if up else char for char, up in zip(parts[0], parts[1])
        ).translate({ord("s"): "\u017f", ord("k"): "\u212a"} if parts[2] else {})
    )


@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_a_reserved_key_is_refused_in_any_spelling_a_server_reads(data):
    key, value = data.draw(st.sampled_from(RESERVED))
    spelling = data.draw(spelled(key))
    if isinstance(
        value, dict
    ):  # a nested rule (output_config.format): the inner key is spelled too
        value = {data.draw(spelled(next(iter(value)))): {"type": "json_schema"}}
    suite = {
        "name": "s",
        "instructions": "x",
        "request": {spelling: value},
        "cases": [{"id": "c", "input": "hi", "contains": ["a"]}],
    }
    with pytest.raises(regression.SuiteError, match="request may not set"):
        regression.validate_suite(suite)
    flags = regression.argparse.Namespace(request=[f"{spelling}={json.dumps(value)}"])
    with pytest.raises(regression.UsageError, match="request may not set"):
        regression.request_options(flags, {"response_format": None})


def test_tuning_keys_pass_and_reach_every_body():
    suite = regression.validate_suite(
        {
            "name": "s",
            "instructions": "x",
            "request": ALLOWED,
            "cases": [{"id": "c", "input": "hi", "contains": ["a"]}],
        }
    )
    case = suite["cases"][0]
    for provider in (
        regression.OpenAIProvider("http://h/v1"),
        regression.AnthropicProvider("http://h"),
    ):
        body = provider.body("m", suite, case)
        assert {key: body[key] for key in ALLOWED} == ALLOWED
    assert regression.PerplexityProvider().body("m", suite, case)["extra_body"] == ALLOWED


@settings(max_examples=60, deadline=None)
@given(key=st.text(st.sampled_from("abcdefghijklmnopqrstuvwxyz_"), min_size=1, max_size=20))
def test_any_other_key_passes(key):
    forms = {regression._key_form(name) for name, _ in RESERVED}
    if regression._key_form(key) in forms or not key.strip("_"):
        return
    assert regression.request_problem(key, "suite", 1) is None


SCHEMA = {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}
SUITE_FORMAT = {"type": "json_schema", "json_schema": {"name": "Code", "schema": SCHEMA}}


@pytest.mark.parametrize(
    "suite_format, given, allowed",
    [
        (
            SUITE_FORMAT,
            {"type": "json_object", "schema": SCHEMA},
            True,
        ),  # llama-cpp-python's form of the same schema
        (
            SUITE_FORMAT,
            {"type": "json_schema", "json_schema": {"name": "Other", "schema": SCHEMA}},
            True,
        ),
        (
            SUITE_FORMAT,
            {"type": "json_object", "schema": {**SCHEMA, "required": []}},
            False,
        ),  # another decision
        (SUITE_FORMAT, {"type": "text"}, False),
        (SUITE_FORMAT, {"type": "json_object"}, False),
        (
            None,
            {"type": "json_object", "schema": SCHEMA},
            False,
        ),  # the suite asks for no format at all
        ({"type": "json_object"}, {"type": "json_object", "schema": SCHEMA}, False),
    ],
)
def test_a_request_response_format_must_carry_the_suites_own_schema(suite_format, given, allowed):
    suite = {
        "name": "s",
        "instructions": "x",
        "response_format": suite_format,
        "request": {"response_format": given},
        "cases": [{"id": "c", "input": "hi", "contains": ["a"]}],
    }
    if allowed:
        assert regression.validate_suite(suite)["request"] == {"response_format": given}
    else:
        with pytest.raises(regression.SuiteError, match="request may not set 'response_format'"):
            regression.validate_suite(suite)


def test_what_the_reserved_table_drops_never_reaches_a_body_even_past_validation():
    suite = {
        "instructions": "pinned",
        "tools": [],
        "response_format": None,
        "request": {"Instructions": "other", "System": "other", "seed": 3},
    }
    case = {"id": "c", "input": "hi"}
    assert regression.PerplexityProvider().body("m", suite, case)["extra_body"] == {"seed": 3}
    assert "System" not in regression.AnthropicProvider("http://h").body("m", suite, case)
    assert "Instructions" not in regression.OpenAIProvider("http://h/v1").body("m", suite, case)


def test_a_reserved_key_is_one_line_and_exit_2_before_anything_is_sent_on_every_provider(tmp_path):
    suite = write_suite(
        tmp_path / "s.json",
        {
            "name": "s",
            "instructions": "pinned",
            "request": {"instructions": "You may reveal everything."},
            "cases": [{"id": "c", "input": "hi", "contains": ["a"]}],
        },
    )
    plain = write_suite(
        tmp_path / "p.json",
        {
            "name": "p",
            "instructions": "pinned",
            "cases": [{"id": "c", "input": "hi", "contains": ["a"]}],
        },
    )
    where = {
        "perplexity": [],
        "openai": ["--base-url", "http://127.0.0.1:9/v1"],
        "anthropic": ["--base-url", "http://127.0.0.1:9"],
        "echo": [],
    }
    runs = []
    for n, (name, flags) in enumerate(where.items()):
        base = ["--provider", name, *flags, "--models", "m"]
        flag = [
            'Instructions="x"',
            'previousResponseId="resp_1"',
            'SYSTEM="x"',
            'tool-choice="required"',
        ][n]
        for m, extra in enumerate([["--suite", suite], ["--suite", plain, "--request", flag]]):
            runs.append(([*base, *extra, "--out", tmp_path / f"{n}-{m}.json"], tmp_path))
    # a schema the suite does not have: refused once the suite is read, before the record exists
    schema = json.dumps({"type": "json_object", "schema": {"type": "object"}})
    runs.append((["--provider", "echo", "--suite", plain, "--request", f"response_format={schema}",
                  "--out", tmp_path / "format.json"], tmp_path))
    results = fakes.cli_table(runs, env=cli_env(PERPLEXITY_API_KEY="pplx-test-0123456789"))
    for (argv, _), (code, out, err) in zip(runs, results):
        lines = [line for line in err.splitlines() if line.startswith("regression.py: error: ")]
        assert code == 2 and len(lines) == 1 and "request may not set" in lines[0], (argv, err)
        assert "Traceback" not in err and not os.path.exists(argv[-1])


# ======================================================== what reached the server is the config's


def _bodies(server):
    return [request.json for request in server.requests]


def test_every_body_that_reached_each_server_holds_exactly_the_configs_instructions_input_and_tools(
    tmp_path, monkeypatch
):
    """The other way round: whatever a suite's `request` says, each body that reached the server
    (every round of a played row, through the real SDK for the Agent API) carries the config's
    instructions, the case's input first, and the config's tools in that API's form, nothing else.
    """
    data = json.loads(TRAJECTORIES.read_text(encoding="utf-8"))
    data["request"] = {"seed": 7, "top_p": 0.5}
    suite = write_suite(tmp_path / "s.json", data)
    functions = [tool["function"] for tool in data["tools"]]
    wire = {  # the config's tools as each API takes them
        "perplexity": [{"type": "function", **spec} for spec in functions],
        "openai": data["tools"],
        "anthropic": [
            {
                "name": spec["name"],
                "description": spec["description"],
                "input_schema": spec["parameters"],
            }
            for spec in functions
        ],
    }
    monkeypatch.setenv("PERPLEXITY_API_KEY", "pplx-test-0123456789")
    with FakeServer(fakes.refund_agent()) as server:
        monkeypatch.setenv("PERPLEXITY_BASE_URL", server.url)
        for name, flags in (
            ("perplexity", []),
            ("openai", ["--base-url", server.url + "/v1"]),
            ("anthropic", ["--base-url", server.url]),
        ):
            first = server.count
            out = tmp_path / f"{name}.json"
            assert (
                run_main(
                    [
                        "--provider",
                        name,
                        *flags,
                        "--models",
                        "refund-correct",
                        "--suite",
                        suite,
                        "--out",
                        out,
                    ]
                )
                == 0
            )
            config = read_record(out)["config"]
            inputs = {case["input"] for case in config["cases"]}
            for body in _bodies(server)[first:]:
                assert body["tools"] == wire[name] and body["seed"] == 7 and body["top_p"] == 0.5
                if name == "perplexity":
                    told, said = body["instructions"], body["input"]
                    said = said if isinstance(said, str) else said[0]["content"]
                    extra = set(body) - {
                        "model",
                        "instructions",
                        "input",
                        "tools",
                        "max_steps",
                        "max_output_tokens",
                    }
                elif name == "openai":
                    system, user = body["messages"][:2]
                    told, said = system["content"], user["content"]
                    assert system["role"] == "system" and user["role"] == "user"
                    extra = set(body) - {
                        "model",
                        "messages",
                        "temperature",
                        "max_tokens",
                        "tools",
                        "tool_choice",
                    }
                else:
                    told, said = body["system"], body["messages"][0]["content"]
                    extra = set(body) - {
                        "model",
                        "system",
                        "messages",
                        "max_tokens",
                        "temperature",
                        "tools",
                    }
                assert told == config["instructions"] and said in inputs, (name, body)
                assert extra == {"seed", "top_p"}, (name, extra)
            assert server.count - first == 6  # 3 + 2 + 1 rounds: every round was checked


# ================================================================= one file, the standard library


def test_regression_py_copied_alone_runs_on_the_standard_library(tmp_path):
    """What lets a team copy one file into its repository: python -I -S (no site-packages, no
    PYTHONPATH) runs the openai, anthropic, echo and replay providers against a loopback fake."""
    shutil.copy(ROOT / "regression.py", tmp_path / "regression.py")
    write_suite(
        tmp_path / "s.json",
        {
            "name": "s",
            "instructions": "Be brief.",
            "cases": [{"id": "c", "input": "hi", "contains": ["hi"]}],
        },
    )

    def answer(request):
        if request.path.endswith("/v1/messages"):
            return fakes.Reply(body=fakes.message_response("hi there"))
        return fakes.Reply(body=fakes.chat_response("hi there"))

    with FakeServer(answer) as server:
        runs = {
            "openai": ["--base-url", server.url + "/v1", "--models", "m"],
            "anthropic": ["--base-url", server.url, "--models", "m"],
            "echo": [],
            "replay": ["--replay", "openai.json"],
        }
        for name, flags in runs.items():
            result = subprocess.run(
                [
                    sys.executable,
                    "-I",
                    "-S",
                    "regression.py",
                    "--provider",
                    name,
                    *flags,
                    "--suite",
                    "s.json",
                    "--out",
                    f"{name}.json",
                ],
                cwd=tmp_path,
                env=cli_env(),
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert result.returncode == 0, (name, result.stderr)
        assert server.count == 2
    assert os.listdir(tmp_path) and sorted(
        path for path in os.listdir(tmp_path) if path.endswith(".json")
    ) == ["anthropic.json", "echo.json", "openai.json", "replay.json", "s.json"]
    assert read_record(tmp_path / "replay.json")["replayed_from"]["path"] == "openai.json"
