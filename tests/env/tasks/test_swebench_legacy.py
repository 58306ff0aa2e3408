"""Classic SWE-bench rows through the legacy swebench venvs (env.tasks.swebench_legacy, `nexus-eval tasks convert`).

The conversion is checked byte for byte against swebench 4.1.0's own `make_test_spec`, run independently here
(a few lines of our own in a separate subprocess of the 4.1.0 venv, with `requests.get` faked so the
environment-script download works offline), and the converted rows against swebench 5.x's `make_test_spec`.
Tests that need the venvs are `slow`: the first run builds them (about 30 s each) at the default location
(or $NEXUS_EVAL_SWEBENCH_VENVS); CI builds them beforehand in .ci/parts/45-swebench-legacy.sh.
"""

from __future__ import annotations

import json
import subprocess
import textwrap

import pytest
import typer
from typer.testing import CliRunner

from env.tasks import swebench_legacy
from env.tasks.swebench_legacy import (
    LEGACY_VERSIONS,
    LegacySwebenchError,
    convert_classic_rows,
    legacy_python,
    r2e_swebench_verdict,
    r2e_swebench_verdicts,
)
from nexus_eval.commands.tasks_convert import convert
from tests.conftest import require


def _diff(*paths: str) -> str:
    """A small made-up unified diff touching `paths` (only the file names matter to swebench)."""
    return "".join(
        f"diff --git a/{p} b/{p}\n--- a/{p}\n+++ b/{p}\n@@ -10,3 +10,4 @@\n     pass\n+    assert True\n \n \n"
        for p in paths
    )


def classic_row(instance_id, repo, version, test_files, f2p, p2p, base_commit) -> dict:
    return {
        "instance_id": instance_id,
        "repo": repo,
        "version": version,
        "base_commit": base_commit,
        "environment_setup_commit": "0" * 40,
        "problem_statement": f"a made-up issue for {instance_id}",
        "hints_text": "",
        "created_at": "2020-01-01T00:00:00Z",
        "patch": _diff("src/module.py"),
        "test_patch": _diff(*test_files),
        "FAIL_TO_PASS": json.dumps(f2p),
        "PASS_TO_PASS": json.dumps(p2p),
    }


DJANGO_F2P = "test_ascii_validator (auth_tests.test_validators.UsernameValidatorsTests)"
DJANGO_P2P = "test_help_text (auth_tests.test_validators.UserAttributeSimilarityValidatorTest)"
ROWS = {
    "django": classic_row(
        "django__django-11099",
        "django/django",
        "3.0",
        ["tests/auth_tests/test_validators.py"],
        [DJANGO_F2P],
        [DJANGO_P2P],
        "d26b2424437dabeeca94d7900b37d2df4410da0c",
    ),
    "sympy": classic_row(
        "sympy__sympy-17655",
        "sympy/sympy",
        "1.5",
        ["sympy/geometry/tests/test_point.py"],
        ["test_point"],
        ["test_point3D", "test_Point2D"],
        "f5e965947af2410ded92cfad987aaf45262ea434",
    ),
    "sphinx": classic_row(
        "sphinx-doc__sphinx-8721",
        "sphinx-doc/sphinx",
        "3.5",
        ["tests/test_ext_viewcode.py"],
        ["tests/test_ext_viewcode.py::test_viewcode_epub_default"],
        ["tests/test_ext_viewcode.py::test_viewcode"],
        "82ef497a8c88f0f6e50d84520e7276bfbf65025d",
    ),
    "scikit-learn": classic_row(
        "scikit-learn__scikit-learn-14894",
        "scikit-learn/scikit-learn",
        "0.22",
        ["sklearn/svm/tests/test_svm.py"],
        ["sklearn/svm/tests/test_svm.py::test_sparse_fit_support_vectors_empty"],
        ["sklearn/svm/tests/test_svm.py::test_libsvm_parameters"],
        "fdbaa58acbead5a254f2e6d597dc1ab3b947f4c6",
    ),
    "requests": classic_row(
        "psf__requests-1724",
        "psf/requests",
        "2.0",
        ["test_requests.py"],
        ["test_requests.py::RequestsTestCase::test_unicode_method_name"],
        ["test_requests.py::RequestsTestCase::test_basic_building"],
        "1ba83c47ce7b177efe90d5f51f7760680f72eda0",
    ),
}
UNKNOWN = classic_row("acme__rockets-7", "acme/rockets", "1.0", ["tests/test_x.py"], ["t"], [], "1" * 40)

