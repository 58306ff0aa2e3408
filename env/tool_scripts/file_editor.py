"""In-container side of the `file_editor` tool (R2E-Gym `r2egym` scaffold semantics and messages).

Installed by `env.tools.ToolBox.install()` as /usr/local/bin/file_editor with a shebang for the container's
interpreter; it must stay runnable by Python 3.6+ with the standard library only (no chardet needed).
Commands: view | create | str_replace | insert | undo_edit. Undo history (the previous full text per path)
lives in /var/tmp/editor_state.json, so it survives between calls. Errors print `ERROR: ...`, exit code 0.
"""

import argparse
import ast
import io
import json
import os
import subprocess
import sys

STATE_FILE = "/var/tmp/editor_state.json"
SNIPPET_LINES = 4
MAX_RESPONSE_LEN = 10000
CONCISE_ABOVE_LINES = 110
CLIP_NOTE = (
    "<response clipped><NOTE>To save on context only part of this file has been shown to you. You should "
    "retry this tool after you have searched inside the file with `grep -n` in order to find the line "
    "numbers of what you are looking for.</NOTE>"
)
LINT_HEADER = (
    "Your proposed edit has introduced new syntax error(s).\n"
    "Please read this error message carefully and then retry editing the file.\nERRORS:\n"
)
CONCISE_HEADER = (
    "Here is a condensed view for file: {path}; [Note: Useful for understanding file structure in a concise "
    "manner. Please use specific view_range without concise cmd if you want to explore further into the "
    "relevant parts.]\n"
)


class EditorError(Exception):
    pass


def clip(text):
    if len(text) <= MAX_RESPONSE_LEN:
        return text
    return text[:MAX_RESPONSE_LEN] + CLIP_NOTE


def read_text(path):
    with open(path, "rb") as handle:
        raw = handle.read()
    for encoding in ("utf-8", "latin-1"):
        try:
            return raw.decode(encoding)
        except UnicodeDecodeError:
            continue
    return raw.decode("utf-8", "replace")


def write_text(path, text):
    try:
        with open(path, "w", encoding="utf-8", newline="") as handle:
            handle.write(text)
    except Exception as exc:
        raise EditorError(f"Failed to write file {path}: {exc}") from None


def load_history():
    try:
        with open(STATE_FILE, encoding="utf-8") as handle:
            return dict(json.load(handle))
    except (OSError, ValueError):
        return {}


def save_history(history):
    try:
        with open(STATE_FILE, "w", encoding="utf-8") as handle:
            json.dump(history, handle)
    except OSError as exc:
        print(f"Warning: Could not write editor history to {STATE_FILE}: {exc}")


def numbered(content, descriptor, first_line=1):
    """The `cat -n`-style block used after create / edits / undo (tab after the number)."""
    lines = clip(content).expandtabs().split("\n")
    body = "\n".join(f"{first_line + i:6}\t{line}" for i, line in enumerate(lines))
    return f"Here's the result of running `cat -n` on {descriptor}:\n{body}\n"


def syntax_problem(text, path, enabled):
    if not enabled or not path.endswith(".py"):
        return ""
    try:
        ast.parse(text, filename=path)
    except SyntaxError as exc:
        return LINT_HEADER + str(exc)
    return ""


def elided_lines(path, text):
    """(0-based line index, text) pairs with long function bodies and class docstrings replaced by notes."""
    try:
        tree = ast.parse(text, filename=path)
    except SyntaxError as exc:
        raise EditorError(f"Syntax error for file {path}: {exc}") from None
    ranges = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0].lineno - 1
            last = (getattr(node.body[-1], "end_lineno", None) or node.body[-1].lineno) - 1
            if last - first >= 3:
                ranges.append((first, last))
        if isinstance(node, ast.ClassDef) and node.body:
            doc = node.body[0]
            if (
                isinstance(doc, ast.Expr)
                and isinstance(getattr(doc, "value", None), ast.Constant)
                and isinstance(doc.value.value, str)
            ):
                start, end = doc.lineno - 1, (getattr(doc, "end_lineno", None) or doc.lineno) - 1
                if end - start >= 4:
                    ranges.append((start + 1, end - 1))
    hidden = set()
    for start, end in ranges:
        hidden.update(range(start, end + 1))
    notes = [(start, f"... eliding lines {start + 1}-{end + 1} ...") for start, end in ranges]
    kept = [(i, line) for i, line in enumerate(text.splitlines()) if i not in hidden]
    return sorted(notes + kept, key=lambda pair: pair[0])


