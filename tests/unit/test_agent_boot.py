"""What the runtime installs when the job's top process imports torch: torchrun's agent gets
its workers' exit codes followed and nothing of the recording; a script that starts its own
workers (which may issue collectives itself) gets both."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddpdoctor.launch.command import INJECT_DIR
from ddpdoctor.runtime import env

_PROBE = """
import json, sys
import torch
import torch.distributed as dist
from ddpdoctor.runtime import torch_internals
context = torch_internals.agent_process_context()
print(json.dumps({
    "recording": "ddpdoctor.runtime.torch_hooks" in sys.modules,
    "init_patched": getattr(dist.init_process_group, "_ddpdoctor", False),
    "exit_codes": getattr(getattr(context, torch_internals.AGENT_POLL), "_ddpdoctor", False),
}))
"""


def _top_process(tmp_path: Path, launcher: str) -> dict[str, bool]:
    """Boot the runtime in a child of this test, as ``ddpdoctor run`` boots the job's top
    process, import torch there, and say what was installed."""
    environ = {k: v for k, v in os.environ.items()
               if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID")}
    environ.update({
        "PYTHONPATH": os.pathsep.join(p for p in (INJECT_DIR, environ.get("PYTHONPATH")) if p),
        env.LOGDIR: str(tmp_path), env.RUN_ID: "test", env.LAUNCHER: launcher,
        env.LAUNCHER_PID: str(os.getpid()), "DDPDOCTOR_STDERR_TAIL": "0"})
    out = subprocess.run([sys.executable, "-c", _PROBE], env=environ, capture_output=True,
                         text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(150)
def test_torchruns_agent_follows_exit_codes_and_is_not_patched_for_recording(
        tmp_path: Path) -> None:
    assert _top_process(tmp_path, env.Launcher.TORCHRUN.value) == {
        "recording": False, "init_patched": False, "exit_codes": True}


@pytest.mark.timeout(150)
def test_a_script_that_starts_its_own_workers_is_patched_for_recording(tmp_path: Path) -> None:
    installed = _top_process(tmp_path, env.Launcher.PYTHON.value)
    assert installed["recording"] and installed["init_patched"]
