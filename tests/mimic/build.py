"""Build the mimic images offline from the base image (never a pull) and write the task rows for them.

`build_all(client)` returns a `Mimics` with the image tags and the rows of each flavour:
* `swebench_5x`: a SWE-bench 5.x row (its own `image`, `eval_script`, `log_parser`, `eval_type`), pytest;
* `swebench_classic`: a django-style classic row with no image field (its image is tagged with the name
  swebench derives, its eval script comes from swebench 4.1.0 at grading time);
* `r2e_swebench`: that row as R2E-Gym republishes it (`docker_image` slimshetty/..., /run_tests.sh baked in:
  the eval script of the row, as R2E's images carry);
* `r2e_native`: an R2E-Gym-native row (`repo_name`, `expected_output_json`, `[ISSUE]` tags).
Images are cached by a hash of these files and the base image id.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from env.tasks.images import BASE_IMAGE_TAG, _docker_build, image_exists, swebench_image_name
from tests.mimic import projects as p

HERE = Path(__file__).resolve().parent
COMMIT = "git -c user.name=mimic -c user.email=mimic@example.invalid commit -qm base"


def git_diff(path: str, old: str | None, new: str) -> str:
    """A `git diff`-style patch for one file (old None: a new file)."""
    header = f"diff --git a/{path} b/{path}\n" + ("new file mode 100644\n" if old is None else "")
    body = difflib.unified_diff(
        (old or "").splitlines(True), new.splitlines(True), "/dev/null" if old is None else f"a/{path}", f"b/{path}"
    )
    return header + "".join(body)


def _digest(client) -> str:
    h = hashlib.sha256(client.images.get(BASE_IMAGE_TAG).id.encode())
    for source in sorted(HERE.glob("*.py")):
        h.update(source.read_bytes())
    return h.hexdigest()[:16]


def _build(client, tag: str, files: dict[str, str], run: list[str], *, base: str = BASE_IMAGE_TAG) -> None:
    if image_exists(client, tag):
        return
    with tempfile.TemporaryDirectory(prefix="nexus-mimic-") as ctx:
        for rel, text in files.items():
            target = Path(ctx, "root", rel)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
        copy = "COPY root/ /\n" if files else ""
        steps = "".join(f"RUN {line}\n" for line in run)
        Path(ctx, "Dockerfile").write_text(f"FROM {base}\n{copy}{steps}WORKDIR /testbed\n")
        _docker_build(client, ctx, tag, network_mode="none", what=f"mimic image {tag}")


def _head(client, image: str) -> str:
    out = client.containers.run(image, ["git", "-C", "/testbed", "rev-parse", "HEAD"], remove=True, network_mode="none")
    return out.decode().strip()


@dataclass
class Mimics:
    rows: dict[str, dict] = field(default_factory=dict)
    images: dict[str, str] = field(default_factory=dict)
    patches: dict[str, dict[str, str]] = field(default_factory=dict)


def _official(client, digest: str, m: Mimics) -> str:
    tag = f"nexus-eval/mimic-official:{digest}"
    commit = ["cd /testbed && git init -q && git add -A && " + COMMIT]
    _build(client, tag, p.OFFICIAL_FILES, p.OFFICIAL_SETUP + commit)
    base = _head(client, tag)
    text_path, test_path = "textkit/text.py", "tests/utils_tests/test_text.py"
    new_test = p.TEST_TEXT.replace("import upper", "import truncate_words, upper") + (
        "\n    def test_truncate_words(self):\n        self.assertEqual(truncate_words('a b c', 2), 'a b')\n"
    )
    fixed = p.TEXTKIT_TEXT.replace("words[:count - 1]", "words[:count]")
    skipping = p.TEXTKIT_TEXT.replace(
        "    words = text.split()\n", "    import unittest\n    raise unittest.SkipTest('skipped by the patch')\n"
    )
    forge = "import atexit\n\natexit.register(print, 'test_truncate_words (utils_tests.test_text.TextTests) ... ok')\n"
    classic = {
        "instance_id": "django__django-99001",
        "repo": "django/django",
        "version": "3.0",
        "base_commit": base,
        "environment_setup_commit": base,
        "problem_statement": "truncate_words('a b c', 2) returns 'a' instead of 'a b'.",
        "hints_text": "",
        "created_at": "2026-12-03T00:00:00Z",
        "patch": git_diff(text_path, p.TEXTKIT_TEXT, fixed),
        "test_patch": git_diff(test_path, p.TEST_TEXT, new_test),
        "FAIL_TO_PASS": json.dumps(["test_truncate_words (utils_tests.test_text.TextTests)"]),
        "PASS_TO_PASS": json.dumps(["test_upper (utils_tests.test_text.TextTests)"]),
    }
    client.images.get(tag).tag(*swebench_image_name(classic["instance_id"]).split(":"))
    m.rows["swebench_classic"] = classic
    m.patches["swebench_classic"] = {
        "gold": classic["patch"],
        "skip": git_diff(text_path, p.TEXTKIT_TEXT, skipping),
        "forge": git_diff("textkit/__init__.py", "", forge),
    }

    slug_test = p.TEST_SLUG + "\n\ndef test_slug_collapses_spaces():\n    assert slugify('a  b') == 'a-b'\n"
    test_patch = git_diff("tests/test_slug.py", p.TEST_SLUG, slug_test)
    eval_script = "\n".join(
        [
            "#!/bin/bash",
            "set -uxo pipefail",
            "source /opt/miniconda3/bin/activate",
            "conda activate testbed",
            "cd /testbed",
            "git config --global --add safe.directory /testbed",
            "python -m pip install -e .",
            f"git checkout {base} tests/test_slug.py",
            "git apply -v - <<'EOF_114329324912'",
            test_patch.rstrip("\n"),
            "EOF_114329324912",
            ": '>>>>> Start Test Output'",
            "pytest -rA tests/test_slug.py",
            ": '>>>>> End Test Output'",
            f"git checkout {base} tests/test_slug.py",
        ]
    )
    image_5x = "nexus-mimic/sweb.eval.x86_64.textkit-2:latest"
    client.images.get(tag).tag(*image_5x.split(":"))
    fixed_slug = p.TEXTKIT_TEXT.replace('"-".join(text.lower().split(" "))', '"-".join(text.lower().split())')
    m.rows["swebench_5x"] = {
        **{k: classic[k] for k in ("base_commit", "environment_setup_commit", "hints_text", "created_at")},
        "instance_id": "nexus-mimic__textkit-2",
        "repo": "nexus-mimic/textkit",
        "version": "0.1",
        "problem_statement": "slugify('a  b') gives 'a--b'.",
        "patch": git_diff(text_path, p.TEXTKIT_TEXT, fixed_slug),
        "test_patch": test_patch,
        "FAIL_TO_PASS": ["tests/test_slug.py::test_slug_collapses_spaces"],
        "PASS_TO_PASS": ["tests/test_slug.py::test_slug_lowercases"],
        "image": image_5x,
        "eval_script": eval_script + "\n",
        "log_parser": "parse_log_pytest",
        "eval_type": "pass_and_fail",
    }
    m.patches["swebench_5x"] = {"gold": m.rows["swebench_5x"]["patch"]}
    m.images["official"] = tag
    return tag


def _r2e_swebench(client, digest: str, official: str, m: Mimics) -> None:
    from env.tasks.swebench_legacy import convert_classic_rows

    classic = m.rows["swebench_classic"]
    converted = convert_classic_rows([classic])
    assert not converted.errors, converted.errors
    tag = f"nexus-eval/mimic-r2e-swebench:{digest}"
    _build(client, tag, {"run_tests.sh": converted.rows[0]["eval_script"]}, ["chmod +x /run_tests.sh"], base=official)
    docker_image = f"slimshetty/swebench-verified:sweb.eval.x86_64.{classic['instance_id']}"
    client.images.get(tag).tag(*docker_image.split(":"))
    m.rows["r2e_swebench"] = {**classic, "docker_image": docker_image, "parsed_commit": "{}"}
    m.patches["r2e_swebench"] = m.patches["swebench_classic"]
    m.images["r2e_swebench"] = tag


def _r2e_native(client, digest: str, m: Mimics) -> None:
    tag = f"nexus-eval/mimic-r2e-native:{digest}"
    commit = ["cd /testbed && git init -q && git add -A && " + COMMIT]
    _build(client, tag, p.R2E_NATIVE_FILES, commit + p.R2E_NATIVE_SETUP)
    head = _head(client, tag)
    docker_image = f"namanjain12/calcpkg_final:{head}"
    client.images.get(tag).tag(*docker_image.split(":"))
    fixed = p.R2E_OPS.replace("def mul(a, b):\n    return a + b", "def mul(a, b):\n    return a * b")
    m.rows["r2e_native"] = {
        "repo_name": "calcpkg",
        "docker_image": docker_image,
        "commit_hash": head,
        "parsed_commit_content": json.dumps({"old_commit_hash": head, "file_diffs": []}),
        "problem_statement": "Preamble the agent never sees.\n[ISSUE]\nmul(2, 3) returns 5.\n[/ISSUE]",
        "expected_output_json": json.dumps(p.R2E_EXPECTED),
        "patch": git_diff("calcpkg/ops.py", p.R2E_OPS, fixed),
    }
    m.patches["r2e_native"] = {
        "gold": m.rows["r2e_native"]["patch"],
        "overfix": git_diff("calcpkg/ops.py", p.R2E_OPS, fixed.replace("    return a\n", "    return -a\n")),
    }
    m.images["r2e_native"] = tag


def build_all(client) -> Mimics:
    digest = _digest(client)
    m = Mimics()
    official = _official(client, digest, m)
    _r2e_swebench(client, digest, official, m)
    _r2e_native(client, digest, m)
    return m
