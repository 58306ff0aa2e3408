"""Issue 33 items 2, 3 and 6: a task row cannot loosen its grading container past the operator's ceilings, a
setup line cannot add Dockerfile instructions, and grading logs and files are bounded."""

from __future__ import annotations

import base64
import json
import zlib

import pytest
from typer.testing import CliRunner

from env.grading import DEFAULT_TIMEOUT_S, GradeConfig, grade, regrade
from env.grading.hostlog import LOG_HEADER, PACKED_PREFIX, UNPACK_MAX_BYTES, unpack, unpack_bounded
from env.sandbox.config import SandboxConfig, SandboxError
from env.sandbox.container import Sandbox
from env.sandbox.output import FILE_OUTPUT_HEAD_BYTES, FILE_OUTPUT_TAIL_BYTES, TRUNCATION_MARK, CappedBuffer
from env.tasks.ceilings import DEFAULT_CEILINGS, GradingCeilings, GradingLimitError, check_limits, parse_memory
from env.tasks.dataset_rows import task_from_row
from env.tasks.loading import load_local_task, load_tasks
from env.tasks.task_model import GradingLimits, TaskError
from tests.conftest import GOLD_PATCH, TEST_JOB, write_local_task
from tests.env.tasks.test_tasks import swebench_row

ROW_ID = "astropy__astropy-12907"
INJECTED = "true\nADD http://127.0.0.1:9/x /x"


# ------------------------------------------------------------------ item 2: the operator's grading ceilings


@pytest.mark.parametrize(
    ("grading", "field", "shown", "ceiling"),
    [
        ({"network": True}, "network", "True", "allow_network=False"),
        ({"memory": "0"}, "memory", "'0'", "memory=16g"),
        ({"memory": "lots"}, "memory", "'lots'", "memory=16g"),
        ({"memory": "64g"}, "memory", "'64g'", "memory=16g"),
        ({"pids": 10**9}, "pids", "1000000000", "pids=4096"),
        ({"timeout_s": 1e9}, "timeout_s", "1000000000.0", "timeout_s=10800"),
        ({"cpus": 512}, "cpus", "512", "cpus=16"),
    ],
)
def test_a_row_over_the_ceilings_is_refused_at_load(tmp_path, grading, field, shown, ceiling):
    with pytest.raises(TaskError) as raised:
        task_from_row(swebench_row(grading=grading))
    message = str(raised.value)
    assert raised.value.field == f"grading.{field}"
    assert f"task {ROW_ID}" in message and f"grading.{field} = {shown}" in message and ceiling in message

    # a file holding only that row loads nothing: the error names the row, the task and the field
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps(swebench_row(grading=grading)) + "\n")
    with pytest.raises(TaskError, match=rf"task {ROW_ID}: grading\.{field}"):
        load_tasks(rows)

    # a local task.json too
    folder = write_local_task(tmp_path)
    spec = json.loads((folder / "task.json").read_text())
    (folder / "task.json").write_text(json.dumps({**spec, "grading": grading}))
    with pytest.raises(TaskError, match=rf"task calc__calc-1: grading\.{field}") as local:
        load_local_task(folder)
    assert local.value.field == f"grading.{field}"


def test_a_row_within_the_ceilings_loads_and_the_operator_can_allow_more():
    within = {"timeout_s": 3 * 3600, "memory": "16g", "cpus": 4, "pids": 4096}
    assert task_from_row(swebench_row(grading=within)).grading.memory == "16g"
    networked = task_from_row(swebench_row(grading={"network": True}), ceilings=GradingCeilings(allow_network=True))
    assert networked.grading.network is True
    tight = GradingCeilings(memory="4g", pids=512, timeout_s=600)
    with pytest.raises(TaskError, match=r"grading\.memory = '8g' is refused: above .* \(ceiling: memory=4g\)"):
        task_from_row(swebench_row(grading={"memory": "8g"}), ceilings=tight)