def view_directory(path):
    cmd = ["find", path, "-maxdepth", "2", "-not", "-path", "*/.*", "(", "-type", "d", "-o", "-name", "*.py", ")"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
    out, err = proc.communicate()
    if err.strip():
        return "", err.strip()
    listing = f"Here's the files and directories up to 2 levels deep in {path}, excluding hidden:\n"
    return clip(listing + out), ""


def view(path, view_range, concise):
    if os.path.isdir(path):
        return view_directory(path)
    if not path.endswith(".py"):
        name = os.path.basename(path)
        return "", (
            f"ERROR: Viewing non-Python files is disallowed for saving context. File '{name}' is not a .py file."
        )
    text = read_text(path)
    if not view_range and not concise and len(text.splitlines()) > CONCISE_ABOVE_LINES:
        concise = True
    pairs = elided_lines(path, text) if concise else list(enumerate(text.splitlines()))
    total = len(pairs)
    if view_range and len(view_range) == 2:
        start, end = view_range
        if not 1 <= start <= total:
            return "", f"Invalid view_range {view_range}: start line must be in [1, {total}]"
        if end != -1 and (end < start or end > total):
            return "", (
                f"Invalid view_range {view_range}: end must be >= start and <= {total}, or -1 to view until end."
            )
        pairs = [(i, line) for i, line in pairs if i + 1 >= start and (end == -1 or i + 1 <= end)]
    header = (
        CONCISE_HEADER.format(path=path) if concise else f"Here's the result of running `cat -n` on the file: {path}:\n"
    )
    body = "\n".join(f"{i + 1:6d} {line}" for i, line in pairs)
    return clip(header + body), ""


def create(path, file_text, history, lint):
    if file_text is None:
        raise EditorError("Cannot create file without 'file_text' parameter.")
    problem = syntax_problem(file_text, path, lint)
    if problem:
        return "", problem
    try:
        with open(path, "w", encoding="utf-8", newline="") as handle:
            handle.write(file_text)
    except Exception as exc:
        raise EditorError(f"Error creating file at {path}: {exc}") from None
    history.setdefault(path, []).append("")
    return (
        f"File created at {path}. "
        + numbered(file_text, path)
        + "Review the file and make sure that it is as expected. Edit the file if necessary."
    ), ""


def str_replace(path, old_str, new_str, history, lint):
    if old_str is None:
        raise EditorError("Missing required parameter 'old_str' for 'str_replace'.")
    new_str = new_str or ""
    content = read_text(path)
    count = content.count(old_str)
    if count == 0:
        raise EditorError(f"No occurrences of '{old_str}' found in {path} for replacement.")
    if count > 1:
        raise EditorError(
            f"Multiple occurrences of '{old_str}' found in {path}. Please ensure it is unique before using str_replace."
        )
    updated = content.replace(old_str, new_str)
    problem = syntax_problem(updated, path, lint)
    if problem:
        return "", problem
    history.setdefault(path, []).append(content)
    write_text(path, updated)
    at_line = content.split(old_str)[0].count("\n")
    first = max(0, at_line - SNIPPET_LINES)
    last = at_line + SNIPPET_LINES + new_str.count("\n")
    snippet = "\n".join(updated.split("\n")[first : last + 1])
    return (
        f"The file {path} has been edited. "
        + numbered(snippet, "a snippet of " + path, first + 1)
        + "Review the changes and make sure they are as expected. Edit the file again if necessary."
    ), ""


def insert(path, insert_line, new_str, history, lint):
    if new_str is None:
        raise EditorError("Missing required parameter 'new_str' for 'insert'.")
    if insert_line is None:
        raise EditorError("Missing required parameter 'insert_line' for 'insert'.")
    content = read_text(path)
    lines = content.split("\n")
    if insert_line < 0 or insert_line > len(lines):
        raise EditorError(f"Invalid insert_line {insert_line}. Must be in [0, {len(lines)}].")
    added = new_str.split("\n")
    updated = "\n".join(lines[:insert_line] + added + lines[insert_line:])
    problem = syntax_problem(updated, path, lint)
    if problem:
        return "", problem
    history.setdefault(path, []).append(content)
    write_text(path, updated)
    snippet = "\n".join(
        lines[max(0, insert_line - SNIPPET_LINES) : insert_line]
        + added
        + lines[insert_line : insert_line + SNIPPET_LINES]
    )
    first = max(1, insert_line - SNIPPET_LINES + 1)
    return (
        f"The file {path} has been edited. "
        + numbered(snippet, "a snippet of the edited file", first)
        + "Review the changes and make sure they are as expected (correct indentation, no duplicate lines, "
        "etc). Edit the file again if necessary."
    ), ""


def undo_edit(path, history):
    stack = history.get(path) or []
    if not stack:
        raise EditorError(f"No previous edits found for {path} to undo.")
    previous = stack.pop()
    write_text(path, previous)
    return f"Last edit to {path} undone successfully. " + numbered(previous, path), ""


def check_path(command, path):
    if path is None:
        raise EditorError("Missing required parameter 'path'.")
    if command == "create":
        if os.path.exists(path):
            raise EditorError(f"File already exists at: {path}. Cannot overwrite with 'create'.")
    elif not os.path.exists(path):
        raise EditorError(f"The path '{path}' does not exist.")
    if os.path.isdir(path) and command != "view":
        raise EditorError(f"The path '{path}' is a directory. Only 'view' can be used on directories.")


def run(args, history):
    check_path(args.command, args.path)
    lint = bool(args.enable_linting) and args.enable_linting.lower() not in ("false", "0", "")
    if args.command == "view":
        return view(args.path, args.view_range, args.concise.lower() == "true")
    if args.command == "create":
        return create(args.path, args.file_text, history, lint)
    if args.command == "str_replace":
        return str_replace(args.path, args.old_str, args.new_str, history, lint)
    if args.command == "insert":
        return insert(args.path, args.insert_line, args.new_str, history, lint)
    if args.command == "undo_edit":
        return undo_edit(args.path, history)
    raise EditorError(
        f"Unrecognized command '{args.command}'. Allowed commands: view, create, str_replace, insert, undo_edit."
    )


def parse_range(text):
    parts = text.strip().strip("[]()").replace(",", " ").split()
    if len(parts) != 2:
        raise argparse.ArgumentTypeError(f"Expected two numbers, got: {text}")
    try:
        return [int(parts[0]), int(parts[1])]
    except ValueError:
        raise argparse.ArgumentTypeError(f"Could not convert {parts} to integers.") from None


def main():
    if hasattr(sys.stdout, "buffer"):
        sys.stdout = io.TextIOWrapper(sys.stdout.buffer, encoding="utf-8", errors="replace")
    parser = argparse.ArgumentParser(description="view / create / str_replace / insert / undo_edit files")
    parser.add_argument("command")
    parser.add_argument("--path")
    parser.add_argument("--file_text")
    parser.add_argument("--view_range", type=parse_range)
    parser.add_argument("--old_str")
    parser.add_argument("--new_str")
    parser.add_argument("--insert_line", type=int)
    parser.add_argument("--enable_linting", default="")
    parser.add_argument("--concise", default="False")
    args = parser.parse_args()
    if args.path is not None:
        args.path = os.path.normpath(args.path) if args.path.strip() else args.path
    history = load_history()
    try:
        output, error = run(args, history)
        print(output)
        if error:
            print("ERROR: " + error)
    except EditorError as exc:
        print(f"ERROR: {exc}")
    except Exception as exc:
        print(f"ERROR: Unhandled exception: {exc}")
    save_history(history)


if __name__ == "__main__":
    main()
