"""In-container side of the `execute_bash` tool (R2E-Gym semantics and messages; Python 3.6+, stdlib only).

One fresh `/bin/sh` process per call (no persistent shell). Commands whose first word is git, ipython,
jupyter or nohup are refused (the list of the `r2egym` scaffold DeepSWE used; see docs/sandbox.md). Prints
`[STDOUT]` and `[STDERR]` sections, read with universal newlines (CRLF and lone CR become LF) as R2E-Gym's
`text=True` does; on failure an error line first, and the command's exit status is ours (a command killed by
signal N exits with 256 - N, as `sys.exit(-N)` does in R2E-Gym). The time limit is enforced by the caller
(env.sandbox.command_exec, through Sandbox.run) around this script.
"""

import argparse
import io
import subprocess
import sys

BLOCKED_FIRST_WORDS = ("git", "ipython", "jupyter", "nohup")


def text_of(raw):
    return raw.decode("utf-8", "replace").replace("\r\n", "\n").replace("\r", "\n")


def main():
    if hasattr(sys.stdout, "buffer"):  # UTF-8 even where a 3.6 interpreter would pick ASCII for the C locale
        sys.stdout = io.TextIOWrapper(sys.stdout.buffer, encoding="utf-8", errors="replace")
    parser = argparse.ArgumentParser(description="Execute a bash command.")
    parser.add_argument("--cmd", required=True)
    args = parser.parse_args()
    words = args.cmd.strip().split()
    if not words:
        print("Bash command '' is not allowed. Please use a different command or tool.")
        sys.exit(1)
    if words[0] in BLOCKED_FIRST_WORDS:
        print(f"Bash command '{words[0]}' is not allowed. Please use a different command or tool.")
        sys.exit(1)
    proc = subprocess.Popen(args.cmd, shell=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate()
    out, err = text_of(out), text_of(err)
    if proc.returncode != 0:
        print("Error executing command:\n")
    print("[STDOUT]\n")
    print(out.strip(), "\n")
    print("[STDERR]\n")
    print(err.strip())
    sys.stdout.flush()
    if proc.returncode != 0:
        sys.exit(proc.returncode)


if __name__ == "__main__":
    main()
