"""gRPC's C core stays quiet in `ragguard demo` and `ragguard bench` unless the user asks.

The core reads GRPC_VERBOSITY once, when grpc is first imported, so what matters is the
variable's value at that moment: each test runs the command in a fresh interpreter whose import
of grpc reports it and ends the process (nothing else runs).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

REPORT_AT_GRPC_IMPORT = """
import importlib.abc, os, runpy, sys

class ReportGrpcImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "grpc":
            print("GRPC_VERBOSITY at grpc import:", os.environ.get("GRPC_VERBOSITY"), flush=True)
            os._exit(0)
        return None

sys.meta_path.insert(0, ReportGrpcImport())
sys.argv = sys.argv[1:]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""


def _verbosity_at_grpc_import(argv: list[str], user_level: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "GRPC_VERBOSITY"}  # the suite sets it
    if user_level is not None:
        env["GRPC_VERBOSITY"] = user_level
    done = subprocess.run([sys.executable, "-c", REPORT_AT_GRPC_IMPORT, *argv], capture_output=True,
                          text=True, timeout=60, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("GRPC_VERBOSITY at grpc import:")]
    return line.rsplit(":", 1)[1].strip()


COMMANDS = {
    "demo": ["ragguard_tools.cli", "demo", "--quick"],
    "bench": ["ragguard_tools.cli", "bench", "--quick"],
    "demo-backends-child": ["ragguard_tools.demo._child", "--seed", "7"],
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("command", COMMANDS)
def test_grpc_core_logs_errors_only_unless_the_user_chose_a_level(command: str) -> None:
    assert _verbosity_at_grpc_import(COMMANDS[command], None) == "ERROR"
    assert _verbosity_at_grpc_import(COMMANDS[command], "DEBUG") == "DEBUG"  # the user's choice stands
