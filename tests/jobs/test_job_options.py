"""``submit`` and ``run`` take the job flags declared once (``nexus_eval.commands._job_flags.JobFlags``): the same
options with the same defaults and help on both verbs, every override a flag stands for reaching its JobSpec field,
and the same job from the same flags."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import typer

from jobs.spec import JobSpec
from nexus_eval.cli import app
from nexus_eval.commands._flag_group import flag, takes_flags
from nexus_eval.commands._job_flags import JobFlags, job_overrides

#: the options only ``run`` has (it also runs the job and prints the table)
RUN_ONLY = {"timeout", "fmt"}
#: a value for each override flag, unlike the job default
GIVEN: dict[str, Any] = {
    "name": "named",
    "model": "smollm2-135m",
    "backend": "oracle",
    "methods": "dense,snapkv",
    "scopes": "prefill_only",
    "protocols": "full_context",
    "density": 0.5,
    "preset": "reference",
    "seeds": "3,4",
    "suite": "mini",
    "tasks": "humanfmt__humanfmt-1",
    "max_steps": 7,
    "max_new_tokens": 9,
    "max_context_tokens": 4096,
    "temperature": 0.25,
}


def _params(verb: str) -> dict[str, Any]:
    """The verb's click parameters by name, in order."""
    return {p.name: p for p in typer.main.get_command(app).commands[verb].params if p.name}


def _shape(p: Any) -> tuple:
    """What a user sees of an option: its names, default, type, help, whether it is a switch."""
    kind = getattr(getattr(p, "type_descriptor", None), "annotation", None)
    return (p.opts, p.secondary_opts, p.default, kind, getattr(p, "help", None), getattr(p, "is_flag", None))


def test_submit_and_run_take_the_same_job_options_with_the_same_defaults():
    submit, run = _params("submit"), _params("run")
    assert set(run) - set(submit) == RUN_ONLY and set(submit) <= set(run)  # an option on one verb only fails here
    # the same options; the help differs only where run's quick job (used without --file) sets another value
    assert {name: _shape(p)[:4] + _shape(p)[5:] for name, p in submit.items()} == {
        name: _shape(run[name])[:4] + _shape(run[name])[5:] for name in submit
    }
    differ = {name for name in submit if submit[name].help != run[name].help}
    assert differ == {"methods", "tasks", "max_steps", "max_new_tokens", "max_context_tokens"}
    assert all("quick job: " in run[name].help and "job default" not in run[name].help for name in differ)
    job = [f.name for f in dataclasses.fields(JobFlags)]
    for verb in (submit, run):
        assert list(verb)[: len(job)] == job  # declared once, listed first, in JobFlags' order
        assert all(verb[name].default in (None, False) for name in job)  # a flag not given changes nothing


def test_every_override_flag_sets_its_job_field():
    """Each JobFlags field but ``file``, ``show`` and ``no_model_check`` is one override, and that override reaches
    the JobSpec."""
    assert set(GIVEN) == {f.name for f in dataclasses.fields(JobFlags)} - {"file", "show", "no_model_check"}
    assert JobFlags().overrides() == {}
    for name, value in GIVEN.items():
        overrides = JobFlags(**{name: value}).overrides()
        assert len(overrides) == 1, name
        ((key, override),) = overrides.items()
        spec = JobSpec.load(None, overrides)
        field: Any = spec
        for part in key.split("."):
            field = getattr(field, part)
        if isinstance(override, dict):  # a new model / task source: its one given field
            assert {k: getattr(field, k) for k in override} == override, name
        else:
            assert field == override, name
    assert job_overrides(**GIVEN) == JobFlags(**GIVEN).overrides()  # what `episode` calls


def _cli_args() -> list[str]:
    return [arg for name, value in GIVEN.items() for arg in (f"--{name.replace('_', '-')}", str(value))]


def test_both_verbs_make_the_same_job_from_the_same_flags(tmp_path):
    from typer.testing import CliRunner

    file = tmp_path / "job.yaml"
    file.write_text("name: from-file\ndensity: 0.3\n")
    shown = {}
    for verb in ("submit", "run"):
        result = CliRunner().invoke(app, [verb, "--file", str(file), "--show", *_cli_args()])
        assert result.exit_code == 0, result.output
        shown[verb] = result.stdout
    assert shown["submit"] == shown["run"]
    assert "name: named" in shown["submit"] and "density: 0.5" in shown["submit"]


@dataclasses.dataclass(frozen=True)
class Group:
    size: int | None = flag(typer.Option(None, help="a size"))
    loud: bool = flag(typer.Option(False, "--loud"))


@dataclasses.dataclass(frozen=True)
class HasDb:
    db: str | None = flag(typer.Option(None))


def test_a_flag_group_spreads_into_options_and_comes_back_as_one_value():
    seen = []

    @takes_flags
    def verb(group: Group, after: str = typer.Option("x")) -> None:
        seen.append((group, after))

    one = typer.Typer()
    one.command()(verb)
    one.command("other")(lambda: None)
    from typer.testing import CliRunner

    result = CliRunner().invoke(one, ["verb", "--size", "3", "--loud"])
    assert result.exit_code == 0, result.output
    assert seen == [(Group(size=3, loud=True), "x")]
    names = [p.name for p in typer.main.get_command(one).commands["verb"].params]
    assert names == ["size", "loud", "after"]


def test_a_flag_named_twice_is_refused():
    def verb(group: HasDb, db: str = typer.Option(None)) -> None: ...

    with pytest.raises(TypeError, match=r"\['db'\] named twice"):
        takes_flags(verb)
