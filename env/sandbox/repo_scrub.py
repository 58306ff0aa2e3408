"""Reduce the agent's repository to its base commit before the agent starts (issue 33 item 8).

Task images ship `/testbed/.git` as they were built: a SWE-bench image clones the whole upstream repository
and resets to the base commit, so later commits (the fix among them) can stay reachable through branches,
tags, remote refs, the reflog, stashes, `ORIG_HEAD`/`FETCH_HEAD`, `packed-refs`, or simply sit unreachable
in the packs (`git fsck --lost-found`, `git cat-file -p <sha>`); `objects/info/alternates` can point at
another object store. `scrub_history` makes all of that impossible, whatever the image holds, by building a
new `.git` rather than pruning the old one:

* a fresh repository (same object format) receives, in one pack written by `git pack-objects`, exactly
  HEAD's commit object and the trees and blobs of HEAD's tree, read through the old repository with
  replace refs and grafts switched off (objects found only through alternates are copied in too);
* HEAD's commit id stays the same: the commit object is copied byte for byte and, when it has parents, is
  marked shallow (`.git/shallow`, what `git clone --depth 1` writes), so no ancestor or later commit is
  reachable or present;
* HEAD is the same branch name (or detached at the same commit); no other ref, no reflog, no
  `packed-refs`, hooks, logs, `FETCH_HEAD`/`ORIG_HEAD`/`MERGE_HEAD`, stash, notes, replace refs, grafts,
  alternates, commit-graph, rerere or LFS store is carried over;
* kept: the config without its `remote.*` / `branch.*` sections and `extensions.partialclone`,
  `info/exclude`, `info/attributes`, `info/sparse-checkout` and `config.worktree` (they decide what is
  untracked, ignored or how files diff, so `Sandbox.snapshot`/`diff` see the tree as before), and
  `modules/` (submodule repositories, which their work trees point into);
* the index is rebuilt from HEAD (`read-tree` + `update-index --refresh`): the work tree and untracked
  files are never touched, only whether a change was staged is forgotten.

Why re-create rather than `git reflog expire --expire=now --all && git gc --prune=now`: gc keeps whatever
some ref, reflog, index entry, linked worktree or `.keep` pack still reaches, and rewrites the whole
history (minutes on 1 CPU for a SWE-bench-sized repository); copying one tree is proportional to the
checkout, not to the history (measured in docs/sandbox.md, "Repository history").

Everything happens in a new directory beside `.git`; the old `.git` is only removed once the new one is
complete (it is deleted, never renamed: renaming a lower-layer directory on overlayfs copies it whole).
"""

from __future__ import annotations

import shlex

from env.sandbox.config import SandboxError
from env.sandbox.container import Sandbox

REPO = "/testbed"

