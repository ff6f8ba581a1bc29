"""Exit codes of the kvwatch CLI and daemon (documented in docs/reference.md).

EXIT_GAVE_UP is what systemd's RestartPreventExitStatus= names: kvwatch has
already retried with every remedy it knows, so restarting it cannot help.
"""
from __future__ import annotations

EXIT_OK = 0
EXIT_UNKNOWN_FAILURE = 1   # diagnose: the failure class is unknown
EXIT_BAD_INPUT = 2         # unreadable config, bad flags, malformed model config
EXIT_PLAN_WILL_FAIL = 3    # plan: vLLM will refuse this command as it stands
EXIT_GAVE_UP = 78          # run: FATAL, no remedy left (EX_CONFIG)