# swebench 4.1.0's own answer, computed without our worker: make_test_spec as released, requests faked
INDEPENDENT = textwrap.dedent(
    """
    import json, sys
    import requests

    class _Offline:
        status_code, text = 200, ""

    requests.get = lambda *args, **kwargs: _Offline()
    from swebench.harness.constants import FAIL_ONLY_REPOS, MAP_REPO_VERSION_TO_SPECS
    from swebench.harness.log_parsers import MAP_REPO_TO_PARSER
    from swebench.harness.test_spec.test_spec import make_test_spec

    request = json.load(sys.stdin)
    out = []
    for row in request["rows"]:
        spec = make_test_spec(row, namespace=request["namespace"], arch=request["arch"])
        out.append({
            "eval_script": spec.eval_script,
            "log_parser": MAP_REPO_TO_PARSER[row["repo"]].__name__,
            "eval_type": "fail_only" if row["repo"] in FAIL_ONLY_REPOS else "pass_and_fail",
            "image": spec.instance_image_key,
            "test_cmd": MAP_REPO_VERSION_TO_SPECS[row["repo"]][row["version"]]["test_cmd"],
        })
    print(json.dumps(out))
    """
)


@pytest.fixture(scope="session")
def legacy_venvs() -> dict[str, str]:
    """Both legacy venvs, built if missing; skips (fails under CI) only if they cannot be built."""
    try:
        return {version: str(legacy_python(version)) for version in LEGACY_VERSIONS}
    except LegacySwebenchError as exc:
        require(False, f"cannot build the legacy swebench venvs: {exc}")


