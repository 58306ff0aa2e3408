"""The `nexus-eval` command line: one entry point over every part of the project."""
