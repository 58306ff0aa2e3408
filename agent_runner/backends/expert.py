"""ExpertModel: a deterministic stand-in for a capable coding agent, solving a task through the agent's tools.

Like the ``oracle`` test double it knows the task's gold patch (``task.patch``), but it applies it the way an
agent would, one tool call per turn in the real R2E text format (``<think>`` + ``<function=...>``), with every
observation coming from the container. Its trajectories are teacher-forced through a language model later, to
score whether a KV-cache eviction method kept what the agent must COPY: a ``str_replace`` ``old_str`` repeats,
character for character, lines of a file viewed turns earlier.

The steps of an episode (each is one turn; each decision is made from the task and the observations so far):

1. **search** ``/testbed`` for a symbol of the gold patch (a function named in a hunk header, else a class,
   else an identifier of the removed lines; ``expert_exploration.search_symbol``);
2. **list** the Python files of the directories the patches touch, with their sizes (``execute_bash``:
   ``find ... | xargs wc -l -c``), so every view below is sized before it is made;
3. **view** each file the gold patch edits: whole (``view_range [1, -1]``) when its output fits file_editor's
   10,000-character clip, else a window around each hunk (margin ``WINDOW_MARGIN`` lines). The file's lines are
   read back from the observation (R2E's ``f"{n:6d} "`` prefix stripped);
4. **explore** (``ExpertConfig``): whole views of related files, in this order: existing test files of the
   edited modules, modules they import from their package, neighbours in their directory, the other listed test
   files; until the observations so far total ``explore_chars`` characters, never adding a view that would push
   them past ``max_chars``; ``explore_chars=0`` disables it;
5. **reproduce**: the test patch's new files are written with ``create``, the test files it modifies get its
   hunks through ``str_replace`` (viewed first if they were not); then ``python -m pytest -q <FAIL_TO_PASS>``;
6. **edit**: one ``str_replace`` per gold hunk, its ``old_str`` copied from the viewed lines: the smallest
   context around the hunk's changed lines (one line more above, then below, alternately) that is unique in the
   file as known (viewed, with this episode's edits applied) AFTER the parser strips it, and whose replacement
   by the stripped ``new_str`` gives exactly the patched lines (``expert_plan.edit_candidates``). A pure
   insertion without such a context uses ``insert``; a new file ``create``, a deleted one ``rm``. When the
   editor answers that the context is not unique (a file seen only in windows), the next wider context is sent;
7. **verify and clean up**: the tests again, then the reproduction files are removed (``rm -f``) or restored
   (``git checkout --``) so the patch is only the fix, then ``finish``.

Thoughts are short and neutral and never quote code (no line an ``old_str`` will copy appears in them). When
an action cannot be derived (a binary patch, a non-Python file to edit, a hunk not in the viewed content, an
editor refusal) ``complete`` raises ModelError saying exactly why; the loop records it as the episode's error.
Asked for a turn after ``finish``, it raises ModelError too. Telemetry is whitespace-word counts, like the
oracle. The same task gives the same trajectory.
"""

from __future__ import annotations

import posixpath
import shlex
from collections.abc import Generator
from typing import Any

from agent_runner.backend_settings import ExpertConfig
from agent_runner.backends import ModelError, stand_in_completion
from agent_runner.backends.expert_diffs import EditError, FilePatch, Hunk, parse_patch
from agent_runner.backends.expert_exploration import package_imports, parse_view, parse_wc, search_symbol
from agent_runner.backends.expert_plan import FileText, edit_candidates, emittable, locate
from agent_runner.parsing import parse_response
from agent_runner.records import Completion, Message

TESTBED = "/testbed"
#: file_editor's clip (MAX_RESPONSE_LEN) and the header of a file view (env/sandbox/tool_scripts/file_editor.py)
VIEW_LIMIT = 10000
VIEW_HEADER = "Here's the result of running `cat -n` on the file: {path}:\n"
#: what an observation adds around the tool's output: "Execution output of [...]:" and the step-budget line
OBSERVATION_OVERHEAD = 80
#: lines shown above and below a hunk when its file is viewed in windows
WINDOW_MARGIN = 20