def test_the_default_ceilings_cover_the_graders_own_defaults():
    sandbox = GradeConfig().sandbox
    assert parse_memory(sandbox.memory) <= DEFAULT_CEILINGS.memory_bytes
    assert sandbox.pids <= DEFAULT_CEILINGS.pids and sandbox.cpus <= DEFAULT_CEILINGS.cpus
    assert max(DEFAULT_TIMEOUT_S.values()) <= DEFAULT_CEILINGS.timeout_s
    assert not DEFAULT_CEILINGS.allow_network and not sandbox.network
    assert (parse_memory("8g"), parse_memory("512m"), parse_memory("1.5gb")) == (8 << 30, 512 << 20, 3 << 29)
    for bad in ("0", "-1", "", "1k", "8 parsecs"):
        with pytest.raises(ValueError):
            parse_memory(bad)
    with pytest.raises(ValueError):
        GradingCeilings(memory="0")


def _stored(task, **grading):
    """The task as a row stored before the ceilings existed would come back: its limits never checked."""
    limits = GradingLimits.model_construct(**{**dict.fromkeys(GradingLimits.model_fields), **grading})
    return task.model_copy(update={"grading": limits})


@pytest.fixture(scope="module")
def calc_task(tmp_path_factory):
    return load_local_task(write_local_task(tmp_path_factory.mktemp("hardening")))


@pytest.mark.parametrize(
    ("grading", "field"), [({"memory": "0"}, "memory"), ({"pids": 10**9}, "pids"), ({"network": True}, "network")]
)
def test_grading_refuses_an_over_ceiling_task_before_any_container(calc_task, grading, field):
    result = grade(_stored(calc_task, **grading), GOLD_PATCH, config=GradeConfig(job=TEST_JOB))
    assert result.status == "infra_failure"
    assert f"task calc__calc-1: grading.{field}" in result.error and "ceiling" in result.error
    # the refusal is in the log, which regrades to the same status
    assert regrade(calc_task, result.log, GOLD_PATCH).status == "infra_failure"


def test_grade_time_limits_are_validated_not_copied(calc_task):
    from env.grading import _limits

    with pytest.raises(ValueError, match="pids"):  # below SandboxConfig's floor: model_copy let it through
        _limits(_stored(calc_task, pids=4), GradeConfig(), "swebench")
    with pytest.raises(GradingLimitError, match=r"grading\.timeout_s"):
        check_limits("x", GradingLimits(timeout_s=4 * 3600))
    sandbox, timeout = _limits(
        _stored(calc_task, network=True, timeout_s=60.0),
        GradeConfig(ceilings=GradingCeilings(allow_network=True)),
        "swebench",
    )
    assert (sandbox.network, timeout, sandbox.max_file_bytes) == (True, 60.0, GradeConfig().sandbox.max_file_bytes)


# ------------------------------------------------------------------ item 3: setup lines stay single lines


@pytest.mark.parametrize("line", [INJECTED, "true\rFROM scratch", "echo \x1b[31m", "true \\", "true\\\t"], ids=repr)
def test_a_setup_line_that_could_add_dockerfile_instructions_is_refused_at_load(tmp_path, line):
    with pytest.raises(TaskError) as raised:
        load_local_task(write_local_task(tmp_path, setup=["mkdir -p /data", line]))
    assert raised.value.field == "setup"
    assert "task calc__calc-1: setup line 2" in str(raised.value)
    with pytest.raises(TaskError, match=f"task {ROW_ID}: setup line 1") as from_row:
        task_from_row(swebench_row(setup=[line]))
    assert from_row.value.field == "setup"


def test_tabs_and_ordinary_setup_lines_load(tmp_path):
    task = load_local_task(write_local_task(tmp_path, setup=["printf 'a\\tb\\n' > /opt/x", "echo\tdone"]))
    assert task.setup == ["printf 'a\\tb\\n' > /opt/x", "echo\tdone"]


