"""`nexus-eval tasks validate`: gold resolves, base state fails F2P / passes P2P; exit code and --json."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from nexus_eval.cli import app
from tests.conftest import write_local_task

runner = CliRunner()


def test_unknown_suite_is_a_clear_error():
    result = runner.invoke(app, ["tasks", "validate", "--suite", "no-such-suite"])
    assert result.exit_code == 2
    assert "unknown suite" in result.output


def test_exactly_one_source_required(tmp_path):
    result = runner.invoke(app, ["tasks", "validate", "--suite", "mini", "--path", str(tmp_path)])
    assert result.exit_code == 2
    assert "exactly one of --suite" in result.output


@pytest.mark.docker
def test_validate_path_reports_valid_and_invalid_tasks(tmp_path, docker_client, base_image):
    write_local_task(tmp_path, instance_id="calc__good-1")
    bad_dir = write_local_task(tmp_path, instance_id="calc__wrong-lists-2")
    spec = json.loads((bad_dir / "task.json").read_text())
    spec["FAIL_TO_PASS"].append("tests/test_mul.py::test_mul")  # already passes on the base state
    (bad_dir / "task.json").write_text(json.dumps(spec))

    result = runner.invoke(app, ["tasks", "validate", "--path", str(tmp_path), "--json"])
    assert result.exit_code == 1, result.output
    verdicts = {v["instance_id"]: v for v in json.loads(result.stdout[result.stdout.index("[") :])}
    assert verdicts["calc__good-1"]["valid"] is True
    assert verdicts["calc__good-1"]["gold_status"] == "resolved"
    bad = verdicts["calc__wrong-lists-2"]
    assert bad["valid"] is False
    assert any("already pass on the base state" in p and "test_mul" in p for p in bad["problems"])

    only_good = runner.invoke(app, ["tasks", "validate", "--path", str(tmp_path), "--task", "calc__good-1"])
    assert only_good.exit_code == 0, only_good.output
    assert "1/1 valid" in only_good.output


@pytest.mark.docker
@pytest.mark.slow
def test_bundled_mini_suite_is_valid(docker_client, base_image):
    from env.tasks.loading import known_suites

    assert "mini" in known_suites(), "the bundled mini suite is missing from env/tasks/suites/"
    result = runner.invoke(app, ["tasks", "validate", "--suite", "mini", "--json"])
    verdicts = json.loads(result.stdout[result.stdout.index("[") :])
    invalid = {v["instance_id"]: v["problems"] for v in verdicts if not v["valid"]}
    assert not invalid
    assert len(verdicts) >= 12
    assert result.exit_code == 0