THOUGHTS = {
    "search": "Find where the code this issue is about lives.",
    "list": "List the Python files nearby with their sizes before opening any.",
    "sizes": "Check the size of the file before opening it.",
    "view": "Open the file that needs the change.",
    "window": "The file is long, so open the part around the code to change.",
    "view_again": "Part of the code to change was not shown; open that part.",
    "explore_test": "Read the existing tests of this module.",
    "explore_import": "Read a module this code depends on.",
    "explore_neighbour": "Read a neighbouring module for more context.",
    "explore_other": "Read another test file to see how tests are written here.",
    "view_test": "Open the test file the new tests go into.",
    "create_test": "Write the new tests to a file to reproduce the issue.",
    "edit_test": "Add the new tests to the existing test file.",
    "run": "Run the failing tests to see the error.",
    "mkdir": "Create the directory the new file goes into.",
    "create": "Create the new file.",
    "delete": "Delete the file that is no longer needed.",
    "rename": "Move the file to its new place.",
    "edit_first": "Apply the first change.",
    "edit_next": "Apply the next change.",
    "widen": "That context is not unique in the file; widen it.",
    "run_again": "Run the tests again to check the fix.",
    "cleanup": "Remove the reproduction changes so that only the fix remains.",
    "finish": "The fix is in place; submit it.",
}


def view_size(path: str, lines: int, nbytes: int) -> int:
    """An upper bound on a whole-file view's output (header + one prefixed line per file line)."""
    return len(VIEW_HEADER.format(path=f"{TESTBED}/{path}")) + nbytes + 7 * (lines + 1)


def test_command(task: Any, tests: list[FilePatch]) -> str | None:
    """``python -m pytest -q`` on the FAIL_TO_PASS ids (pytest node ids), else on the test patch's files."""
    ids = [str(i) for i in getattr(task, "FAIL_TO_PASS", None) or []]
    if not (ids and all("::" in i or i.endswith(".py") for i in ids)):
        ids = sorted({fp.path for fp in tests if fp.kind != "deleted" and fp.path.endswith(".py")})
    if not ids:
        return None
    return f"cd {TESTBED} && python -m pytest -q " + " ".join(shlex.quote(i) for i in ids)


def _dir(path: str) -> str:
    return posixpath.dirname(path) or "."


def _is_test(path: str) -> bool:
    parts = path.split("/")
    return parts[-1].startswith("test") or parts[-1].endswith("_test.py") or "tests" in parts[:-1]


def _excerpt(text: str) -> str:
    return text if len(text) <= 400 else text[:400] + "..."


