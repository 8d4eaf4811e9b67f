"""examples/ci: CUDA-only example scripts (no CPU branch), the workflow and the pytest example
users copy, as files. Running them is tests/e2e/test_ci_smoke.py's job."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import yaml

CI = Path(__file__).resolve().parents[2] / "examples" / "ci"


def _scripts() -> list[Path]:
    return sorted(p for p in CI.glob("*.py") if not p.name.startswith("test_"))


def test_ci_scripts_are_written_for_cuda_and_nccl_only() -> None:
    assert {p.name for p in _scripts()} >= {"multigpu_torchrun_style.py",
                                            "multigpu_torchrun_rank0_barrier.py"}
    for path in _scripts():
        tree = ast.parse(path.read_text())
        doc = ast.get_docstring(tree)
        assert doc and "Expected diagnosis:" in doc, path.name
        code = path.read_text().split('"""', 2)[2]  # the code after the module docstring
        assert 'backend="nccl"' in code and ".to(self.local_rank" in code
        assert "device_ids=[self.local_rank]" in code and "pin_memory=True" in code
        assert 'map_location=f"cuda:' in code and "torch.cuda.set_device" in code
        assert not re.search(r"\bcpu\b|gloo", code, re.I), f"{path.name} has a CPU branch"


def test_github_workflow_runs_the_smoke_test_and_keeps_the_evidence() -> None:
    data = yaml.safe_load((CI / "github-workflow.yml").read_text())
    assert "on" in data or True in data  # YAML 1.1 reads the key `on` as true
    steps = data["jobs"]["ddp-smoke"]["steps"]
    runs = " ".join(s.get("run", "") for s in steps)
    assert "ddpdoctor run --cpu --epoch-steps 2" in runs and "--junit ddpdoctor-junit.xml" in runs
    # ddpdoctor is on no package index: the workflow installs it from its source.
    assert "pip install ddpdoctor" not in runs and 'pip install "./$DDPDOCTOR_SOURCE"' in runs
    uses = [s.get("uses", "") for s in steps]
    assert any(u.startswith("actions/upload-artifact") for u in uses)
    assert any("junit" in u for u in uses)


def test_pytest_example_runs_ddpdoctor_in_cpu_mode_with_reports() -> None:
    source = (CI / "test_ddp_smoke.py").read_text()
    compile(source, "test_ddp_smoke.py", "exec")
    for flag in ('"--cpu"', '"--epoch-steps"', '"--junit"', '"--markdown"', '"--expect-schedule"'):
        assert flag in source
