"""Local task folders (`task.json` + `repo/`), suites, and the errors a hand-written task can get."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from env.tasks.loading import TaskError, known_suites, load_local_task, load_suite, load_tasks

PATCH = "diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n@@ -1 +1 @@\n-X = 1\n+X = 2\n"
TEST_PATCH = (
    "diff --git a/tests/test_calc.py b/tests/test_calc.py\nnew file mode 100644\n--- /dev/null\n"
    "+++ b/tests/test_calc.py\n@@ -0,0 +1,2 @@\n+def test_x():\n+    import calc; assert calc.X == 2\n"
)


def write_task(root: Path, name: str = "calc__calc-1", *, with_repo: bool = True, **fields) -> Path:
    """Write a local task folder under `root`; `fields` override (or, set to ..., delete) task.json keys."""
    data = {
        "instance_id": name,
        "repo": "example/calc",
        "problem_statement": "X should be 2",
        "patch": PATCH,
        "test_patch": TEST_PATCH,
        "FAIL_TO_PASS": ["tests/test_calc.py::test_x"],
        "PASS_TO_PASS": [],
    }
    for key, value in fields.items():
        if value is ...:
            data.pop(key, None)
        else:
            data[key] = value
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "task.json").write_text(json.dumps(data))
    if with_repo:
        (folder / "repo").mkdir()
        (folder / "repo" / "calc.py").write_text("X = 1\n")
    return folder


def test_local_task_loads_with_defaults(tmp_path):
    folder = write_task(tmp_path)
    task = load_local_task(folder)
    assert task.kind == "local"
    assert task.local_dir == folder.resolve()
    assert task.repo_dir == folder.resolve() / "repo"
    assert task.base_commit is None and task.docker_image is None
    assert task.test_cmd == "python -m pytest -rA"
    assert task.setup == []


def test_local_task_optional_fields(tmp_path):
    folder = write_task(tmp_path, test_cmd="python -m pytest -rA tests", setup=["mkdir -p /data"], version="1.0")
    task = load_tasks(folder)[0]
    assert (task.test_cmd, task.setup, task.version) == (
        "python -m pytest -rA tests",
        ["mkdir -p /data"],
        "1.0",
    )


def test_suite_folder_loads_every_task_sorted(tmp_path):
    write_task(tmp_path, "calc__calc-2")
    write_task(tmp_path, "calc__calc-1")
    (tmp_path / "README.md").write_text("not a task")
    (tmp_path / ".cache").mkdir()
    assert [t.instance_id for t in load_tasks(tmp_path)] == ["calc__calc-1", "calc__calc-2"]
    assert [t.instance_id for t in load_suite(tmp_path)] == ["calc__calc-1", "calc__calc-2"]
    assert [t.instance_id for t in load_suite(str(tmp_path))] == ["calc__calc-1", "calc__calc-2"]


def test_bundled_suite_by_name():
    assert "mini" in known_suites()
    tasks = load_suite("mini")
    assert len(tasks) >= 12
    assert {t.kind for t in tasks} == {"local"}
    assert len({t.repo for t in tasks}) >= 4
    assert all(t.repo_dir.is_dir() for t in tasks)
    assert [t.instance_id for t in load_tasks("mini")] == [t.instance_id for t in tasks]


def test_unknown_suite_lists_the_known_ones():
    with pytest.raises(TaskError) as info:
        load_suite("maxi")
    assert "unknown suite" in str(info.value)
    assert "mini" in str(info.value)
    assert info.value.source == "maxi"


def test_malformed_task_json(tmp_path):
    folder = write_task(tmp_path)
    (folder / "task.json").write_text('{"instance_id": "calc__calc-1",')
    with pytest.raises(TaskError, match=r"task\.json: malformed JSON") as info:
        load_local_task(folder)
    assert str(folder / "task.json") in str(info.value)


def test_task_json_not_an_object(tmp_path):
    folder = write_task(tmp_path)
    (folder / "task.json").write_text("[]")
    with pytest.raises(TaskError, match="must hold a JSON object"):
        load_local_task(folder)


@pytest.mark.parametrize(
    "field",
    ["instance_id", "problem_statement", "patch", "test_patch", "FAIL_TO_PASS", "PASS_TO_PASS", "repo"],
)
def test_missing_field(tmp_path, field):
    folder = write_task(tmp_path, **{field: ...})
    with pytest.raises(TaskError, match="missing required field") as info:
        load_local_task(folder)
    assert info.value.field == field
    assert info.value.source == str(folder / "task.json")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("FAIL_TO_PASS", "tests/test_calc.py::test_x"),
        ("FAIL_TO_PASS", '["tests/test_calc.py::test_x"]'),
        ("PASS_TO_PASS", [1, 2]),
        ("setup", "pip install x"),
        ("problem_statement", 42),
        ("test_cmd", ["python", "-m", "pytest"]),
        ("patch", ""),
    ],
)
def test_wrong_type(tmp_path, field, value):
    folder = write_task(tmp_path, **{field: value})
    with pytest.raises(TaskError) as info:
        load_local_task(folder)
    assert info.value.field == field
    assert "task.json" in str(info.value)


def test_empty_fail_to_pass_is_rejected(tmp_path):
    folder = write_task(tmp_path, FAIL_TO_PASS=[])
    with pytest.raises(TaskError, match="at least one test") as info:
        load_local_task(folder)
    assert info.value.field == "FAIL_TO_PASS"


@pytest.mark.parametrize("bad_id", ["calc-1", "../etc__x-1", "calc__calc", "calc__calc-1; rm -rf /", "Calc__a b-1"])
def test_unsafe_instance_id(tmp_path, bad_id):
    folder = write_task(tmp_path, instance_id=bad_id)
    with pytest.raises(TaskError, match="project__name-N") as info:
        load_local_task(folder)
    assert info.value.field == "instance_id"


@pytest.mark.parametrize("field", ["base_commit", "docker_image"])
def test_image_fields_are_not_allowed(tmp_path, field):
    folder = write_task(tmp_path, **{field: "abc"})
    with pytest.raises(TaskError, match="built from repo/") as info:
        load_local_task(folder)
    assert info.value.field == field


def test_unknown_field_is_named(tmp_path):
    folder = write_task(tmp_path, FAIL_TO_PAS=["typo"])
    with pytest.raises(TaskError, match="unknown field") as info:
        load_local_task(folder)
    assert info.value.field == "FAIL_TO_PAS"


def test_missing_repo_folder(tmp_path):
    folder = write_task(tmp_path, with_repo=False)
    with pytest.raises(TaskError, match=r"missing or empty repo/") as info:
        load_local_task(folder)
    assert info.value.field == "repo/"
    (folder / "repo").mkdir()
    with pytest.raises(TaskError, match=r"missing or empty repo/"):
        load_local_task(folder)


def test_folder_without_task_json(tmp_path):
    with pytest.raises(TaskError, match="no task.json"):
        load_local_task(tmp_path)
    (tmp_path / "stray").mkdir()
    with pytest.raises(TaskError, match="no task.json"):
        load_tasks(tmp_path)


def test_empty_suite_folder(tmp_path):
    with pytest.raises(TaskError, match="no task folders"):
        load_suite(tmp_path)


def test_duplicate_ids_in_a_suite(tmp_path):
    write_task(tmp_path, "calc__calc-1")
    write_task(tmp_path, "calc__calc-2", instance_id="calc__calc-1")
    with pytest.raises(TaskError, match="duplicate instance_id"):
        load_suite(tmp_path)
