"""Task loaders: every row kind, every file format, and the errors bad input gets (env.tasks.loading)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from env.tasks.loading import Task, TaskError, load_tasks, r2e_instance_id, task_from_row

PATCH = "diff --git a/m.py b/m.py\n--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-x = 1\n+x = 2\n"
TEST_PATCH = "diff --git a/tests/test_m.py b/tests/test_m.py\n--- /dev/null\n+++ b/tests/test_m.py\n"


def swebench_row(**overrides) -> dict:
    """A SWE-bench classic row as the Hub stores it: the test lists are JSON-encoded strings."""
    row = {
        "instance_id": "astropy__astropy-12907",
        "repo": "astropy/astropy",
        "base_commit": "d16bfe05a744909de4b27f5875fe0d4ed41ce607",
        "problem_statement": "separability_matrix is wrong for nested CompoundModels",
        "hints_text": "",
        "created_at": "2022-03-03T15:14:54Z",
        "patch": PATCH,
        "test_patch": TEST_PATCH,
        "FAIL_TO_PASS": json.dumps(["astropy/modeling/tests/test_separable.py::test_separable[compound_model6]"]),
        "PASS_TO_PASS": json.dumps(["astropy/modeling/tests/test_separable.py::test_coord_matrix"]),
        "version": "4.3",
        "environment_setup_commit": "298ccb478e6bf092953bca67a3d29dc6c35f6752",
    }
    row.update(overrides)
    return row


def r2e_row(**overrides) -> dict:
    """An R2E-native row: no instance_id, `repo_name`, `docker_image`, `expected_output_json`."""
    row = {
        "repo_name": "pandas",
        "docker_image": "namanjain12/pandas_final:0a1b2c3d4e5f60718293a4b5c6d7e8f901234567",
        "commit_hash": "0a1b2c3d4e5f60718293a4b5c6d7e8f901234567",
        "parsed_commit_content": json.dumps({"old_commit_hash": "ffeeddccbbaa", "file_diffs": []}),
        "execution_result_content": "{}",
        "expected_output_json": json.dumps({"test_groupby.py::test_sum": "PASSED"}),
        "problem_statement": "[ISSUE]groupby().sum() drops the index name[/ISSUE]",
        "prompt": "...",
        "modified_files": ["pandas/core/groupby.py"],
    }
    row.update(overrides)
    return row


# ---------------------------------------------------------------- row kinds


def test_swebench_classic_row_decodes_json_lists():
    task = task_from_row(swebench_row())
    assert task.kind == "swebench"
    assert task.FAIL_TO_PASS == ["astropy/modeling/tests/test_separable.py::test_separable[compound_model6]"]
    assert task.PASS_TO_PASS == ["astropy/modeling/tests/test_separable.py::test_coord_matrix"]
    assert task.base_commit.startswith("d16bfe05")
    assert task.version == "4.3"
    assert task.docker_image is None
    assert task.test_cmd == "python -m pytest -rA"
    assert task.local_dir is None and task.repo_dir is None


def test_swebench_row_with_plain_lists_and_numeric_version():
    task = task_from_row(swebench_row(FAIL_TO_PASS=["a::b"], PASS_TO_PASS=[], version=3.0))
    assert task.FAIL_TO_PASS == ["a::b"]
    assert task.PASS_TO_PASS == []
    assert task.version == "3.0"


def test_swebench_5x_row_image_becomes_docker_image():
    task = task_from_row(swebench_row(image="swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest"))
    assert task.kind == "swebench"
    assert task.docker_image == "swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest"


def test_r2e_swebench_row():
    image = "slimshetty/swebench-verified:sweb.eval.x86_64.astropy__astropy-12907"
    task = task_from_row(swebench_row(docker_image=image, parsed_commit="{}"))
    assert task.kind == "r2e_swebench"
    assert task.docker_image == image
    assert task.instance_id == "astropy__astropy-12907"


def test_r2e_swebench_row_recognised_by_image_alone():
    image = "slimshetty/swebench-lite:sweb.eval.x86_64.astropy__astropy-12907"
    assert task_from_row(swebench_row(docker_image=image)).kind == "r2e_swebench"


def test_r2e_native_row():
    task = task_from_row(r2e_row())
    assert task.kind == "r2e"
    assert task.instance_id == "pandas__0a1b2c3d4e5f"
    assert task.repo == "pandas"
    assert task.base_commit == "ffeeddccbbaa"
    assert json.loads(task.expected_output_json) == {"test_groupby.py::test_sum": "PASSED"}
    assert task.FAIL_TO_PASS == [] and task.PASS_TO_PASS == []
    assert task.docker_image.startswith("namanjain12/pandas_final:")


def test_r2e_row_with_its_own_id_keeps_it():
    task = task_from_row(r2e_row(instance_id="pandas__custom-7"))
    assert (task.kind, task.instance_id) == ("r2e", "pandas__custom-7")


def test_r2e_expected_output_as_dict_is_stored_as_json_text():
    task = task_from_row(r2e_row(expected_output_json={"t::a": "FAILED"}))
    assert json.loads(task.expected_output_json) == {"t::a": "FAILED"}


def test_r2e_id_falls_back_to_image_tag_then_to_a_content_hash():
    no_commit = r2e_row(commit_hash=None)
    assert r2e_instance_id(no_commit) == "pandas__0a1b2c3d4e5f"
    untagged = r2e_row(commit_hash=None, docker_image="namanjain12/pandasnew")
    first = r2e_instance_id(untagged)
    assert first.startswith("pandas__") and len(first) == len("pandas__") + 12
    assert r2e_instance_id(dict(untagged)) == first
    assert r2e_instance_id({**untagged, "problem_statement": "another issue"}) != first


def test_r2e_id_is_stable_between_loads(tmp_path):
    path = tmp_path / "r2e.jsonl"
    rows = [
        r2e_row(),
        r2e_row(
            commit_hash="1234567890abcdef",
            docker_image="namanjain12/numpy_final:1234567890ab",
            repo_name="numpy",
        ),
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    first = [t.instance_id for t in load_tasks(path)]
    second = [t.instance_id for t in load_tasks(path)]
    assert first == second == ["pandas__0a1b2c3d4e5f", "numpy__1234567890ab"]


# ---------------------------------------------------------------- file formats


def test_jsonl_file(tmp_path):
    path = tmp_path / "tasks.jsonl"
    rows = [swebench_row(), swebench_row(instance_id="astropy__astropy-13033")]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    tasks = load_tasks(path)
    assert [t.instance_id for t in tasks] == ["astropy__astropy-12907", "astropy__astropy-13033"]
    assert all(isinstance(t, Task) for t in tasks)


def test_json_list_and_single_object(tmp_path):
    many = tmp_path / "many.json"
    many.write_text(json.dumps([swebench_row(), r2e_row()]))
    assert [t.kind for t in load_tasks(many)] == ["swebench", "r2e"]
    one = tmp_path / "one.json"
    one.write_text(json.dumps(swebench_row()))
    assert load_tasks(str(one))[0].instance_id == "astropy__astropy-12907"


def test_parquet_file(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [swebench_row(), swebench_row(instance_id="astropy__astropy-13033", FAIL_TO_PASS='["x::y"]')]
    path = tmp_path / "tasks.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    tasks = load_tasks(path)
    assert [t.FAIL_TO_PASS for t in tasks] == [
        ["astropy/modeling/tests/test_separable.py::test_separable[compound_model6]"],
        ["x::y"],
    ]


def test_parquet_with_list_columns(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "lists.parquet"
    pq.write_table(pa.Table.from_pylist([swebench_row(FAIL_TO_PASS=["a::b"], PASS_TO_PASS=["c::d"])]), path)
    task = load_tasks(path)[0]
    assert (task.FAIL_TO_PASS, task.PASS_TO_PASS) == (["a::b"], ["c::d"])


def test_hugging_face_name_goes_through_datasets(monkeypatch):
    """`datasets.load_dataset` is replaced by a test double (the Hub cannot be reached from tests); it returns a
    real `datasets.Dataset`, so the row mapping and the split argument are what is exercised."""
    import datasets

    calls = []

    def hub_test_double(name, split):
        calls.append((name, split))
        return datasets.Dataset.from_list([swebench_row(docker_image="slimshetty/swebench-verified:sweb.eval.x")])

    monkeypatch.setattr(datasets, "load_dataset", hub_test_double)
    tasks = load_tasks("R2E-Gym/SWE-Bench-Verified", split="test")
    assert calls == [("R2E-Gym/SWE-Bench-Verified", "test")]
    assert tasks[0].kind == "r2e_swebench"


def test_hugging_face_failure_is_a_task_error(monkeypatch):
    import datasets

    def offline_hub(name, split):
        raise ConnectionError("offline")

    monkeypatch.setattr(datasets, "load_dataset", offline_hub)
    with pytest.raises(TaskError, match="R2E-Gym/R2E-Gym-Lite.*split 'train'.*offline"):
        load_tasks("R2E-Gym/R2E-Gym-Lite", split="train")


# ---------------------------------------------------------------- bad input


def test_a_row_with_bad_fields_is_reported_and_skipped_the_rest_load(tmp_path):
    row = swebench_row(instance_id="astropy__astropy-2")
    del row["test_patch"]
    empty_oracle = r2e_row(expected_output_json="")
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in (swebench_row(), row, empty_oracle, r2e_row())) + "\n")
    tasks = load_tasks(path)
    assert [t.kind for t in tasks] == ["swebench", "r2e"]
    fields = [(e.field, e.source) for e in tasks.skipped]
    assert fields == [("test_patch", f"{path} line 2"), ("expected_output_json", f"{path} line 3")]


def test_a_file_whose_every_row_is_bad_is_an_error(tmp_path):
    row = swebench_row()
    del row["test_patch"]
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(TaskError, match=r"no usable task rows \(1 skipped\); first: .*line 1: field 'test_patch'"):
        load_tasks(path)


def test_rows_keep_their_swebench_5x_metadata_and_the_whole_row():
    row = swebench_row(
        image="swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest",
        eval_script="#!/bin/bash\necho hi\n",
        log_parser="parse_log_astropy",
        eval_type="pass_and_fail",
        image_assets=json.dumps({"test_patch": [{"path": "a.png", "url": "https://x/a.png"}]}),
    )
    task = task_from_row(row)
    assert task.has_swebench_metadata
    assert (task.eval_script, task.log_parser, task.eval_type) == (
        row["eval_script"],
        "parse_log_astropy",
        "pass_and_fail",
    )
    assert task.image_assets == {"test_patch": [{"path": "a.png", "url": "https://x/a.png"}]}
    assert task.environment_setup_commit == row["environment_setup_commit"]
    assert task.source_row == row
    assert not task_from_row(swebench_row()).has_swebench_metadata


def test_r2e_rows_strip_issue_tags_as_r2e_gym_does():
    task = task_from_row(r2e_row(problem_statement="intro [ISSUE]\nfirst[/ISSUE] mid [ISSUE]second[/ISSUE] end"))
    assert task.problem_statement == "\nfirst[/ISSUE] mid [ISSUE]second"  # greedy, as R2E-Gym's regex
    assert task_from_row(r2e_row(problem_statement="no tags")).problem_statement == "no tags"
    assert task.source_row["problem_statement"].startswith("intro")


def test_network_needs_and_grading_limits_per_task():
    requests_row = swebench_row(instance_id="psf__requests-1", repo="psf/requests")
    assert task_from_row(requests_row).needs_network
    assert not task_from_row({**requests_row, "needs_network": False}).needs_network
    task = task_from_row(swebench_row(grading={"timeout_s": 60, "memory": "8g"}))
    assert (task.grading.timeout_s, task.grading.memory, task.grading.network) == (60, "8g", None)
    with pytest.raises(TaskError) as info:
        task_from_row(swebench_row(grading={"timeout": 60}))
    assert info.value.field == "grading.timeout"


def test_malformed_jsonl_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(swebench_row()) + "\n{not json\n")
    with pytest.raises(TaskError, match=r"line 2: malformed JSON"):
        load_tasks(path)


def test_malformed_json_file(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text("[{")
    with pytest.raises(TaskError, match="bad.json: malformed JSON"):
        load_tasks(path)


@pytest.mark.parametrize("value", [5, '"just a string"', "[not json", {"a": 1}])
def test_fail_to_pass_not_a_list(value):
    with pytest.raises(TaskError) as info:
        task_from_row(swebench_row(FAIL_TO_PASS=value), source="rows.jsonl line 7")
    assert info.value.field.startswith("FAIL_TO_PASS")
    assert "rows.jsonl line 7" in str(info.value)


def test_wrong_type_names_the_field():
    with pytest.raises(TaskError) as info:
        task_from_row(swebench_row(problem_statement=["not", "text"]))
    assert info.value.field == "problem_statement"


def test_r2e_row_without_expected_output():
    with pytest.raises(TaskError) as info:
        task_from_row(r2e_row(expected_output_json=None))
    assert info.value.field == "expected_output_json"


def test_row_that_is_not_an_object(tmp_path):
    path = tmp_path / "rows.json"
    path.write_text("[1]")
    with pytest.raises(TaskError, match="must be an object"):
        load_tasks(path)


def test_duplicate_instance_ids(tmp_path):
    path = tmp_path / "dup.jsonl"
    path.write_text((json.dumps(swebench_row()) + "\n") * 2)
    with pytest.raises(TaskError, match="duplicate instance_id 'astropy__astropy-12907'"):
        load_tasks(path)


def test_empty_file(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n")
    with pytest.raises(TaskError, match="no task rows"):
        load_tasks(path)


def test_unsupported_suffix_and_missing_path(tmp_path):
    csv = tmp_path / "tasks.csv"
    csv.write_text("a,b\n")
    with pytest.raises(TaskError, match="unsupported file type"):
        load_tasks(csv)
    with pytest.raises(TaskError, match="no such file or folder"):
        load_tasks(tmp_path / "nope.jsonl")
    with pytest.raises(TaskError, match="no such file or folder"):
        load_tasks(Path("./relative/missing"))