# POSIX sh (dash in Debian images); git >= 2.17. $1: the repository's work tree.
SCRUB_SCRIPT = r"""
set -eu
cd "$1"
# nothing in the image's environment may redirect our git commands to another repository or object store
unset GIT_DIR GIT_WORK_TREE GIT_INDEX_FILE GIT_OBJECT_DIRECTORY GIT_ALTERNATE_OBJECT_DIRECTORIES \
  GIT_COMMON_DIR GIT_NAMESPACE GIT_CEILING_DIRECTORIES GIT_REPLACE_REF_BASE GIT_CONFIG_PARAMETERS
export GIT_NO_REPLACE_OBJECTS=1 GIT_GRAFT_FILE=/nonexistent-nexus-grafts GIT_TERMINAL_PROMPT=0
if [ ! -e .git ]; then
  if top=$(git rev-parse --show-toplevel 2>/dev/null); then echo "nexus-scrub: $1 is inside $top"; exit 3; fi
  echo "nexus-scrub: no repository at $1, nothing to do"; exit 0
fi
top=$(git rev-parse --show-toplevel)
if [ "$top" != "$(pwd -P)" ]; then echo "nexus-scrub: $1 is not the top of its repository ($top)"; exit 3; fi
old=$(cd "$(git rev-parse --git-dir)" && pwd -P)
common=$(cd "$(git rev-parse --git-common-dir)" && pwd -P)
fmt=$(git rev-parse --show-object-format 2>/dev/null || echo sha1)
head=$(git rev-parse -q --verify 'HEAD^{commit}' || true)
branch=$(git symbolic-ref -q HEAD || true)
case "$branch" in refs/heads/?*) ;; *) branch="" ;; esac
work=$(mktemp -d "$1/.nexus-scrub.XXXXXX")
trap 'rm -rf "$work"' EXIT
new="$work/git"
if [ "$fmt" = sha1 ]; then git init -q --bare "$new"; else git init -q --bare --object-format="$fmt" "$new"; fi
rm -rf "$new/hooks" "$new/description" "$new/info"
mkdir -p "$new/hooks" "$new/info" "$new/objects/pack"
# the config, less what names other repositories or later history
if [ -f "$common/config" ]; then cp "$common/config" "$new/config"; fi
git config -f "$new/config" --name-only --list \
  | sed -n 's/^\(remote\|branch\)\.\(.*\)\.[^.]*$/\1.\2/p' | sort -u \
  | while IFS= read -r section; do git config -f "$new/config" --remove-section "$section" || true; done
git config -f "$new/config" --unset-all extensions.partialclone || true
git config -f "$new/config" core.bare false
# what decides untracked / ignored / how files diff, and submodule repositories their work trees point into
for f in info/exclude info/attributes; do
  if [ -f "$common/$f" ]; then cp "$common/$f" "$new/$f"; fi
done
for f in info/sparse-checkout config.worktree; do
  if [ -f "$old/$f" ]; then cp "$old/$f" "$new/$f"; fi
done
if [ -d "$common/modules" ]; then cp -a "$common/modules" "$new/modules"; fi
if [ -n "$head" ]; then
  # HEAD's commit, its tree and everything in it (--no-walk: no parent is read, so nothing else is listed)
  git rev-list --objects --no-walk "$head" > "$work/objects"
  git pack-objects -q --window=0 --depth=0 "$new/objects/pack/pack" < "$work/objects" > /dev/null
  if [ -n "$(git cat-file commit "$head" | sed -n '/^$/q;/^parent /p')" ]; then echo "$head" > "$new/shallow"; fi
fi
nolog="-c core.logallrefupdates=false"
if [ -n "$branch" ]; then
  git --git-dir="$new" symbolic-ref HEAD "$branch"
  if [ -n "$head" ]; then git $nolog --git-dir="$new" update-ref "$branch" "$head"; fi
elif [ -n "$head" ]; then
  git $nolog --git-dir="$new" update-ref --no-deref HEAD "$head"
fi
owner=$(stat -c %u:%g "$old" 2>/dev/null || true)
if [ "$(id -u)" = 0 ] && [ -n "$owner" ]; then chown -R "$owner" "$new"; fi
if [ ! -d .git ]; then echo "nexus-scrub: .git was a file; the store it named ($old) stays in the image"; fi
rm -rf .git
mv "$new" .git
if [ -n "$head" ]; then
  git read-tree "$head"
  git update-index -q --refresh > /dev/null || true
  test "$(git rev-parse HEAD)" = "$head"
  git fsck --connectivity-only --no-dangling --no-progress
fi
echo "nexus-scrub: kept ${head:-no commit} on ${branch:-a detached HEAD}"
"""


def scrub_history(box: Sandbox, repo: str = REPO, *, timeout: float = 600) -> str:
    """Reduce the repository at `repo` in `box` to HEAD's commit (see the module docstring); returns the
    script's report (what it kept, and any warning). Raises SandboxError with the output's tail on failure."""
    cmd = f"sh -c {shlex.quote(SCRUB_SCRIPT)} nexus-scrub {shlex.quote(repo)}"
    result = box.run(cmd, timeout=timeout, workdir="/")
    if result.exit_code != 0 or result.timed_out:
        why = "timed out" if result.timed_out else f"exit {result.exit_code}"
        raise SandboxError(f"reducing {repo}'s git history to its base commit failed ({why}): {result.output[-1500:]}")
    return result.output.strip()
