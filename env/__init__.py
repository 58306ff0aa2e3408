"""The agent's environment: one Docker container per episode (``env.sandbox``), the tasks and their images
(``env.tasks``), and grading a patch in a fresh container (``env.grading``). Each is a room of its own in
ARCHITECTURE.md; this package only groups them."""
