"""``nexus-eval probe`` end to end on the tiny model: a real run through the CLI stores exactly what
``run_probes`` yields; ``show`` / ``compare`` in every format carry numbers equal to a recomputation from the
stored rows; bad input is exit 2 with nothing stored; a crash mid-run keeps what finished."""

from __future__ import annotations

import csv
import io
import json
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agent_runner.config import ModelSpec
from agent_runner.model_host import load_host
from db import connect, sqlite_url
from db.probes import RESULT_FIELDS, load_probe_run
from measure.probes import ProbeSettings, fingerprint, run_probes
from nexus_eval.cli import app
from results.stats import bootstrap_mean_ci, mcnemar_paired, wilson_interval

# "--workers": the older spelling of --processes, kept accepted for existing scripts (tested here on purpose)
CELLS = ["--lengths", "256", "--variants", "dense,snapkv", "--densities", "0.5", "--workers", "1"]
ARGS = ["--model", "tiny", "--samples", "2", "--dtype", "float32", *CELLS]
SETTINGS = ProbeSettings(model="tiny", samples=2, lengths=(256,), variants=("dense", "snapkv"), densities=(0.5,))
FORMATS = ("json", "csv", "tsv", "markdown", "table")


@dataclass
class Run:
    db_path: Path
    run_id: str
    stdout: str
    stderr: str

    @property
    def url(self) -> str:
        return sqlite_url(self.db_path)


def cli(*args: str):
    return CliRunner().invoke(app, list(args))


def stored(url: str, run_id: str):
    database = connect(url)
    try:
        with database.session() as s:
            run, rows = load_probe_run(s, run_id)
            return run, [{name: getattr(r, name) for name in RESULT_FIELDS} for r in rows]
    finally:
        database.dispose()


@pytest.fixture(scope="module")
def probe_run(tmp_path_factory) -> Run:
    db_path = tmp_path_factory.mktemp("probes") / "results.db"
    done = cli("probe", "run", *ARGS, "--db", str(db_path), "--format", "json")
    assert done.exit_code == 0, done.output
    return Run(db_path, json.loads(done.stdout)["run"]["id"], done.stdout, done.stderr)


def test_auto_measures_in_the_dtype_this_machine_computes_fastest_and_the_run_stores_it(tmp_path):
    from measure.measuring_dtype import choose_dtype

    db_path = tmp_path / "results.db"
    one = ["--model", "tiny", "--samples", "1", "--probes", "nll", "--lengths", "256", "--variants", "dense"]
    done = cli("probe", "run", *one, "--dtype", "auto", "--db", str(db_path), "--format", "json")
    assert done.exit_code == 0, done.output
    chosen = choose_dtype("auto", cuda=False)
    assert f"measuring in {chosen.dtype} ({chosen.why})" in done.stderr
    run, _ = stored(sqlite_url(db_path), json.loads(done.stdout)["run"]["id"])
    assert (
        run.settings["dtype"] == run.provenance["dtype"] == chosen.dtype
    )  # asked and loaded: one, stored with the run
    bad = cli("probe", "run", *one, "--dtype", "fp16", "--db", str(tmp_path / "other.db"))
    assert bad.exit_code == 2 and "unknown dtype 'fp16'; use auto, float32, bfloat16" in bad.output
    assert not (tmp_path / "other.db").exists()


def test_the_cli_stores_exactly_what_run_probes_yields(probe_run):
    run, rows = stored(probe_run.url, probe_run.run_id)
    expected = [r.to_dict() for r in run_probes(load_host(ModelSpec(name=SETTINGS.model)), SETTINGS)]
    assert len(rows) == len(expected) == 16  # needle 2 cells, later_turn 4, nll 2; 2 samples each
    for got, want in zip(rows, expected, strict=True):
        assert got.pop("seconds") > 0 and want.pop("seconds") > 0  # timings are measured, not reproduced
        assert got == want
    assert (run.status, run.n_results, run.n_planned, run.error) == ("done", 16, 16, None)
    assert run.settings == SETTINGS.model_dump(mode="json") and run.model == "tiny"
    assert run.provenance["corpus"] == fingerprint() and run.provenance["device"] == "cpu"
    assert {"torch", "transformers"} <= set(run.provenance["packages"]) and run.provenance["threads"] == 1
    lines = [line for line in probe_run.stderr.splitlines() if line.startswith("[")]
    assert len(lines) == 16 and lines[0].startswith("[1/16] needle dense") and lines[-1].startswith("[16/16] nll")


KV = ("kv_held_bytes", "kv_allocated_bytes", "kv_peak_held_bytes", "kv_peak_allocated_bytes")


