"""In-container side of the `finish` tool: `finish submit [--result TEXT]` prints the finish marker."""

import argparse
import sys


def main():
    parser = argparse.ArgumentParser(description="finish the task")
    parser.add_argument("command")
    parser.add_argument("--result", default="")
    args = parser.parse_args()
    if args.command != "submit":
        print(f"Unknown command '{args.command}'. Only `submit` is supported.")
        sys.exit(1)
    print("<<<Finished>>>")


if __name__ == "__main__":
    main()
