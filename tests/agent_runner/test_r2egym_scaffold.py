"""DeepSWE's scaffold, exactly: R2E-Gym's own prompt YAML and texts, loaded at run time (AgentConfig.prompts).

The reference is the R2E-Gym snapshot under /work/shared/peers/r2egym (commit 69bc953, Apache-2.0), read at
test time only: its YAML gives the expected system and instance messages, and its ``Agent.run`` itself is
executed (with stubs for the LLM, the container and the trajectory classes) to build the conversation our agent
must reproduce. Texts R2E-Gym keeps in Python are also exercised through small R2E-shaped trees written here,
holding made-up wording of our own, so each test shows where a text came from.
"""

from __future__ import annotations

import ast
import dataclasses
import logging
import re
import runpy
import shutil
import sys
import textwrap
import types
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from pydantic import ValidationError

from agent_runner import prompts
from agent_runner import scaffold as scaffolds
from agent_runner.agent import Agent
from agent_runner.backends.scripted import ScriptedModel
from agent_runner.config import AgentConfig, SamplingConfig
from agent_runner.parsing import parse_response, render_call
from agent_runner.records import Completion
from env.sandbox.tools import NO_FUNCTION_CALL_REMINDER, ToolCall
from tests.conftest import r2egym_peer

from .conftest import RecordingEnvironment, TinyTask, run_loop

PEER = r2egym_peer() / "src/r2egym"
PEER_YAML = PEER / "agenthub" / "config" / "edit_non_fn_calling.yaml"
PEER_AGENT = PEER / "agenthub" / "agent" / "agent.py"
needs_peer = pytest.mark.skipif(not PEER_YAML.is_file(), reason=f"no R2E-Gym snapshot at {PEER}")

LS = "<think>look around</think>\n<function=execute_bash>\n<parameter=cmd>ls</parameter>\n</function>"
FINISH = "<think>done</think>\n<function=finish>\n<parameter=command>submit</parameter>\n</function>"
NO_CALL = "I will just think about it."
#: our own made-up no-call reply, written into the R2E-shaped test trees (not R2E-Gym's wording)
TEST_CONTINUE = "\n(test tree) Please answer with one function call.\n"
#: an issue that would break a second .format() pass or any stripping
ISSUE = "  The {config} dict loses keys when update() is called.\n\n"


def r2egym_fill(template: str, task) -> str:
    """R2E-Gym's filling rule, restated here for the expectation (agentica fork: also working_dir)."""
    return template.format(
        problem_statement=task.problem_statement,
        gt_patch=task.test_patch,
        working_dir="/testbed",
        test_patch_hint="",
        candidate_patch="",
        candidate_patch_correctness="incorrect",
    )


def make_tree(root: Path, *, agent_py: str | Path | None = PEER_AGENT, continue_msg: str | None = TEST_CONTINUE):
    """An R2E-shaped package at ``root/src/r2egym``: the peer YAML, an agent.py and an agenthub/__init__.py."""
    pkg = root / "src" / "r2egym"
    (pkg / "agenthub" / "config").mkdir(parents=True)
    (pkg / "agenthub" / "agent").mkdir()
    shutil.copy(PEER_YAML, pkg / "agenthub" / "config" / PEER_YAML.name)
    if isinstance(agent_py, Path):
        shutil.copy(agent_py, pkg / "agenthub" / "agent" / "agent.py")
    elif agent_py is not None:
        (pkg / "agenthub" / "agent" / "agent.py").write_text(textwrap.dedent(agent_py))
    if continue_msg is not None:
        (pkg / "agenthub" / "__init__.py").write_text(f"OTHER = 1\nCONTINUE_MSG = {continue_msg!r}\n")
    return pkg


# -- R2E-Gym's own Agent.run, executed with stubs --------------------------------------------------------------


class _Action:
    """Stands in for r2egym.agenthub.action.Action (parsing with our parser: the calls here are well formed)."""

    def __init__(self, function_name: str = "", parameters: dict | None = None):
        self.function_name, self.parameters = function_name, dict(parameters or {})

    @classmethod
    def from_string(cls, text: str) -> _Action:
        call = parse_response(text).call
        return cls(call.name, call.arguments) if call else cls()

    def to_xml_string(self) -> str:
        return render_call(ToolCall(name=self.function_name, arguments=self.parameters)) if self.function_name else ""

    def to_bashcmd(self) -> str:
        return ""