def test_the_dockerfile_refuses_such_a_line_too():
    from env.tasks.images import ImageBuildFailed, _task_dockerfile

    with pytest.raises(ImageBuildFailed, match=r"task calc__calc-1: setup line 1 .*'\\n'"):
        _task_dockerfile("nexus-eval/base:bookworm-1", [INJECTED], task_id="calc__calc-1")
    assert "RUN echo ok\n" in _task_dockerfile("nexus-eval/base:bookworm-1", ["echo ok"], task_id="t")


def test_tasks_validate_exits_2_and_builds_nothing(tmp_path, monkeypatch):
    from env.tasks import images as task_images
    from nexus_eval.cli import app

    built = []

    def no_build(task, *args, **kwargs):
        built.append(task.instance_id)
        raise task_images.ImageBuildFailed("the test forbids building")

    monkeypatch.setattr(task_images, "ensure_task_image", no_build)
    folder = write_local_task(tmp_path, setup=[INJECTED])
    result = CliRunner().invoke(app, ["tasks", "validate", "--path", str(folder)])
    assert result.exit_code == 2, result.output
    assert "setup" in result.output and "calc__calc-1" in result.output
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps(swebench_row(setup=[INJECTED])) + "\n")
    from_file = CliRunner().invoke(app, ["tasks", "validate", "--file", str(rows)])
    assert from_file.exit_code == 2, from_file.output
    assert built == []


# ------------------------------------------------------------------ item 6: bounded logs and files


def test_capped_buffer_keeps_a_small_head_and_a_large_tail():
    buffer = CappedBuffer(12, head=2)
    for chunk in (b"ab", b"0123456789", b"XYZ", b"0123456789"):
        buffer.add(chunk)
    text, cut = buffer.text()
    assert cut and text == "ab" + TRUNCATION_MARK.format(dropped=13) + "0123456789"
    whole = CappedBuffer(100, head=10)
    whole.add(b"x" * 60)
    assert whole.text() == ("x" * 60, False)


def _gzip_bomb(total: int) -> str:
    deflate = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    header = f"{LOG_HEADER} token={'0' * 32} task=calc__calc-1 route=swebench\n".encode()
    parts = [deflate.compress(header)]
    block = b"\0" * (1 << 20)
    parts += [deflate.compress(block) for _ in range(total >> 20)]
    parts.append(deflate.flush())
    return PACKED_PREFIX + base64.b64encode(b"".join(parts)).decode("ascii")


def test_unpacking_a_gzip_bomb_is_bounded(calc_task):
    stored = _gzip_bomb(200 * 1024**2)  # 200 MB of zeros, about 200 KB stored
    assert len(stored) < 1024**2
    text = unpack(stored)
    assert len(text) <= UNPACK_MAX_BYTES + 200
    assert text.startswith(LOG_HEADER) and text.endswith("the rest is not read ...]\n")
    assert unpack_bounded(stored)[1] is True
    # a log cut there cannot be regraded: its END frames may be in the part not read
    regraded = regrade(calc_task, stored, GOLD_PATCH)
    assert regraded.status == "infra_failure" and "unpacks to more than" in regraded.error


def _eval_body(result) -> str:
    from env.grading import hostlog

    return hostlog.parse(hostlog.unpack(result.log)).sections["eval"].body


@pytest.mark.docker
def test_a_50_mb_test_log_comes_back_capped_with_its_tail(tmp_path, docker_client, base_image):
    spam = "head -c 50000000 /dev/zero | tr '\\0' x; echo; python -m pytest -rA"
    task = load_local_task(write_local_task(tmp_path, test_cmd=spam))
    result = grade(task, GOLD_PATCH, config=GradeConfig(job=TEST_JOB, test_timeout_s=300))
    body = _eval_body(result)
    assert len(body.encode()) <= FILE_OUTPUT_HEAD_BYTES + FILE_OUTPUT_TAIL_BYTES + 4096
    assert "bytes omitted from the middle" in body
    assert result.status == "resolved", result.error  # the pytest summary at the end survived the cut
    assert "PASSED tests/test_add.py::test_total_hidden_marker" in body[-4096:]
    assert body.startswith("+ cd /testbed") and ">>>>> Start Test Output" in body[:4096]