def _recompute(rows: list[dict]) -> dict[tuple, dict]:
    """The cells' numbers from the stored rows, written out here without results.probe_stats."""
    by_cell: dict[tuple, dict[int, dict]] = defaultdict(dict)
    for r in rows:
        by_cell[(r["probe"], r["variant"], r["scope"], r["protocol"], r["density"])][r["sample"]] = r
    out = {}
    for key, samples in by_cell.items():
        probe, variant, scope, protocol, density = key
        values = list(samples.values())
        cell = {"n": len(values), "kept_fraction": sum(v["kept_fraction"] for v in values) / len(values)}
        for name in KV:
            cell[name] = sum(v[name] for v in values) / len(values)
        if probe != "nll":
            k = sum(v["correct"] for v in values)
            cell.update(n_correct=k, accuracy=k / len(values))
            cell["ci_low"], cell["ci_high"] = wilson_interval(k, len(values))
            for base in ("dense", "snapkv"):
                other = by_cell.get((probe, base, scope, protocol, density))
                if base != variant and other:
                    test = mcnemar_paired([(samples[i]["correct"], other[i]["correct"]) for i in sorted(samples)])
                    cell[f"vs_{base}"] = (test.b, test.c, test.p_value)
        if probe != "needle":
            cell["nll"] = sum(v["nll"] for v in values) / len(values)
            if variant != "dense":
                dense = by_cell[(probe, "dense", scope, protocol, density)]
                deltas = [samples[i]["nll"] - dense[i]["nll"] for i in sorted(samples)]
                cell["delta_nll"] = sum(deltas) / len(deltas)
                cell["delta_ci_low"], cell["delta_ci_high"] = bootstrap_mean_ci(deltas, seed=0) or (None, None)
        out[key] = cell
    return out


def test_show_and_compare_carry_numbers_equal_to_a_recomputation(probe_run):
    _, rows = stored(probe_run.url, probe_run.run_id)
    expected = _recompute(rows)
    outputs = {}
    for fmt in FORMATS:
        shown = cli("probe", "show", probe_run.run_id[:5], "--db", probe_run.url, "--format", fmt)
        compared = cli("compare", probe_run.run_id, "--db", probe_run.url, "--format", fmt)
        assert shown.exit_code == 0 and compared.exit_code == 0, (shown.output, compared.output)
        assert compared.stdout == shown.stdout
        outputs[fmt] = shown.stdout
    assert json.loads(outputs["json"]) == json.loads(probe_run.stdout)  # what `run` printed is what is stored
    cells = json.loads(outputs["json"])["cells"]
    assert len(cells) == len(expected) == 8
    csv_rows = {(r["probe"], r["variant"], r["protocol"]): r for r in csv.DictReader(io.StringIO(outputs["csv"]))}
    tsv_lines = list(csv.reader(io.StringIO(outputs["tsv"]), delimiter="\t"))
    assert tsv_lines == list(csv.reader(io.StringIO(outputs["csv"])))  # csv with a tab: the same fields
    for c in cells:
        want = expected[(c["probe"], c["variant"], c["scope"], c["protocol"], c["density"])]
        for name, value in want.items():
            if name.startswith("vs_"):
                test = c["vs"][name[3:]]
                assert (test["b"], test["c"], test["p_value"]) == value, (c, name)
            elif value is None:  # no interval (too few samples): None compared as itself, not through approx
                assert c[name] is None, (c, name)
            else:
                assert c[name] == pytest.approx(value, rel=1e-12, abs=1e-15), (c, name)
        line = csv_rows[(c["probe"], c["variant"], c["protocol"])]
        for name in ("accuracy", "ci_low", "ci_high", "nll", "delta_nll", "delta_ci_low", "kept_fraction", *KV):
            assert (float(line[name]) if line[name] else None) == c[name], (name, line)
        texts = [f"{want['n_correct']}/{want['n']} {100 * want['accuracy']:.1f}%"] if "accuracy" in want else []
        if "delta_nll" in want:
            texts.append(f"{want['delta_nll']:+.3f} (2 samples: too few for an interval)")  # 2 samples a cell
        assert all(t in outputs["markdown"] for t in texts), texts
        assert all(t.split(" (")[0] in outputs["table"] for t in texts), texts  # a terminal table wraps the rest
    for probe in ("needle", "later_turn", "nll"):
        assert f"### {probe}" in outputs["markdown"] and re.search(rf"^{probe} · ", outputs["table"], re.M)
    assert "tiny model: random weights" in outputs["table"] and "n < 30 per cell" in outputs["markdown"]