class _Record(dict):
    def __init__(self, **kwargs):
        super().__init__(kwargs)

    def model_dump(self) -> dict:
        return dict(self)


def _task_instruction_rule():
    """R2E-Gym's ``DockerRuntime.get_task_instruction``, taken from the snapshot's runtime/docker.py."""
    source = (PEER / "agenthub" / "runtime" / "docker.py").read_text()
    node = next(
        n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef) and n.name == "get_task_instruction"
    )
    namespace = {"re": re}
    exec(textwrap.dedent(ast.get_source_segment(source, node)), namespace)
    return namespace["get_task_instruction"]


def run_r2egym_agent(monkeypatch, yaml_path: Path, task, script: list[str], *, max_steps: int, continue_msg: str):
    """R2E-Gym's ``Agent.run`` on ``script`` against a RecordingEnvironment; returns its message history."""
    stubs = {
        "litellm": {},
        "openai": {"OpenAI": object},
        "r2egym": {},
        "r2egym.agenthub": {},
        "r2egym.agenthub.action": {"Action": _Action},
        "r2egym.agenthub.utils": {},
        "r2egym.agenthub.utils.log": {"get_logger": logging.getLogger},
        "r2egym.agenthub.environment": {},
        "r2egym.agenthub.environment.env": {"RepoEnv": object},
        "r2egym.agenthub.runtime": {},
        "r2egym.agenthub.runtime.docker": {"DockerRuntime": object},
        "r2egym.agenthub.trajectory": {"TrajectoryStep": _Record, "Trajectory": _Record},
        "r2egym.agenthub.tools": dict.fromkeys(("search_tool", "file_editor", "bash_execute_tool", "finish_tool")),
    }
    for name, attrs in stubs.items():
        module = types.ModuleType(name)
        module.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, module)
    r2e = types.ModuleType("r2egym_agent_under_test")
    monkeypatch.setitem(sys.modules, r2e.__name__, r2e)
    exec(compile(PEER_AGENT.read_text(), str(PEER_AGENT), "exec"), r2e.__dict__)

    tools = RecordingEnvironment()

    def step(action, timeout=None):
        if not action.function_name:
            return continue_msg, 0, False, {"total_time": 0.0}
        result = tools.step(ToolCall(name=action.function_name, arguments=action.parameters))
        return result.observation, 0, result.submitted, {"total_time": 0.0}

    @dataclasses.dataclass
    class EnvArgs:
        ds: dict

    runtime = SimpleNamespace(
        ds={"problem_statement": task.problem_statement},
        commit=SimpleNamespace(get_patch=lambda test_file, non_test_file: task.test_patch),
        get_patch=lambda: "",
        docker_image="stub",
    )
    runtime.get_task_instruction = lambda: _task_instruction_rule()(runtime)
    env = SimpleNamespace(
        reset=lambda: None, add_commands=lambda files: None, step=step, runtime=runtime, args=EnvArgs(ds={})
    )
    agent = r2e.Agent("under-test", r2e.AgentArgs.from_yaml(yaml_path))
    replies = iter(script)

    def model_query(messages, temperature=0):
        usage = SimpleNamespace(prompt_tokens=1, completion_tokens=1, total_tokens=2)
        message = SimpleNamespace(content=next(replies))
        return SimpleNamespace(usage=usage, choices=[SimpleNamespace(message=message)]), 0.0

    agent.model_query = model_query
    agent.run(env, use_fn_calling=False, max_steps=max_steps, max_steps_absolute=100, max_token_limit=10**9)
    return agent.history


# -- tests -----------------------------------------------------------------------------------------------------


