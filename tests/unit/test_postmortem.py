"""The post-mortem of a dead job from its logs, as a pure function of their text (lines in the
formats NCCL's watchdog and torchrun write, as users posted them)."""

from __future__ import annotations

from pathlib import Path

from ddpdoctor.analysis.postmortem import diagnose_logs
from ddpdoctor.trace.job_logs import LogFile, find_logs


def _watchdog(rank: int, seq: int, op: str, numel: int, enqueued: int, pg: str = "2") -> str:
    return (f"[rank{rank}]:[E318 07:39:53.792630246 ProcessGroupNCCL.cpp:616] [Rank {rank}] "
            f"Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, OpType={op}, "
            f"NumelIn={numel}, NumelOut={numel}, Timeout(ms)=600000) ran for 600086 "
            f"milliseconds before timing out.\n"
            f"[rank{rank}]:[E318 07:39:53.792772442 ProcessGroupNCCL.cpp:1785] [PG ID {pg} PG "
            f"GUID 9 Rank {rank}] Exception (either an error or timeout) detected by watchdog "
            f"at work: {seq}, last enqueued NCCL work: {enqueued}, last completed NCCL work: "
            f"{seq - 1}.\n")


def test_the_rank_that_never_issued_the_timed_out_collective_is_the_root() -> None:
    text = "".join(_watchdog(r, 610, "ALLREDUCE", 56320, 616) for r in range(3))
    text += "[rank3]: epoch 4 step 41: loss 0.25\n"
    report = diagnose_logs([LogFile(Path("slurm-1.out"), text)])
    root = report.root
    assert root is not None and root.kind == "missing_collective"
    assert "rank 3 never issued" in root.summary and root.seq == 610
    assert any("no source line" in n for n in report.notes)


def test_ranks_timed_out_in_one_collective_with_different_ops_is_a_mismatch() -> None:
    text = _watchdog(0, 57, "ALLREDUCE", 32, 57) + _watchdog(1, 57, "BROADCAST", 32, 57)
    root = diagnose_logs([LogFile(Path("job.log"), text)]).root
    assert root is not None and root.kind == "op_mismatch" and root.seq == 57


def test_every_rank_timed_out_in_the_same_collective_blames_no_one() -> None:
    text = "".join(_watchdog(r, 610, "ALLREDUCE", 56320, 616) for r in range(2))
    report = diagnose_logs([LogFile(Path("job.log"), text)])
    assert report.root is None and report.verdict == "incomplete"
    assert any("did not reach it left no line" in n for n in report.notes)


def test_torchruns_log_folder_gives_each_file_its_rank(tmp_path: Path) -> None:
    for rank, text in ((0, "RuntimeError: Connection closed by peer\n"),
                       (1, 'Traceback (most recent call last):\n  File "/job/train.py", line '
                           '9, in <module>\n    boom()\nKeyError: \'x\'\n')):
        folder = tmp_path / "run" / "attempt_0" / str(rank)
        folder.mkdir(parents=True)
        (folder / "stderr.log").write_text(text)
    (tmp_path / "elsewhere.bin").write_bytes(b"\0\1")
    logs = find_logs(tmp_path)
    assert [log.rank for log in logs] == [0, 1]
    root = diagnose_logs(logs).root
    assert root is not None and root.kind == "rank_crashed"
    assert root.ranks[1].site is not None and root.ranks[1].site.line == 9