@pytest.mark.docker
def test_no_file_in_a_grading_container_grows_past_the_file_size_bound(tmp_path, docker_client, base_image):
    # one bound for every container, the agent's and the grader's (env.sandbox.config.MAX_FILE_BYTES)
    assert GradeConfig().sandbox.max_file_bytes == SandboxConfig().max_file_bytes == 1024**3
    fill = "head -c 20000000 /dev/zero > /tmp/big; echo big-rc=$?; wc -c < /tmp/big; python -m pytest -rA"
    task = load_local_task(write_local_task(tmp_path, test_cmd=fill))
    small = SandboxConfig(memory="4g", pids=1024, cpus=2.0, max_file_bytes=8 * 1024**2)
    result = grade(task, GOLD_PATCH, config=GradeConfig(job=TEST_JOB, test_timeout_s=120, sandbox=small))
    body = _eval_body(result)
    assert "big-rc=153" in body  # 128 + SIGXFSZ: the writer was stopped at the bound
    assert f"\n{8 * 1024**2}\n" in body


@pytest.mark.docker
def test_a_disk_quota_the_driver_cannot_give_is_a_clear_error(docker_client, base_image):
    info = docker_client.info()
    backing = dict(info.get("DriverStatus") or []).get("Backing Filesystem", "")
    if info.get("Driver") != "overlay2" or backing == "xfs":
        pytest.skip(f"storage driver {info.get('Driver')} on {backing or '?'} may support per-container quotas")
    with pytest.raises(SandboxError, match=r"SandboxConfig\.disk_size='1g' .* pquota"):
        Sandbox.start(base_image, config=SandboxConfig(disk_size="1g"), job=TEST_JOB, client=docker_client)


def test_the_workers_settings_set_the_ceilings_it_loads_and_grades_under(tmp_path):
    """``NEXUS_EVAL_GRADING_*`` -> ``ServiceSettings.grading_ceilings`` -> the worker's ``TaskCache`` (loads) and
    ``grade_config`` (grades): a row asking for a network is refused by default and served where allowed."""
    from agent_runner.config import EpisodeSpec
    from env.tasks.task_cache import TaskCache
    from jobs.settings import ServiceSettings
    from tests.env.tasks.test_tasks import swebench_row

    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps(swebench_row(grading={"network": True})) + "\n")
    task_id = swebench_row()["instance_id"]
    where = {"suite": None, "tasks_file": str(rows), "protocol": "true_eviction", "seed": 0, "grade": True}
    spec = EpisodeSpec(task_id=task_id, backend="oracle", **where)
    default = ServiceSettings.from_env({})
    with pytest.raises(ValueError, match="grading.network"):
        TaskCache(default.grading_ceilings).task(spec)
    opened = ServiceSettings.from_env({"NEXUS_EVAL_GRADING_NETWORK": "1", "NEXUS_EVAL_GRADING_MAX_MEMORY": "32g"})
    cache = TaskCache(opened.grading_ceilings)
    assert cache.task(spec).grading.network is True
    assert spec.grade_config(ceilings=cache.ceilings).ceilings.allow_network is True
    assert default.grading_ceilings.timeout_s < default.soft_time_limit_s
    with pytest.raises(ValueError, match="NEXUS_EVAL_GRADING_MAX_TIMEOUT"):
        ServiceSettings.from_env({"NEXUS_EVAL_GRADING_MAX_TIMEOUT": "999999"})
    with pytest.raises(ValueError, match=r"\$NEXUS_EVAL_GRADING_MAX_MEMORY='0'"):
        ServiceSettings.from_env({"NEXUS_EVAL_GRADING_MAX_MEMORY": "0"})