@needs_peer
def test_peer_yaml_gives_r2egym_system_and_instance_messages_byte_for_byte():
    task = TinyTask(problem_statement=ISSUE, test_patch="diff --git a/t.py b/t.py\n")
    raw = yaml.safe_load(PEER_YAML.read_text())
    model = ScriptedModel([FINISH])
    result = run_loop(model, RecordingEnvironment(), task, AgentConfig(prompts=str(PEER_YAML)))
    system, user = model.calls[0]
    assert system.role == "system" and system.content == raw["system_prompt"]  # sent as is, never formatted
    assert user.role == "user" and user.content == r2egym_fill(raw["instance_prompt"], task) + "\nSteps Remaining: 40"
    assert ISSUE in user.content  # not stripped, its braces not formatted twice
    record = result.scaffold
    assert record.name == "r2egym" and record.label == f"r2egym (from {PEER_YAML})"
    assert record.sources["system_prompt"] == record.sources["instance_prompt"] == str(PEER_YAML)
    assert record.sources["steps_remaining"] == record.sources["past_step_limit"] == str(PEER_AGENT)
    # the snapshot has no agenthub/__init__.py: our own no-call reply stands in, and the record says so
    assert record.sources["no_call_reply"].startswith("nexus (no ")
    assert len(record.sent_sha256) == len(record.templates_sha256) == 64


@needs_peer
def test_r2egym_wrapped_issue_is_unwrapped_as_its_runtime_does():
    wrapped = "Title\n[ISSUE]\n  Inner {text}\n[/ISSUE]\ntrailer"
    task = TinyTask(problem_statement=wrapped)
    scaffold = scaffolds.load_scaffold(str(PEER_YAML))
    assert scaffolds.r2egym_task_instruction(wrapped) == _task_instruction_rule()(
        SimpleNamespace(ds={"problem_statement": wrapped})
    )
    assert "<github_issue>\n\n  Inner {text}\n\n</github_issue>" in scaffold.instance_prompt(task)


@needs_peer
def test_the_whole_conversation_matches_r2egym_s_own_agent_run(monkeypatch, tmp_path):
    """R2E-Gym's Agent.run and ours, same script: every system/user message equal, budget texts included."""
    pkg = make_tree(tmp_path)
    yaml_path = pkg / "agenthub" / "config" / PEER_YAML.name
    continue_msg = runpy.run_path(str(pkg / "agenthub" / "__init__.py"))["CONTINUE_MSG"]
    task = TinyTask(problem_statement=ISSUE + "[ISSUE]x[/ISSUE]", test_patch="diff\n")
    script = [LS, NO_CALL, LS, FINISH]  # soft limit 2: turns 3 and 4 see R2E's past-the-limit text
    theirs = run_r2egym_agent(monkeypatch, yaml_path, task, script, max_steps=2, continue_msg=continue_msg)
    model = ScriptedModel(script)
    result = run_loop(model, RecordingEnvironment(), task, AgentConfig(prompts=str(yaml_path), soft_step_limit=2))
    assert result.exit_status == "submitted"
    ours = [(m.role, m.content) for m in result.messages if m.role != "assistant"]
    # R2E-Gym also appends the final observation (after finish) to its history; nothing is sent after it
    expected = [(m["role"], m["content"]) for m in theirs if m["role"] != "assistant"][:-1]
    assert ours == expected
    past_limit = ours[-1][1]
    assert not past_limit.endswith("Steps Remaining: 0") and "Steps Remaining" not in past_limit.splitlines()[-1]
    assert result.turns[1].observation == continue_msg == TEST_CONTINUE
    assert result.scaffold.sources["no_call_reply"] == str(pkg / "agenthub" / "__init__.py")
    assert result.scaffold.sources["steps_remaining"] == str(pkg / "agenthub" / "agent" / "agent.py")


FAKE_AGENT = """
class Agent:
    def run(self, env, max_steps=10):
        history = [{"content": ""}]
        step_count = 0
        left = max_steps - step_count
        if left > 0:
            note = f"{{budget}} {left} turn(s) to go"
        else:
            note = "(test tree) Out of turns: finish now."
        history[-1]["content"] += f"\\n\\n{note}"
"""


