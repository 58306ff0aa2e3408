"""In-container side of the `execute_bash` tool (R2E-Gym semantics and messages; Python 3.6+, stdlib only).

One fresh `/bin/sh` process per call (no persistent shell). Commands whose first word is git, ipython,
jupyter or nohup are refused. Prints `[STDOUT]` and `[STDERR]` sections; on failure an error line first and
the command's exit code as ours. The time limit is enforced by the caller (env.sandbox) around this script.
"""

import argparse
import subprocess
import sys

BLOCKED_FIRST_WORDS = ("git", "ipython", "jupyter", "nohup")


def main():
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
    out = out.decode("utf-8", "replace")
    err = err.decode("utf-8", "replace")
    if proc.returncode != 0:
        print("Error executing command:\n")
    print("[STDOUT]\n")
    print(out.strip(), "\n")
    print("[STDERR]\n")
    print(err.strip())
    sys.stdout.flush()
    if proc.returncode != 0:
        sys.exit(proc.returncode if proc.returncode > 0 else 128 - proc.returncode)


if __name__ == "__main__":
    main()