class ExpertModel:
    """Solves ``task`` (its ``patch`` and ``test_patch``) through the agent's tools; see the module docstring."""

    def __init__(self, task: Any = None, *, config: ExpertConfig | None = None) -> None:
        if task is None or not getattr(task, "patch", None):
            raise ValueError("ExpertModel needs task= with a gold patch (task.patch)")
        self.task = task
        self.config = config or ExpertConfig()
        self.reset(seed=0)

    def reset(self, *, seed: int) -> None:
        self.observations: list[str] = []
        self.obs_chars = 0
        self._steps: Generator[str, str, None] | None = None
        self._ended: str | None = None
        self._turn = 0
        self._known: dict[str, FileText] = {}  # path -> what the views showed of it (and this episode's edits)
        self._sizes: dict[str, tuple[int, int]] = {}  # path -> (lines, bytes) from wc
        self._dirs: set[str] = {"."}  # folders known to exist

    # -- the Model protocol ------------------------------------------------------------------------------------

    def complete(self, messages: list[Message], *, max_new_tokens: int | None = None) -> Completion:
        if self._ended is not None:
            raise ModelError(f"ExpertModel: asked for turn {self._turn + 1} but {self._ended}")
        try:
            if self._steps is None:
                self._steps = self._episode()
                text = next(self._steps)
            else:
                observation = messages[-1].content
                self.observations.append(observation)
                self.obs_chars += len(observation)
                text = self._steps.send(observation)
        except StopIteration:
            self._ended = f"it submitted at turn {self._turn}"
            raise ModelError(f"ExpertModel: asked for turn {self._turn + 1} but {self._ended}") from None
        except EditError as exc:
            self._ended = f"it failed at turn {self._turn + 1}: {exc}"
            raise ModelError(f"ExpertModel ({getattr(self.task, 'instance_id', '?')}): {exc}") from exc
        self._turn += 1
        return stand_in_completion(text, messages)

    # -- one action ------------------------------------------------------------------------------------------

    @staticmethod
    def _act(thought: str, name: str, **params: str) -> str:
        """The completion text of one call; checked to parse back to exactly these parameters."""
        body = "".join(f"<parameter={key}>{value}</parameter>\n" for key, value in params.items())
        text = f"<think>\n{thought}\n</think>\n\n<function={name}>\n{body}</function>"
        parsed = parse_response(text)
        if parsed.call is None or parsed.call.name != name or parsed.call.arguments != params:
            raise EditError(f"the {name} call does not survive the parser (a value with surrounding whitespace?)")
        return text

    # -- the episode -----------------------------------------------------------------------------------------

    def _episode(self) -> Generator[str, str, None]:
        gold = parse_patch(self.task.patch)
        tests = parse_patch(getattr(self.task, "test_patch", "") or "")
        self._check(gold)

        yield self._act(THOUGHTS["search"], "search", search_term=search_symbol(gold), path=TESTBED)
        known = [p for fp in gold if fp.kind != "added" for p in (fp.old_path, fp.new_path)]  # not the new folders
        dirs = sorted({_dir(p) for p in known + [fp.path for fp in tests] if p})
        listing = (
            f"cd {TESTBED} && find {' '.join(shlex.quote(d) for d in dirs)} -maxdepth 1 -name '*.py' "
            "| sort | xargs -r wc -l -c"
        )
        self._learn_sizes((yield self._act(THOUGHTS["list"], "execute_bash", cmd=listing)))

        edited = [fp for fp in gold if fp.kind in ("modified", "renamed") and fp.hunks]
        yield from self._ensure_sizes([fp.old_path for fp in edited])
        for fp in edited:
            yield from self._view_for_edit(fp.old_path, fp.hunks)
        yield from self._explore([fp.old_path for fp in edited])

        created, restored = yield from self._reproduce(tests)
        command = test_command(self.task, tests)
        if command is not None:
            yield self._act(THOUGHTS["run"], "execute_bash", cmd=command)

        for index, fp in enumerate(gold):
            yield from self._apply_file(fp, index == 0)

        if command is not None:
            yield self._act(THOUGHTS["run_again"], "execute_bash", cmd=command)
        cleanup = []
        if created:
            cleanup.append("rm -f " + " ".join(shlex.quote(p) for p in created))
        if restored:
            cleanup.append("git checkout -- " + " ".join(shlex.quote(p) for p in restored))
        if cleanup:
            yield self._act(THOUGHTS["cleanup"], "execute_bash", cmd=f"cd {TESTBED} && " + " && ".join(cleanup))
        yield self._act(THOUGHTS["finish"], "finish", command="submit")

    @staticmethod
    def _check(gold: list[FilePatch]) -> None:
        """Refuse, before the first turn, a gold patch the tools cannot apply."""
        if not gold:
            raise EditError("the gold patch holds no file diff")
        for fp in gold:
            if fp.binary:
                raise EditError(f"{fp.path}: a binary patch, which file_editor cannot write")
            if fp.kind in ("modified", "renamed") and fp.hunks and not fp.old_path.endswith(".py"):  # type: ignore[union-attr]
                raise EditError(
                    f"{fp.old_path}: not a .py file; file_editor refuses to view it, so no old_str can be copied"
                )

    # -- sizes and views -------------------------------------------------------------------------------------

    def _learn_sizes(self, observation: str) -> None:
        sizes = parse_wc(observation)
        self._sizes.update(sizes)
        self._dirs.update(_dir(p) for p in sizes)

    def _ensure_sizes(self, paths: list[str]) -> Generator[str, str, None]:
        """One ``wc`` turn for files the listing did not show (its output was cut in the middle)."""
        missing = [p for p in dict.fromkeys(paths) if p not in self._sizes]
        if not missing:
            return
        files = " ".join(shlex.quote(p) for p in missing)
        self._learn_sizes((yield self._act(THOUGHTS["sizes"], "execute_bash", cmd=f"cd {TESTBED} && wc -l -c {files}")))
        unknown = [p for p in missing if p not in self._sizes]
        if unknown:
            raise EditError(f"wc printed no size for {', '.join(unknown)}, so it cannot be viewed safely")

    def _view(self, path: str, thought: str, first: int = 1, last: int = -1) -> Generator[str, str, None]:
        observation = yield self._act(
            thought, "file_editor", command="view", path=f"{TESTBED}/{path}", view_range=f"[{first}, {last}]"
        )
        lines = parse_view(observation, first)
        if not lines:
            raise EditError(f"viewing lines {first} to {last} of {path} showed no line: {_excerpt(observation)!r}")
        self._known.setdefault(path, FileText(self._sizes.get(path, (0, 0))[0])).learn(first, lines)

    def _view_for_edit(self, path: str, hunks: tuple[Hunk, ...], thought: str = "view") -> Generator[str, str, None]:
        """View ``path`` whole if that fits the clip, else a window around each hunk; then view again around a
        hunk whose lines are still unknown (the view was cut short)."""
        lines, nbytes = self._sizes[path]
        if nbytes == 0:
            self._known.setdefault(path, FileText(0))
        elif path not in self._known and view_size(path, lines, nbytes) <= VIEW_LIMIT:
            yield from self._view(path, THOUGHTS[thought])
        elif path not in self._known:
            per_line = 8 + nbytes / max(lines, 1)
            cap = max(10, int((VIEW_LIMIT - 200) / per_line))
            windows: list[list[int]] = []
            for hunk in hunks:
                start = max(1, hunk.old_start - WINDOW_MARGIN)
                end = hunk.old_start + max(hunk.old_len, 1) - 1 + WINDOW_MARGIN
                if windows and start <= windows[-1][1] + 1:
                    windows[-1][1] = max(windows[-1][1], end)
                else:
                    windows.append([start, end])
            for start, end in windows:
                for first in range(start, end + 1, cap):
                    last = min(end, first + cap - 1)
                    yield from self._view(path, THOUGHTS["window"], first, -1 if last >= lines else last)
                    if last >= lines:
                        break
        known = self._known[path]
        for hunk in hunks:
            at = hunk.old_start - 1 if hunk.old_len else hunk.old_start
            if hunk.old_len and not known.known(at, at + hunk.old_len):
                total = max(lines, len(known.lines))
                last = hunk.old_start + hunk.old_len + 4
                yield from self._view(path, THOUGHTS["view_again"], max(1, at - 4), -1 if last >= total else last)

    def _explore(self, edited: list[str]) -> Generator[str, str, None]:
        config = self.config
        if config.explore_chars == 0:
            return
        for path, kind in self._exploration_order(edited):
            if self.obs_chars >= config.explore_chars:
                return
            lines, nbytes = self._sizes[path]
            size = view_size(path, lines, nbytes)
            if nbytes == 0 or size > VIEW_LIMIT or self.obs_chars + size + OBSERVATION_OVERHEAD > config.max_chars:
                continue
            yield from self._view(path, THOUGHTS[kind])

    def _exploration_order(self, edited: list[str]) -> list[tuple[str, str]]:
        """Related files not viewed yet, in a fixed order: tests of the edited modules, their package's modules
        they import, their neighbours, the other test files (only listed .py files)."""
        listed = sorted(p for p in self._sizes if p.endswith(".py"))
        stems = {posixpath.basename(p)[:-3] for p in edited} - {"__init__"}
        order: list[tuple[str, str]] = []
        order += [(p, "explore_test") for p in listed if _is_test(p) and any(s in posixpath.basename(p) for s in stems)]
        for path in edited:
            seen = [line for line in self._known[path].lines if line is not None]
            order += [(p, "explore_import") for p in package_imports(path, seen) if p in self._sizes]
        order += [(p, "explore_neighbour") for path in edited for p in listed if _dir(p) == _dir(path)]
        order += [(p, "explore_other") for p in listed if _is_test(p)]
        chosen: dict[str, str] = {}
        for path, kind in order:
            if path not in chosen and path not in self._known and path.endswith(".py"):
                chosen[path] = kind
        return list(chosen.items())

    # -- reproduction and edits ------------------------------------------------------------------------------

    def _ensure_dir(self, path: str) -> Generator[str, str, None]:
        folder = _dir(path)
        if folder in self._dirs or any(d.startswith(folder + "/") for d in self._dirs):
            return
        yield self._act(THOUGHTS["mkdir"], "execute_bash", cmd=f"cd {TESTBED} && mkdir -p {shlex.quote(folder)}")
        self._dirs.add(folder)

    def _create(self, fp: FilePatch, thought: str) -> Generator[str, str, None]:
        text = fp.new_content().strip()
        if not emittable(text):
            raise EditError(f"{fp.path}: the new file's text cannot be sent as a file_text value")
        yield from self._ensure_dir(fp.path)
        observation = yield self._act(
            thought, "file_editor", command="create", path=f"{TESTBED}/{fp.path}", file_text=text
        )
        if "File created" not in observation:
            raise EditError(f"creating {fp.path} failed: {_excerpt(observation)!r}")

    def _reproduce(self, tests: list[FilePatch]) -> Generator[str, str, tuple[list[str], list[str]]]:
        """Write the test patch into the container; returns (files created, files to restore)."""
        created: list[str] = []
        restored: list[str] = []
        for fp in tests:
            if fp.binary or fp.kind in ("deleted", "renamed"):
                continue
            if fp.kind == "added":
                yield from self._create(fp, THOUGHTS["create_test"])
                created.append(fp.path)
            elif fp.hunks and fp.path.endswith(".py"):
                yield from self._ensure_sizes([fp.path])
                yield from self._view_for_edit(fp.path, fp.hunks, "view_test")
                yield from self._hunks(fp.path, fp.path, fp.hunks, THOUGHTS["edit_test"], THOUGHTS["edit_test"])
                restored.append(fp.path)
        return created, restored

    def _apply_file(self, fp: FilePatch, first: bool) -> Generator[str, str, None]:
        if fp.kind == "added":
            yield from self._create(fp, THOUGHTS["create"])
        elif fp.kind == "deleted":
            yield self._act(THOUGHTS["delete"], "execute_bash", cmd=f"cd {TESTBED} && rm {shlex.quote(fp.path)}")
        else:
            old, new = fp.old_path or "", fp.path
            if fp.kind == "renamed":
                yield from self._ensure_dir(new)
                move = f"cd {TESTBED} && mv {shlex.quote(old)} {shlex.quote(new)}"
                yield self._act(THOUGHTS["rename"], "execute_bash", cmd=move)
            if fp.hunks:
                opening = THOUGHTS["edit_first"] if first else THOUGHTS["edit_next"]
                yield from self._hunks(old, new, fp.hunks, opening, THOUGHTS["edit_next"])

    def _hunks(
        self, viewed: str, path: str, hunks: tuple[Hunk, ...], opening: str, later: str
    ) -> Generator[str, str, None]:
        """One editor call per hunk, its context copied from the view of ``viewed``, sent to ``path``."""
        known = self._known[viewed]
        offset = 0
        for index, hunk in enumerate(hunks):
            label = f"hunk {index + 1} of {path} ({hunk.title})"
            at = locate(known, hunk, offset, label)
            candidates = edit_candidates(known, hunk, at, label)
            edit = next(candidates)
            thought = opening if index == 0 else later
            while True:
                if edit.command == "insert":
                    params = {"insert_line": str(edit.insert_line), "new_str": edit.new_str}
                else:
                    params = {"old_str": edit.old_str, "new_str": edit.new_str}
                observation = yield self._act(
                    thought, "file_editor", command=edit.command, path=f"{TESTBED}/{path}", **params
                )
                if "has been edited" in observation:
                    break
                wider = next(candidates, None) if "Multiple occurrences" in observation else None
                if wider is None:
                    raise EditError(f"{label}: the editor refused the {edit.command}: {_excerpt(observation)!r}")
                edit, thought = wider, THOUGHTS["widen"]
            known.apply(edit)
            base = hunk.old_start - 1 if hunk.old_len else hunk.old_start
            offset = at - base + hunk.new_len - hunk.old_len
