"""The agent's container holds only the base commit (issue 33 item 8): `prepare_agent_sandbox` leaves no
later commit (the fix) reachable or present in /testbed/.git, whatever the image ships, and keeps HEAD,
the work tree, untracked and ignored files, and `Sandbox.snapshot`/`diff` as they were.

The mimic image is built FROM the local base image (no pull, no network) once per Dockerfile (cached by a
hash in its tag). Its /testbed/.git reaches a later "fix" commit through every door we know of: a branch,
a lightweight and an annotated tag, a remote-tracking ref, packed-refs, notes, a stash, the reflog and
ORIG_HEAD (a `reset --hard` back), FETCH_HEAD, a linked worktree, a replace ref and a graft that both
make the fix look like HEAD's history, an unreachable loose blob, and an alternate object store.
"""

from __future__ import annotations

import hashlib
import io
from types import SimpleNamespace

import pytest

from tests.conftest import TEST_JOB

pytestmark = pytest.mark.docker

MARK = "FIXMARKER_7f3a9c"  # appears only in the fix's content, messages and names, never in the base
BUILD = f"""\
set -eux
git init -q -b main /opt/other.git
cd /opt/other.git && echo 'alt {MARK}' > alt.txt && git add alt.txt && git commit -qm 'alt {MARK}'
git rev-parse HEAD > /opt/alt-sha
mkdir -p /testbed && cd /testbed && git init -q -b main
printf 'def f():\\n    return 1\\n' > mod.py && printf 'base readme\\n' > README
git add -A && git commit -qm 'base state'
git rev-parse HEAD > /opt/base-sha
printf 'def f():\\n    return 2  # {MARK}\\n' > mod.py && git commit -qam 'fix {MARK}'
git rev-parse HEAD > /opt/fix-sha
git branch fix-{MARK} && git tag v-{MARK} && git tag -a -m 'annotated {MARK}' va-{MARK}
git update-ref refs/remotes/origin/main HEAD
git notes add -m 'note {MARK}' HEAD~1
git worktree add -q --detach /opt/wt HEAD
git reset -q --hard HEAD~1
printf 'def f():\\n    return 9  # stash {MARK}\\n' > mod.py && git stash -q
echo "$(cat /opt/fix-sha)\\t\\tbranch 'main' of /elsewhere {MARK}" > .git/FETCH_HEAD
echo 'loose {MARK}' | git hash-object -w --stdin > /opt/loose-sha
git pack-refs --all && git repack -q -a -d
echo /opt/other.git/.git/objects > .git/objects/info/alternates
echo "$(cat /opt/base-sha) $(cat /opt/fix-sha)" > .git/info/grafts
git replace "$(cat /opt/base-sha)" "$(cat /opt/fix-sha)"
echo ignored.log >> .git/info/exclude
echo 'not tracked' > notes.txt && echo 'ignored' > ignored.log
"""
TREE_SUM = (
    "cd /testbed && find . -path ./.git -prune -o \\( -type f -o -type l \\) -print | LC_ALL=C sort "
    '| while read -r f; do printf \'%s \' "$f"; sha256sum < "$f"; done'
)


@pytest.fixture(scope="module")
def leaky_image(docker_client, base_image) -> str:
    dockerfile = f"FROM {base_image}\nCOPY build.sh /opt/build.sh\nRUN sh /opt/build.sh\n"
    key = hashlib.sha256((base_image + dockerfile + BUILD).encode()).hexdigest()[:16]
    tag = f"nexus-eval/test-repo-scrub:{key}"
    try:
        docker_client.images.get(tag)
        return tag
    except Exception:
        pass
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, text in (("Dockerfile", dockerfile), ("build.sh", BUILD)):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    buf.seek(0)
    docker_client.images.build(fileobj=buf, custom_context=True, tag=tag, rm=True, pull=False, network_mode="none")
    return tag


@pytest.fixture()
def leaky_box(docker_client, leaky_image):
    from env.sandbox.config import SandboxConfig
    from env.sandbox.container import Sandbox

    with Sandbox.start(leaky_image, config=SandboxConfig(), job=TEST_JOB, client=docker_client) as box:
        yield box


def shas(box) -> dict[str, str]:
    names = ("base", "fix", "loose", "alt")
    return {name: box.check(f"cat /opt/{name}-sha", workdir="/").strip() for name in names}


