"""The code sandbox: runs untrusted Python in a confined child process (runner.py). In the core
because two parts use it: the reward service's `code` reward and the built-in `python` tool
environment."""
from rlfleet.sandbox.runner import SandboxError, SandboxLimits, SandboxResult, run_python

__all__ = ["SandboxError", "SandboxLimits", "SandboxResult", "run_python"]