def independent_4_1_0(python: str, rows: list[dict], namespace: str | None, arch: str) -> list[dict]:
    request = json.dumps({"rows": rows, "namespace": namespace, "arch": arch})
    proc = subprocess.run([python, "-I", "-c", INDEPENDENT], input=request, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


# ---------------------------------------------------------------- no venv needed


def test_unsupported_version_is_a_clear_error():
    with pytest.raises(LegacySwebenchError, match="not supported.*3.0.2, 4.1.0"):
        legacy_python("5.0.2")


def test_rows_already_in_5x_form_pass_through_without_a_venv(tmp_path, monkeypatch):
    monkeypatch.setenv(swebench_legacy.VENVS_ENV, str(tmp_path / "venvs"))
    row = {**ROWS["django"], "eval_script": "#!/bin/bash\n", "image": "x", "log_parser": "p", "eval_type": "t"}
    result = convert_classic_rows([row], cache_dir=tmp_path / "cache")
    assert result.rows == [row] and result.passed_through == 1 and not result.errors
    assert not (tmp_path / "venvs").exists()


def test_a_failed_build_says_what_to_run_by_hand(tmp_path, monkeypatch):
    monkeypatch.setenv(swebench_legacy.VENVS_ENV, str(tmp_path / "venvs"))

    def failing(cmd, **kwargs):
        return subprocess.CompletedProcess(cmd, 1, stdout="", stderr="ERROR: No matching distribution")

    monkeypatch.setattr(swebench_legacy.subprocess, "run", failing)
    with pytest.raises(LegacySwebenchError, match="(?s)No matching distribution.*by hand: .*pip install swebench=="):
        legacy_python("4.1.0")
    assert not swebench_legacy.venv_ready("4.1.0")


# ---------------------------------------------------------------- conversion (swebench 4.1.0)


@pytest.mark.slow
@pytest.mark.parametrize(("namespace", "arch"), [("swebench", "x86_64"), (None, "arm64")])
def test_conversion_matches_swebench_4_1_0_byte_for_byte(legacy_venvs, tmp_path, namespace, arch):
    from swebench.harness.constants import TEST_EXIT_CODE
    from swebench.harness.utils import make_test_spec as make_test_spec_5x

    rows = list(ROWS.values())
    result = convert_classic_rows(rows, namespace=namespace, arch=arch, cache_dir=tmp_path)
    assert not result.errors and len(result.rows) == len(rows)
    expected = independent_4_1_0(legacy_venvs["4.1.0"], rows, namespace, arch)
    for original, converted, want in zip(rows, result.rows, expected, strict=True):
        assert {k: converted[k] for k in original} == original  # the classic fields are kept as they were
        for key in ("eval_script", "log_parser", "eval_type", "image"):
            assert converted[key] == want[key], (original["instance_id"], key)
        assert converted["converted_by"] == "swebench==4.1.0"
        spec = make_test_spec_5x(converted)  # swebench 5.x accepts the row
        assert spec.image == want["image"] and spec.log_parser == want["log_parser"]
        assert want["test_cmd"] in spec.eval_script and TEST_EXIT_CODE in spec.eval_script
    images = {row["repo"]: row["image"] for row in result.rows}
    if namespace == "swebench":
        from env.tasks.images import swebench_image_name  # our own spelling of 4.x's image names agrees with 4.1.0

        assert [swebench_image_name(r["instance_id"], arch=arch) for r in rows] == [w["image"] for w in expected]
        assert images["django/django"] == "swebench/sweb.eval.x86_64.django_1776_django-11099:latest"
    else:
        assert images["psf/requests"] == "sweb.eval.arm64.psf__requests-1724:latest"


@pytest.mark.slow
def test_unknown_repo_or_version_is_reported_and_the_rest_convert(legacy_venvs, tmp_path):
    old_django = {**ROWS["django"], "instance_id": "django__django-1", "version": "0.1"}
    rows = [ROWS["django"], UNKNOWN, ROWS["sympy"], old_django]
    result = convert_classic_rows(rows, cache_dir=tmp_path)
    assert [r["instance_id"] for r in result.rows] == ["django__django-11099", "sympy__sympy-17655"]
    assert [(e.index, e.instance_id) for e in result.errors] == [(1, "acme__rockets-7"), (3, "django__django-1")]
    assert "does not know the repo 'acme/rockets'" in result.errors[0].reason
    assert "no version '0.1' of django/django" in result.errors[1].reason


@pytest.mark.slow
def test_a_second_conversion_comes_from_the_cache(legacy_venvs, tmp_path, monkeypatch):
    rows = [ROWS["sphinx"], ROWS["requests"]]
    first = convert_classic_rows(rows, cache_dir=tmp_path)
    assert first.cached == 0 and not first.errors

    def no_worker(*args, **kwargs):
        raise AssertionError("the cache should have answered")

    monkeypatch.setattr(swebench_legacy, "_worker", no_worker)
    second = convert_classic_rows(rows, cache_dir=tmp_path)
    assert second.cached == 2 and second.rows == first.rows
    with pytest.raises(AssertionError, match="cache should have answered"):  # another namespace: another key
        convert_classic_rows(rows, namespace="other", cache_dir=tmp_path)
    changed = {**ROWS["sphinx"], "test_patch": _diff("tests/test_build.py")}
    with pytest.raises(AssertionError, match="cache should have answered"):  # a changed test patch: another key
        convert_classic_rows([changed], cache_dir=tmp_path)


# ---------------------------------------------------------------- R2E-Gym's verdict (swebench 3.0.2)


def django_log(f2p_status: str = "ok", extra: str = "") -> str:
    """A log shaped like a SWE-bench eval script's output (set -x trace + Django's runner at verbosity 2)."""
    return (
        textwrap.dedent(
            f"""\
        + git show
        commit d26b2424437dabeeca94d7900b37d2df4410da0c
            Mention the test: {DJANGO_F2P} ... FAIL
        + git apply -v -
        Applied patch tests/auth_tests/test_validators.py cleanly.
        + : '>>>>> Start Test Output'
        + ./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 auth_tests.test_validators
        Testing against Django installed in '/testbed/django'
        Importing application auth_tests
        Skipping setup of unused database(s): default, other.
        System check identified no issues (0 silenced).
        {DJANGO_F2P} ... {f2p_status}
        {DJANGO_P2P} ... ok
        test_validate (auth_tests.test_validators.NumericPasswordValidatorTest) ... ok

        ----------------------------------------------------------------------
        Ran 3 tests in 0.012s

        {"OK" if f2p_status == "ok" else "FAILED (failures=1)"}
        + : '>>>>> End Test Output'
        + git checkout d26b2424437dabeeca94d7900b37d2df4410da0c tests/auth_tests/test_validators.py
        """
        )
        + extra
    )


@pytest.mark.slow
def test_r2e_verdict_resolved_when_everything_passes(legacy_venvs):
    verdict = r2e_swebench_verdict(ROWS["django"], django_log())
    assert verdict["found"] and verdict["resolved"]
    # only the text after the test command is parsed: the "... FAIL" inside `git show` above it is ignored
    assert verdict["status_map"][DJANGO_F2P] == "PASSED"
    assert verdict["report"]["FAIL_TO_PASS"] == {"success": [DJANGO_F2P], "failure": []}
    assert verdict["tool"] == "r2e-gym docker.py semantics on swebench==3.0.2"


@pytest.mark.slow
def test_r2e_verdicts_failed_f2p_timeout_and_unknown_repo(legacy_venvs):
    failed, timed_out, unknown = r2e_swebench_verdicts(
        [
            (ROWS["django"], django_log("FAIL")),
            (ROWS["django"], django_log(extra=">>>>> Tests Timed Out\n")),
            (UNKNOWN, django_log()),
        ]
    )
    assert failed["found"] and not failed["resolved"]
    assert failed["report"]["FAIL_TO_PASS"]["failure"] == [DJANGO_F2P]
    assert failed["report"]["PASS_TO_PASS"]["success"] == [DJANGO_P2P]
    assert not timed_out["found"] and not timed_out["resolved"] and timed_out["status_map"] == {}
    assert timed_out["bad_markers"] == [">>>>> Tests Timed Out"]
    assert not unknown["resolved"] and "acme/rockets" in unknown["error"]
    with pytest.raises(LegacySwebenchError, match="acme__rockets-7"):
        r2e_swebench_verdict(UNKNOWN, django_log())


# ---------------------------------------------------------------- the CLI verb


def _cli() -> typer.Typer:
    app = typer.Typer()
    app.command("convert")(convert)
    app.command("other")(lambda: None)  # two commands, so `convert` stays a named sub-command
    return app


def test_cli_rejects_a_missing_input(tmp_path):
    result = CliRunner().invoke(_cli(), ["convert", str(tmp_path / "nope.jsonl"), str(tmp_path / "out.jsonl")])
    assert result.exit_code == 2 and "no such file" in result.output


@pytest.mark.slow
@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_cli_converts_a_file(legacy_venvs, tmp_path, monkeypatch, suffix):
    monkeypatch.setenv(swebench_legacy.CACHE_ENV, str(tmp_path / "cache"))
    already = {**ROWS["sympy"], "instance_id": "sympy__sympy-1", "eval_script": "#!/bin/bash\necho hi\n"}
    already.update(image="img", log_parser="parse_log_sympy", eval_type="pass_and_fail")
    rows = [ROWS["django"], UNKNOWN, already, ROWS["scikit-learn"]]
    source = tmp_path / f"in{suffix}"
    if suffix == ".jsonl":
        source.write_text("".join(json.dumps(row) + "\n" for row in rows))
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        keys = sorted({key for row in rows for key in row})
        pq.write_table(pa.Table.from_pylist([{k: row.get(k) for k in keys} for row in rows]), source)
    target = tmp_path / "out" / "converted.jsonl"

    result = CliRunner().invoke(_cli(), ["convert", str(source), str(target), "--namespace", "none"])
    assert result.exit_code == 1, result.output
    assert "acme__rockets-7" in result.output and "does not know the repo" in result.output
    written = [json.loads(line) for line in target.read_text().splitlines()]
    ids = ["django__django-11099", "sympy__sympy-1", "scikit-learn__scikit-learn-14894"]
    assert [r["instance_id"] for r in written] == ids
    assert written[0]["image"] == "sweb.eval.x86_64.django__django-11099:latest"
    assert written[1]["eval_script"] == already["eval_script"] and "converted_by" not in written[1]
    assert written[2]["log_parser"] == "parse_log_pytest_v2" and written[2]["converted_by"] == "swebench==4.1.0"


def test_cli_prints_ids_with_brackets_as_text(tmp_path, monkeypatch):
    """A row id like ``[/x]`` is text, not rich markup: it used to crash the progress line (MarkupError)."""
    monkeypatch.setenv(swebench_legacy.VENVS_ENV, str(tmp_path / "venvs"))
    row = {**ROWS["django"], "instance_id": "[/x]", "eval_script": "#!/bin/bash\n", "image": "x"}
    row.update(log_parser="p", eval_type="t")
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps(row) + "\n")
    result = CliRunner().invoke(_cli(), ["convert", str(source), str(tmp_path / "[/y].jsonl")])
    assert result.exit_code == 0, result.output
    assert "wrote 1 rows" in result.output and "[/y].jsonl" in result.output
    bad = CliRunner().invoke(_cli(), ["convert", str(tmp_path / "[/z].jsonl"), str(tmp_path / "out.jsonl")])
    assert bad.exit_code == 2 and "[/z].jsonl: no such file" in bad.output