@needs_peer
def test_step_texts_and_no_call_reply_come_from_the_loaded_r2egym_code(tmp_path):
    pkg = make_tree(tmp_path, agent_py=FAKE_AGENT)
    config = AgentConfig(prompts="r2egym:edit_non_fn_calling", r2egym_root=str(tmp_path), soft_step_limit=2)
    result = run_loop(ScriptedModel([NO_CALL, LS, FINISH]), RecordingEnvironment(), TinyTask(), config)
    first, second = result.turns[0], result.turns[1]
    assert result.messages[1].content.endswith("\n\n{budget} 2 turn(s) to go")
    assert first.observation == TEST_CONTINUE
    assert first.user_message == TEST_CONTINUE + "\n\n{budget} 1 turn(s) to go"
    assert second.user_message.endswith("\n\n(test tree) Out of turns: finish now.")
    assert result.scaffold.prompts == str(pkg / "agenthub" / "config" / PEER_YAML.name)
    assert result.scaffold.sources["past_step_limit"] == str(pkg / "agenthub" / "agent" / "agent.py")


@needs_peer
def test_unreadable_r2egym_code_falls_back_to_our_wording_and_says_so(tmp_path):
    make_tree(tmp_path, agent_py="class Agent:\n    def run(self):\n        pass\n", continue_msg=None)
    scaffold = scaffolds.load_scaffold("r2egym:edit_non_fn_calling", str(tmp_path / "src" / "r2egym"))
    assert scaffold.past_limit_text == prompts.steps_remaining_text(0)
    assert scaffold.no_call_reply == NO_FUNCTION_CALL_REMINDER
    assert "no step-budget message" in scaffold.sources["steps_remaining"]
    assert scaffold.sources["no_call_reply"].startswith("nexus (")
    assert scaffold.system == yaml.safe_load(PEER_YAML.read_text())["system_prompt"]


@needs_peer
def test_r2egym_name_resolves_in_the_installed_package(monkeypatch, tmp_path):
    site = tmp_path / "site"
    make_tree(tmp_path)
    shutil.copytree(tmp_path / "src" / "r2egym", site / "r2egym")
    (site / "r2egym" / "__init__.py").write_text("raise RuntimeError('find_spec must not import the package')\n")
    monkeypatch.syspath_prepend(str(site))
    scaffold = scaffolds.load_scaffold("r2egym:edit_non_fn_calling")
    assert scaffold.prompts_path == str(site / "r2egym" / "agenthub" / "config" / PEER_YAML.name)
    assert scaffold.no_call_reply == TEST_CONTINUE


def test_r2egym_name_without_a_package_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(scaffolds, "installed_r2egym_root", lambda: None)
    with pytest.raises(scaffolds.ScaffoldError, match="r2egym is not installed"):
        scaffolds.load_scaffold("r2egym:edit_non_fn_calling")
    with pytest.raises(scaffolds.ScaffoldError, match="not an R2E-Gym package"):
        scaffolds.load_scaffold("r2egym:edit_non_fn_calling", r2egym_root="/nonexistent/r2e")


@needs_peer
def test_unknown_r2egym_name_lists_the_configs_there():
    with pytest.raises(scaffolds.ScaffoldError, match=r"no .*nope\.yaml; configs there: \['edit_fn_calling'"):
        scaffolds.load_scaffold("r2egym:nope", r2egym_root=str(PEER.parent.parent))


def test_missing_file_is_a_clear_error_before_the_first_turn(tmp_path):
    missing = tmp_path / "nowhere.yaml"
    config = AgentConfig(prompts=str(missing))  # a stored config stays valid where the file is absent
    with pytest.raises(scaffolds.ScaffoldError, match=f"no R2E-Gym prompt file at {re.escape(str(missing))}"):
        Agent(ScriptedModel([FINISH]), config)
    with pytest.raises(ValueError, match="nowhere.yaml"):
        config.scaffold()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ({"system_prompt": "s", "command_files": [], "llm_name": "m"}, r"lacks the key\(s\) 'instance_prompt'"),
        ({"system_prompt": "s", "instance_prompt": "i"}, r"lacks the key\(s\) 'command_files', 'llm_name'"),
        (["not", "a", "mapping"], "not a mapping"),
        ({"system_prompt": 3, "instance_prompt": "i", "command_files": [], "llm_name": "m"}, "must be a string"),
        ({"system_prompt": "s", "instance_prompt": "{issue}", "command_files": [], "llm_name": "m"}, r"\{issue\}"),
        ({"system_prompt": "s", "instance_prompt": "{", "command_files": [], "llm_name": "m"}, "format string"),
        (
            {"system_prompt": "s", "instance_prompt": "i", "command_files": ["tools/submit_x.py"], "llm_name": "m"},
            "not tools this environment runs",
        ),
    ],
)
def test_malformed_yaml_is_a_clear_error_naming_the_file(tmp_path, content, message):
    path = tmp_path / "scaffolds.yaml"
    path.write_text(yaml.safe_dump(content))
    with pytest.raises(scaffolds.ScaffoldError, match=message) as caught:
        scaffolds.load_scaffold(str(path))
    assert str(path) in str(caught.value)