def test_list_and_unknown_ids(probe_run):
    listed = cli("probe", "list", "--db", probe_run.url)
    assert listed.exit_code == 0 and probe_run.run_id in listed.stdout and "16/16" in listed.stdout
    for verb in (["probe", "show"], ["compare"]):
        done = cli(*verb, "zz", "--db", probe_run.url)
        assert done.exit_code == 2 and "no probe run with id 'zz'" in done.output


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--probes", "needle,haystack"], "unknown probe 'haystack'"),
        (["--variants", "dense,nosuch"], "nosuch"),
        (["--variants", "nexus(lam=0,nosuch=1)"], "nosuch"),
        (["--densities", "0"], "--densities"),
        (["--densities", "half"], "--densities takes comma-separated numbers"),
        (["--lengths", "100"], "at least 256"),
        (["--samples", "0"], "--samples"),
        (["--scopes", "everything"], "everything"),
        (["--preset", "nosuch"], "unknown preset"),
        (["--format", "xml"], "unknown --format 'xml'"),
        (["-o", "/nonexistent-folder/out.json"], "does not exist"),
        (["--model", "/nonexistent/model"], "model path '/nonexistent/model' does not exist"),
    ],
)
def test_bad_input_exits_2_and_stores_nothing(tmp_path, flags, message):
    db_path = tmp_path / "results.db"
    done = cli("probe", "run", *ARGS, *flags, "--db", str(db_path))
    assert done.exit_code == 2, done.output
    assert message in done.output and "nothing was run" in done.output
    assert "loading" not in done.output and not db_path.exists()


def test_a_crash_mid_run_keeps_what_finished(tmp_path):
    # nll's continuation is longer than any filler source: the run fails at the first nll sample, after needle
    db_path = tmp_path / "results.db"
    args = ["--probes", "needle,nll", "--samples", "1", "--continuation", "1000000"]
    done = cli("probe", "run", "--model", "tiny", *CELLS, *args, "--db", str(db_path))
    assert done.exit_code == 1, done.output
    assert re.search(r"failed after 2 of 4 results: ValueError: filler source '\w+' is shorter", done.output)
    run_id = re.search(r"probe show (\w+)", done.output)[1]
    run, rows = stored(sqlite_url(db_path), run_id)
    assert run.status == "failed" and run.finished_at is not None and run.n_results == 2
    assert run.error.splitlines()[0].startswith("ValueError: filler source") and "Traceback" in run.error
    assert [(r["probe"], r["variant"]) for r in rows] == [("needle", "dense"), ("needle", "snapkv")]
    shown = cli("probe", "show", run_id, "--db", str(db_path), "--format", "markdown")
    assert shown.exit_code == 0 and "failed after 2 of 4 results" in shown.stdout


def test_help_names_the_probe_settings_defaults():
    done = cli("probe", "run", "--help")
    text = re.sub(r"[\s│]+", " ", done.stdout)
    defaults = ProbeSettings()
    assert f"(default: {', '.join(defaults.variants)})" in text and f"(default: {defaults.samples})" in text
    assert f"(default: {', '.join(map(str, defaults.densities))})" in text and "(default: paper)" in text


@pytest.mark.slow
def test_a_killed_probe_run_is_marked_failed_with_its_cause_at_the_next_start(tmp_path):
    """kill -9 leaves no chance to record why; the run stayed `running` for good. The next `probe` command of this
    host that writes (`probe run`) finds its process gone and marks it failed, saying so and how far it got; `probe
    list` and `probe show` say so and write nothing (a read never writes)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    db_path = tmp_path / "results.db"
    args = ["probe", "run", "--model", "tiny", *CELLS, "--samples", "200", "--db", str(db_path)]
    process = subprocess.Popen([sys.executable, "-m", "nexus_eval.cli", *args], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            time.sleep(0.5)
            if db_path.exists():
                database = connect(sqlite_url(db_path))
                try:
                    with database.session() as s:
                        from db.probes import list_probe_runs

                        runs = list_probe_runs(s)
                        if runs and runs[0].n_results >= 2:
                            run_id = runs[0].id
                            break
                finally:
                    database.dispose()
        else:
            pytest.fail("the probe run stored no results in 120 s")
    finally:
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
    run, _ = stored(sqlite_url(db_path), run_id)
    assert run.status == "running" and f"/{process.pid}/" in run.provenance["process"]  # hostname/pid/kernel
    listed = cli("probe", "list", "--db", str(db_path))
    assert listed.exit_code == 0 and "its process is gone" in listed.output, listed.output
    shown = cli("probe", "show", run_id, "--db", str(db_path))
    assert f"probe run {run_id}: its process is gone; the next" in shown.output
    assert stored(sqlite_url(db_path), run_id)[0].status == "running"  # a read never writes
    from nexus_eval.commands.probe import sweep_orphans

    database = connect(sqlite_url(db_path))
    sweep_orphans(database)  # what `probe run` does first
    database.dispose()
    run, rows = stored(sqlite_url(db_path), run_id)
    assert run.status == "failed" and run.finished_at is not None
    assert run.error.startswith(f"the process {run.provenance['process']} that ran it is gone")
    assert f"after {run.n_results} of {run.n_planned} results" in run.error and len(rows) == run.n_results