def test_mimic_image_leaks_the_fix_before_preparation(leaky_box):
    """The doors are really open in the image (so the test below proves something)."""
    ids = shas(leaky_box)
    log = leaky_box.run("git log --all --oneline", workdir="/testbed").output
    assert MARK in log
    assert leaky_box.run(f"git cat-file -p {ids['alt']}").exit_code == 0
    assert leaky_box.run(f"git cat-file -p {ids['loose']}").exit_code == 0
    assert MARK in leaky_box.run("git show HEAD").output  # the replace ref
    assert ids["fix"] in leaky_box.run("git reflog --no-abbrev").output


@pytest.mark.parametrize("kind", ["swebench", "r2e", "r2e_swebench", "local"])
def test_prepare_leaves_only_the_base_commit(leaky_box, kind):
    from env.tasks.layouts import prepare_agent_sandbox

    box = leaky_box
    ids = shas(box)
    tree_before = box.check(TREE_SUM)
    tree_id = prepare_agent_sandbox(box, SimpleNamespace(kind=kind))

    assert box.check("git rev-parse HEAD").strip() == ids["base"]
    assert box.check("git symbolic-ref HEAD").strip() == "refs/heads/main"
    assert box.check("git log --all --oneline --no-abbrev-commit").strip() == f"{ids['base']} base state"
    assert box.check("git for-each-ref").strip() == f"{ids['base']} commit\trefs/heads/main"
    assert box.check("git reflog --all && git reflog").strip() == ""
    assert box.check("git stash list").strip() == ""
    # nothing unreachable but what the snapshot itself wrote (its tree and the untracked files' blobs)
    snapshot_objects = {tree_id, *box.check(f"git ls-tree -r -t --format='%(objectname)' {tree_id}").split()}
    for command in ("git fsck --unreachable --no-reflogs --no-progress", "git fsck --lost-found --no-progress"):
        found = {line.split()[-1] for line in box.check(command).splitlines()}
        assert found <= snapshot_objects, (command, found)
    assert box.check("git worktree list --porcelain").count("worktree ") == 1
    for name in ("fix", "loose", "alt"):
        missing = box.run(f"git cat-file -p {ids[name]}")
        assert missing.exit_code != 0, (name, missing.output)
    grep = box.run(f"grep -r -a -l {MARK} .git; find .git -name '*{MARK}*'")
    assert grep.output.strip() == "", grep.output
    all_objects = box.check(
        "git cat-file --batch-all-objects --batch-check='%(objectname)' | git cat-file --batch | grep -a -c "
        f"{MARK} || true"
    )
    assert all_objects.strip() == "0"
    assert MARK not in box.check("git log --all -p --no-color") + box.check("git show HEAD")
    for path in ("objects/info/alternates", "info/grafts", "packed-refs", "FETCH_HEAD", "ORIG_HEAD", "logs"):
        assert not box.exists(f"/testbed/.git/{path}"), path

    # the work tree, untracked and ignored files are as they were; the index matches HEAD
    assert box.check(TREE_SUM) == tree_before
    assert box.check("git status --porcelain --ignored").splitlines() == ["?? notes.txt", "!! ignored.log"]
    assert box.check("git diff --stat HEAD").strip() == ""

    # snapshot / diff still give the agent's patch, and only it
    assert len(tree_id) == 40
    box.check("sed -i 's/return 1/return 3/' mod.py && echo 'new' > added.py")
    patch = box.diff()
    assert "-    return 1\n+    return 3\n" in patch
    assert "diff --git a/added.py b/added.py" in patch
    assert "notes.txt" not in patch and "ignored.log" not in patch and MARK not in patch
    assert patch.count("diff --git") == 2


def test_scrub_is_idempotent_and_keeps_a_root_commit(docker_client, base_image):
    """A repository of one root commit (local task images) is kept as it is, no shallow file; a second
    scrub changes nothing."""
    from env.sandbox.container import Sandbox
    from env.sandbox.repo_scrub import scrub_history

    with Sandbox.start(base_image, job=TEST_JOB, client=docker_client) as box:
        box.check("mkdir -p /testbed && git init -q && echo a > a.py && git add -A && git commit -qm base")
        head = box.check("git rev-parse HEAD").strip()
        assert head in scrub_history(box)
        assert head in scrub_history(box)
        assert box.check("git rev-parse HEAD").strip() == head
        assert not box.exists("/testbed/.git/shallow")
        assert box.check("git log --oneline --all").strip().endswith("base")
        assert box.check("ls -a /testbed").split() == [".", "..", ".git", "a.py"]
