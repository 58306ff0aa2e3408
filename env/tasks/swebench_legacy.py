"""Classic SWE-bench rows under swebench 5.x, through the legacy swebench releases in their own venvs.

swebench 5.x (the project's dependency) grades a row only if it carries `image`, `eval_script`, `log_parser` and
`eval_type`; classic rows (SWE-bench_Verified style) do not. swebench 4.1.0 and 3.0.2 still build those from a
classic row, but share the package name with 5.x, so each lives in its own venv, built on first use:

    legacy_python("4.1.0")          # $NEXUS_EVAL_SWEBENCH_VENVS/4.1.0/bin/python (default ~/.cache/nexus-eval/swebench)
    convert_classic_rows(rows)      # + eval_script, log_parser, eval_type, image: what 4.1.0's make_test_spec gives
    r2e_swebench_verdict(row, log)  # R2E-Gym's in-loop SWE-bench reward, on swebench 3.0.2 (R2E-Gym's pin)

Each call runs ONE subprocess in the legacy venv (`env/tasks/swebench_legacy_worker.py`, JSON in and out).
Conversions are cached on disk ($NEXUS_EVAL_SWEBENCH_CACHE, default ~/.cache/nexus-eval/swebench/converted),
keyed by the fields 4.1.0 reads, the namespace/arch, both swebench versions and the worker's source.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from importlib.metadata import version as installed_version
from pathlib import Path
from typing import Any

LEGACY_VERSIONS = ("3.0.2", "4.1.0")
CONVERT_VERSION = "4.1.0"
VERDICT_VERSION = "3.0.2"
VENVS_ENV = "NEXUS_EVAL_SWEBENCH_VENVS"
CACHE_ENV = "NEXUS_EVAL_SWEBENCH_CACHE"
DEFAULT_ROOT = Path("~/.cache/nexus-eval/swebench")
WORKER = Path(__file__).with_name("swebench_legacy_worker.py")
READY_MARKER = ".nexus-eval-swebench"  # written last, holds the version: a venv without it is rebuilt
# the only fields the worker sends to swebench (so they are also the whole cache key, with the versions)
ROW_FIELDS = (
    "instance_id",
    "repo",
    "version",
    "base_commit",
    "test_patch",
    "FAIL_TO_PASS",
    "PASS_TO_PASS",
    "environment_setup_commit",
    "image_assets",
)
ADDED_FIELDS = ("eval_script", "log_parser", "eval_type", "image")
R2E_SWEBENCH_TOOL = f"r2e-gym docker.py semantics on swebench=={VERDICT_VERSION}"


class LegacySwebenchError(RuntimeError):
    """A legacy swebench venv cannot be built or used; the message says what to do by hand."""


@dataclass
class ConversionError:
    index: int  # position in the input
    instance_id: str | None
    reason: str


@dataclass
class ConversionResult:
    rows: list[dict[str, Any]]  # converted (and passed-through) rows, in input order, failed ones left out
    errors: list[ConversionError] = field(default_factory=list)
    cached: int = 0  # rows answered from the disk cache
    passed_through: int = 0  # rows that already carried an eval_script


# --- venvs -------------------------------------------------------------------------------------------------------


def venvs_root() -> Path:
    return Path(os.environ.get(VENVS_ENV) or DEFAULT_ROOT).expanduser()


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or DEFAULT_ROOT / "converted").expanduser()


def _check_version(version: str) -> None:
    if version not in LEGACY_VERSIONS:
        raise LegacySwebenchError(
            f"swebench {version!r} is not supported here; use one of {', '.join(LEGACY_VERSIONS)}"
        )


def venv_ready(version: str) -> bool:
    """The venv for `version` was built completely (cheap: no interpreter is started)."""
    venv = venvs_root() / version
    marker = venv / READY_MARKER
    return (venv / "bin" / "python").exists() and marker.is_file() and marker.read_text().strip() == version


@contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # a second process waits here, then finds the venv ready
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def legacy_python(version: str) -> Path:
    """The interpreter of a venv holding exactly `swebench==version`, built on first use (about 30 s)."""
    _check_version(version)
    venv = venvs_root() / version
    if not venv_ready(version):
        try:
            with _locked(venvs_root() / f".{version}.lock"):
                if not venv_ready(version):
                    _build_venv(venv, version)
        except OSError as exc:  # e.g. the folder is not writable: say where, and how to point elsewhere
            message = f"cannot build the swebench {version} venv at {venv}: {exc} (set ${VENVS_ENV})"
            raise LegacySwebenchError(message) from None
    return venv / "bin" / "python"


def _build_venv(venv: Path, version: str) -> None:
    from rich.console import Console

    console = Console(stderr=True)
    by_hand = f"{sys.executable} -m venv {venv} && {venv}/bin/python -m pip install swebench=={version}"
    python = str(venv / "bin" / "python")
    check = f"import importlib.metadata as m; assert m.version('swebench') == {version!r}"
    started = time.monotonic()
    shutil.rmtree(venv, ignore_errors=True)  # a half-built one from an interrupted run
    with console.status(f"building a venv with swebench=={version} at {venv} (once, about 30 s)"):
        steps = (
            [sys.executable, "-m", "venv", str(venv)],
            [python, "-m", "pip", "install", "-q", f"swebench=={version}"],
            [python, "-c", check],
        )
        for step in steps:
            try:
                proc = subprocess.run(step, capture_output=True, text=True, timeout=1800)
            except (OSError, subprocess.TimeoutExpired) as exc:
                message = f"could not build the swebench {version} venv: {exc}\nbuild it by hand: {by_hand}"
                raise LegacySwebenchError(message) from None
            if proc.returncode != 0:
                said = (proc.stdout + proc.stderr).strip()[-3000:]
                raise LegacySwebenchError(
                    f"could not build the swebench {version} venv at {venv}; `{' '.join(step)}` failed:\n{said}\n"
                    f"fix the cause and build it by hand: {by_hand}"
                )
    (venv / READY_MARKER).write_text(version)
    console.print(f"built swebench=={version} at {venv} in {time.monotonic() - started:.0f} s", highlight=False)


# --- the worker --------------------------------------------------------------------------------------------------


def _worker(version: str, request: dict, on_answer: Callable[[dict], None] | None = None) -> list[dict]:
    """Run the worker once in the `version` venv; its answers (one per item, in order)."""
    python = legacy_python(version)
    payload = json.dumps({**request, "expect": version}, default=str)
    answers: list[dict] = []
    # stderr goes to a file: a chatty worker must never block on a full pipe while we read its answers
    with tempfile.TemporaryFile("w+") as errors:
        proc = subprocess.Popen(
            [str(python), "-I", str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors, text=True
        )
        assert proc.stdin and proc.stdout
        try:
            proc.stdin.write(payload)  # the worker reads all of it before it answers
            proc.stdin.close()
            for line in proc.stdout:  # streamed, so a caller can show progress row by row
                answers.append(json.loads(line))
                if on_answer:
                    on_answer(answers[-1])
        except BaseException:
            proc.kill()
            raise
        finally:
            proc.wait()
        errors.seek(0)
        said = errors.read()[-3000:]
    if proc.returncode != 0 or len(answers) != len(request["items"]):
        raise LegacySwebenchError(f"the swebench {version} worker failed (exit {proc.returncode}):\n{said}")
    return answers


def _worker_row(row: dict) -> dict:
    return {key: row[key] for key in ROW_FIELDS if key in row}


@cache
def _worker_digest() -> str:
    return hashlib.sha256(WORKER.read_bytes()).hexdigest()


def _cache_key(row: dict, namespace: str | None, arch: str) -> str:
    ident = {
        "row": _worker_row(row),
        "namespace": namespace,
        "arch": arch,
        "legacy": CONVERT_VERSION,
        "swebench": installed_version("swebench"),  # the registry the parser name was checked against
        "worker": _worker_digest(),
    }
    return hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()


def _parser_problem(name: str) -> str | None:
    from swebench.harness.log_parsers import PARSER_REGISTRY

    if name in PARSER_REGISTRY:
        return None
    here = installed_version("swebench")
    return f"log parser {name!r} (from swebench {CONVERT_VERSION}) is not in swebench {here}'s PARSER_REGISTRY"


# --- public API --------------------------------------------------------------------------------------------------


def convert_classic_rows(
    rows: list[dict],
    *,
    namespace: str | None = "swebench",
    arch: str = "x86_64",
    cache_dir: Path | None = None,
    on_row: Callable[[int, bool], None] | None = None,
) -> ConversionResult:
    """Each classic row plus `eval_script`, `log_parser`, `eval_type`, `image` and `converted_by`, exactly as
    swebench 4.1.0's `make_test_spec(row, namespace=..., arch=...)` computes them (`namespace=None`: a local
    image name). Rows that already carry an `eval_script` pass through unchanged. A row 4.1.0 cannot handle is
    reported in `errors` and the others still convert. `on_row(index, ok)` is called once per row."""
    store = Path(cache_dir) if cache_dir is not None else cache_root()
    done: dict[int, dict] = {}
    result = ConversionResult(rows=[])
    todo: list[tuple[int, str]] = []  # (index, cache key)
    for index, row in enumerate(rows):
        if row.get("eval_script"):
            done[index] = row
            result.passed_through += 1
            if on_row:
                on_row(index, True)
            continue
        key = _cache_key(row, namespace, arch)
        hit = store / key[:2] / f"{key}.json"
        if hit.is_file():
            done[index] = {**row, **json.loads(hit.read_text())}
            result.cached += 1
            if on_row:
                on_row(index, True)
        else:
            todo.append((index, key))

    def answered(answer: dict) -> None:
        index, key = todo[answer["index"]]
        reason = answer.get("error") or _parser_problem(answer["ok"]["log_parser"])
        if reason:
            result.errors.append(ConversionError(index, rows[index].get("instance_id"), reason))
        else:
            added = {**{k: answer["ok"][k] for k in ADDED_FIELDS}, "converted_by": f"swebench=={CONVERT_VERSION}"}
            path = store / key[:2] / f"{key}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps(added))
            os.replace(tmp, path)
            done[index] = {**rows[index], **added}
        if on_row:
            on_row(index, not reason)

    if todo:
        request = {"task": "convert", "namespace": namespace, "arch": arch}
        request["items"] = [_worker_row(rows[index]) for index, _ in todo]
        _worker(CONVERT_VERSION, request, answered)
    result.rows = [done[i] for i in sorted(done)]
    result.errors.sort(key=lambda e: e.index)
    return result


def r2e_swebench_verdicts(items: list[tuple[dict, str]]) -> list[dict]:
    """`r2e_swebench_verdict` for many (row, log text) pairs in one subprocess. A row swebench 3.0.2 cannot
    handle gives `{"found": False, "resolved": False, "error": reason, ...}` instead of raising."""
    request = {"task": "verdict", "items": [{"row": _worker_row(row), "log": log} for row, log in items]}
    out = []
    for answer in _worker(VERDICT_VERSION, request) if items else []:
        verdict = answer.get("ok") or {"found": False, "status_map": {}, "report": {}, "resolved": False}
        if "error" in answer:
            verdict["error"] = answer["error"]
        out.append({**verdict, "tool": R2E_SWEBENCH_TOOL})
    return out


def r2e_swebench_verdict(row: dict, log_text: str) -> dict:
    """R2E-Gym's in-loop reward for a classic SWE-bench row's test log (its `get_logs_eval` +
    `_calculate_reward_swebench`, on swebench 3.0.2): `{"found", "bad_markers", "status_map", "report",
    "resolved", "tool"}`. Raises LegacySwebenchError if 3.0.2 cannot handle the row."""
    (verdict,) = r2e_swebench_verdicts([(row, log_text)])
    if "error" in verdict:
        raise LegacySwebenchError(f"{row.get('instance_id')}: {verdict['error']}")
    return verdict
