"""In-container side of the `search` tool (R2E-Gym semantics and messages; Python 3.6+, stdlib only).

A directory: walk non-hidden paths in the file system's order (as R2E-Gym does; the listing is not sorted),
count lines containing the term (plain substring) per file, only `.py` files unless `--python_only ''` (as in
R2E-Gym, any non-empty value, even "false", keeps the `.py` filter); more than 100 matching files asks to
narrow the search. A file that cannot be opened is skipped (R2E-Gym stops with a traceback on one that is
not a permission error, e.g. a dangling symlink). A file: `grep -n`.
"""

import argparse
import os
import subprocess
import sys


def search_directory(term, directory, python_only):
    directory = os.path.realpath(directory)
    if not os.path.isdir(directory):
        print(f"Directory '{directory}' not found or not a directory.")
        sys.exit(1)
    counts = []
    for root, dirs, files in os.walk(directory):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in files:
            if name.startswith(".") or (python_only and not name.endswith(".py")):
                continue
            path = os.path.join(root, name)
            try:
                with open(path, errors="ignore") as handle:
                    hits = sum(1 for line in handle if term in line)
            except (OSError, UnicodeDecodeError):
                continue
            if hits:
                counts.append((path, hits))
    if not counts:
        print(f'No matches found for "{term}" in {directory}')
        sys.exit(0)
    if len(counts) > 100:
        print(f'More than {len(counts)} files matched for "{term}" in {directory}. Please narrow your search.')
        sys.exit(0)
    print(f'Found {sum(n for _, n in counts)} matches for "{term}" in {directory}:')
    for path, hits in counts:
        rel = os.path.relpath(path, start=os.getcwd())
        if not rel.startswith("./"):
            rel = "./" + rel
        print(f"{rel} ({hits} matches)")
    print(f'End of matches for "{term}" in {directory}')


def search_file(term, path):
    path = os.path.realpath(path)
    if not os.path.isfile(path):
        print(f"File '{path}' not found or is not a file.")
        sys.exit(1)
    proc = subprocess.Popen(
        ["grep", "-n", term, path], stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True
    )
    out, err = proc.communicate()
    if proc.returncode == 1:
        print(f'No matches found for "{term}" in {path}')
        sys.exit(0)
    if proc.returncode != 0:
        print(f"Error executing grep:\n{err}")
        sys.exit(proc.returncode)
    print(f'Matches for "{term}" in {path}:')
    print(out.strip())


def main():
    parser = argparse.ArgumentParser(description="search for a term in a directory or a file")
    parser.add_argument("--search_term", required=True)
    parser.add_argument("--path", default=".")
    parser.add_argument("--python_only", default="true")
    args = parser.parse_args()
    if os.path.isfile(args.path):
        search_file(args.search_term, args.path)
    else:
        search_directory(args.search_term, args.path, bool(args.python_only))


if __name__ == "__main__":
    main()
