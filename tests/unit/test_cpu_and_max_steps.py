"""``--cpu`` and ``--max-steps`` without processes: the launcher's settings, CPU mode's pure
helpers, and the analysis of ranks stopped at the step limit."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpdoctor.analysis import diagnose
from ddpdoctor.analysis.finding import FindingKind as fk
from ddpdoctor.launch.command import build_command, build_env
from ddpdoctor.launch.errors import UsageError
from ddpdoctor.launch.options import RunOptions, check_options
from ddpdoctor.runtime import cpu_mode, env, max_steps
from ddpdoctor.trace import schema

from .factories import make_run, ranks


def _stop(b, steps: int) -> None:
    b.trace.exit = {"kind": "exit", "t": b.clock.tick(), "status": schema.EXIT_MAX_STEPS,
                    "code": 0, "steps": steps}


# -- analysis ---------------------------------------------------------------------------------
def test_ranks_stopped_at_max_steps_are_finished_and_the_run_is_clean() -> None:
    bs = ranks(2)
    for b in bs:
        b.ddp_init().train(2)
        _stop(b, 2)
    report = diagnose(make_run(*bs))
    assert report.verdict == "clean" and report.all_finished and not report.findings
    assert [r.status for r in report.ranks] == ["finished", "finished"]
    assert [r.iterations for r in report.ranks] == [2, 2]
    assert "ranks 0, 1 were stopped by --max-steps 2 at the start of iteration 3" in report.notes


def test_with_two_ddp_models_a_note_says_what_an_iteration_counts() -> None:
    # A GAN: the iteration is the count of forwards through either model, and --max-steps
    # counts them so.
    bs = ranks(2)
    for b in bs:
        b.ddp_init().ddp_init().train(2)
        _stop(b, 2)
    notes = diagnose(make_run(*bs)).notes
    assert "the script made 2 DDP models: an iteration here is a forward through any of them " \
           "(a GAN's D and G both count), not a step of the training loop; --max-steps " \
           "counts the same way" in notes, notes
    one = ranks(2)
    for b in one:
        b.ddp_init().train(2).finish()
    assert not any("DDP models" in n for n in diagnose(make_run(*one)).notes)


def test_a_rank_waiting_while_its_peer_stopped_at_max_steps_is_a_divergence() -> None:
    bs = ranks(2)
    for b in bs:
        b.ddp_init().train(2)
    bs[0].user("barrier", line=70).pend_last()
    _stop(bs[1], 2)
    report = diagnose(make_run(*bs, stopped_for_hang=True))
    assert report.verdict == "diverged"
    kinds = {f.kind for f in report.findings}
    assert fk.RANK_EXITED_EARLY in kinds
    early = next(f for f in report.findings if f.kind == fk.RANK_EXITED_EARLY)
    assert early.summary.startswith("Rank 1 was stopped by --max-steps 2 at the start of "
                                    "iteration 3 while rank 0 still waits in user barrier()")
    assert "stopped by --max-steps 2" in early.ranks[1].note


# -- launcher ---------------------------------------------------------------------------------
def test_cpu_sets_gloo_cpu_mode_two_processes_and_hides_gpus(tmp_path: Path) -> None:
    opts = RunOptions(script="train.py", cpu=True, max_steps=2, hang_timeout=8.0)
    environ = build_env(opts, tmp_path, "run")
    assert environ[env.CPU] == "1" and environ[env.BACKEND] == "gloo"
    assert environ[env.CPU_DEVICES] == "2" and environ["CUDA_VISIBLE_DEVICES"] == ""
    assert environ[env.MAX_STEPS] == "2" and float(environ[env.STOP_TIMEOUT]) == 4.0
    cmd = build_command(opts)
    assert cmd[cmd.index("--nproc-per-node") + 1] == "2"
    opts4 = RunOptions(script="train.py", cpu=True, torchrun_args=["--nproc_per_node=4"])
    assert build_env(opts4, tmp_path, "run")[env.CPU_DEVICES] == "4"
    plain = build_env(RunOptions(script="train.py"), tmp_path, "run")
    assert env.CPU not in plain and env.MAX_STEPS not in plain


def test_contradictory_options_are_usage_errors() -> None:
    with pytest.raises(UsageError, match="--cpu runs on gloo"):
        check_options(RunOptions(script="t.py", cpu=True, backend="nccl"))
    with pytest.raises(UsageError, match="at least 1"):
        check_options(RunOptions(script="t.py", max_steps=0))
    check_options(RunOptions(script="t.py", cpu=True, backend="gloo", max_steps=1))


# -- CPU mode helpers -------------------------------------------------------------------------
@pytest.mark.parametrize("value, expected", [
    (0, True), (3, True), (True, False), ("cuda", True), ("cuda:1", True), (" CUDA:0", True),
    ("cpu", False), ("meta", False), (None, False), (1.0, False),
])
def test_is_cuda_device(value, expected) -> None:
    assert cpu_mode.is_cuda_device(value) is expected


def test_is_cuda_device_of_torch_devices() -> None:
    torch = pytest.importorskip("torch")
    assert cpu_mode.is_cuda_device(torch.device("cuda", 1))
    assert not cpu_mode.is_cuda_device(torch.device("cpu"))


def test_map_location_sends_every_cuda_target_to_the_cpu() -> None:
    assert cpu_mode.map_location(None) == "cpu"
    assert cpu_mode.map_location("cuda:1") == "cpu" and cpu_mode.map_location(0) == "cpu"
    assert cpu_mode.map_location({"cuda:0": "cuda:1", "cpu": "cpu"}) == {"cuda:0": "cpu",
                                                                         "cpu": "cpu"}
    fn = lambda storage, loc: storage  # noqa: E731 - callables are passed through
    assert cpu_mode.map_location(fn) is fn
    assert cpu_mode.map_location("cpu") == "cpu"


def test_device_count_follows_the_launcher(monkeypatch) -> None:
    monkeypatch.setenv(env.CPU_DEVICES, "3")
    assert cpu_mode.device_count() == 3
    monkeypatch.delenv(env.CPU_DEVICES)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "5")
    assert cpu_mode.device_count() == 5
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert cpu_mode.device_count() == 1


def test_user_code_is_what_lies_outside_libraries() -> None:
    assert cpu_mode.from_user_code(depth=1)  # this test file
    import json

    from ddpdoctor.runtime import user_code

    assert user_code.is_library(json.__file__) and not user_code.is_library(__file__)
    assert user_code.is_internal(cpu_mode.__file__) and not user_code.is_internal(json.__file__)


def test_max_steps_configuration(monkeypatch) -> None:
    monkeypatch.setenv(env.MAX_STEPS, "4")
    monkeypatch.setenv(env.STOP_TIMEOUT, "2.5")
    try:
        assert max_steps.configure_from_env() == 4

        class Rec:
            iteration = 3

        max_steps.check(Rec())  # below the limit: nothing happens
        monkeypatch.setenv(env.MAX_STEPS, "x")
        assert max_steps.configure_from_env() is None
    finally:
        max_steps.configure(None)


def test_asking_whose_code_a_frame_is_never_imports_torch() -> None:
    # The watchdog thread asks while the main thread may be importing torch: a second import
    # of a half-initialised torch fails the rank (seen on a loaded machine).
    import subprocess
    import sys

    code = ("import sys; from ddpdoctor.runtime import user_code; "
            "print(user_code.is_library('/x/y.py'), user_code.is_internal(user_code.__file__), "
            "'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout.split()
    assert out == ["False", "True", "False"]


def test_the_cpu_hint_comes_first_when_a_gpu_script_meets_no_gpu(tmp_path, monkeypatch) -> None:
    from ddpdoctor.launch.command import needs_cpu_mode
    from ddpdoctor.launch.options import RunOptions

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    gpu = tmp_path / "gpu.py"
    gpu.write_text('import torch.distributed as dist\ndist.init_process_group("nccl")\n')
    cpu = tmp_path / "cpu.py"
    cpu.write_text('import torch.distributed as dist\ndist.init_process_group("gloo")\n')
    assert needs_cpu_mode(RunOptions(script=str(gpu)))
    assert not needs_cpu_mode(RunOptions(script=str(gpu), cpu=True))
    assert not needs_cpu_mode(RunOptions(script=str(cpu)))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert not needs_cpu_mode(RunOptions(script=str(gpu)))