def test_blank_prompts_setting_is_refused():
    with pytest.raises(ValidationError, match="blank"):
        AgentConfig(prompts=" ")
    with pytest.raises(ValidationError, match="names no config"):
        AgentConfig(prompts="r2egym:")


def test_demo_file_is_prepended_when_use_demo_is_set(tmp_path):
    (tmp_path / "demo.txt").write_text("DEMO")
    data = {"system_prompt": "S", "instance_prompt": "I: {problem_statement}", "command_files": [], "llm_name": "m"}
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({**data, "use_demo": True, "demo_file": "demo.txt"}))
    assert scaffolds.load_scaffold(str(path)).instance_prompt(TinyTask(problem_statement="x"), 3) == (
        "DEMO\n\nI: x\nSteps Remaining: 3"
    )
    path.write_text(yaml.safe_dump({**data, "use_demo": True, "demo_file": "missing.txt"}))
    with pytest.raises(scaffolds.ScaffoldError, match="missing.txt"):
        scaffolds.load_scaffold(str(path))


def test_default_is_our_own_scaffold_and_recorded_as_nexus(task, environment):
    assert AgentConfig().prompts is None and AgentConfig().r2egym_root is None
    result = run_loop(ScriptedModel([FINISH]), environment, task)
    assert result.messages[0].content == prompts.system_prompt()
    assert result.messages[1].content == prompts.instance_prompt(task, 40)
    assert result.scaffold.name == "nexus" and result.scaffold.label == "nexus" and result.scaffold.prompts is None
    assert set(result.scaffold.sources.values()) == {"nexus"}


def test_no_per_turn_cap_by_default_and_a_long_completion_is_kept_whole(task, environment):
    assert "max_new_tokens" not in AgentConfig.model_fields and SamplingConfig().max_new_tokens is None
    thought = "step " * 30_000  # far beyond the old 4096-token per-turn cap
    long = f"<think>{thought}</think>\n<function=finish>\n<parameter=command>submit</parameter>\n</function>"
    model = ScriptedModel([Completion(text=long, tokens_generated=30_010, prompt_tokens=900, logical_length=30_910)])
    result = run_loop(model, environment, task)
    assert model.max_new_tokens_seen == [None]
    assert result.exit_status == "submitted" and result.turns[0].raw == long
    assert result.turns[0].thought == thought.strip()


@needs_peer
def test_qwen3_chat_template_renders_r2egym_s_messages_exactly():
    from agent_runner.model_host import load_tokenizer

    tokenizer = load_tokenizer("tiny")
    config = AgentConfig(prompts=str(PEER_YAML), soft_step_limit=1)
    result = run_loop(
        ScriptedModel([NO_CALL, FINISH]), RecordingEnvironment(), TinyTask(problem_statement=ISSUE), config
    )
    messages = [m.model_dump() for m in result.messages[:-1]]  # up to the last user message
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    for message in messages:
        if message["role"] != "assistant":
            assert f"<|im_start|>{message['role']}\n{message['content']}<|im_end|>\n" in rendered
    assert result.messages[-2].content.endswith("\n" + scaffolds.load_scaffold(str(PEER_YAML)).past_limit_text)
    ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    assert tokenizer.decode(ids, skip_special_tokens=False) == rendered  # every character survives tokenisation
