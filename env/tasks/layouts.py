"""What each image layout needs before the agent starts: its grading material out of reach, then a
snapshot of the tree so the final diff holds only the agent's changes.

* R2E-native (`namanjain12/<repo>_final:<commit>`): `/testbed/run_tests.sh` and the hidden tests
  (`/r2e_tests`, or `/testbed/r2e_tests`) are deleted from the agent's container (R2E-Gym moves them to
  /root and links the tests back into /testbed, where the agent can read them; the grading container gets
  its own copies from the image). Stale bytecode is removed as R2E-Gym does, and /testbed/.venv is linked
  to /root/.venv so R2E-Gym's interpreter paths hold.
* R2E's SWE-bench images: `/run_tests.sh` (the eval script, which holds the test patch) is deleted.
* SWE-bench images and local tasks carry no grading material in the agent's tree.

Then, for every layout, `/testbed/.git` is reduced to HEAD's commit (`env.sandbox.repo_scrub.scrub_history`): no
later commit (the fix) stays reachable or present through refs, tags, the reflog, stashes or loose packs.
The snapshot (`Sandbox.snapshot`) is taken after these steps, so none of them shows in the patch.
"""

from __future__ import annotations

from env.sandbox.config import SandboxError
from env.sandbox.container import Sandbox
from env.sandbox.repo_scrub import scrub_history

R2E_NATIVE_AGENT_SETUP = """
rm -rf /testbed/run_tests.sh /testbed/r2e_tests /r2e_tests /root/run_tests.sh /root/r2e_tests
find /testbed -name '*.pyc' -delete 2>/dev/null; find /testbed -name '__pycache__' -exec rm -rf {} + 2>/dev/null
[ -e /testbed/.venv ] && [ ! -e /root/.venv ] && ln -s /testbed/.venv /root/.venv
true
"""
R2E_SWEBENCH_AGENT_SETUP = "rm -f /run_tests.sh; true"


def prepare_agent_sandbox(box: Sandbox, task) -> str:
    """Hide the grading material of `task`'s layout from `box`, reduce /testbed's git history to its base
    commit, then snapshot /testbed; returns the tree id. Failures raise SandboxError."""
    setup = {"r2e": R2E_NATIVE_AGENT_SETUP, "r2e_swebench": R2E_SWEBENCH_AGENT_SETUP}.get(task.kind)
    if setup:
        result = box.run(setup, timeout=300, workdir="/")
        if result.exit_code != 0 or result.timed_out:
            raise SandboxError(f"preparing the {task.kind} layout failed: {result.output[-800:]}")
    scrub_history(box, "/testbed")
    return box.snapshot("/testbed")
