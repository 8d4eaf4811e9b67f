"""Shared pytest configuration: end-to-end tests are marked and run one gloo job at a time."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/e2e/" in str(item.fspath):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(autouse=True)
def _no_ci_step_summary(monkeypatch: pytest.MonkeyPatch) -> None:
    """Jobs started by a test must not append to the CI server's own step summary."""
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)


@pytest.fixture(autouse=True)
def _no_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """The jobs are CPU gloo jobs of 2 ranks wherever the suite runs: on a host with one GPU,
    ddpdoctor's default (one rank per visible GPU) would run them with one."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")


@pytest.fixture(scope="session")
def _jobs_tmpdir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("jobs-tmp", numbered=False))


@pytest.fixture(autouse=True)
def _job_temp_files(_jobs_tmpdir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The jobs' temporary files go under pytest's temporary folder, which pytest prunes:
    torchrun leaves a torchelastic_* folder per run (plain torchrun too), torch's ranks leave
    remote-module and error files, and a job stopped on a hang never cleans up after itself."""
    monkeypatch.setenv("TMPDIR", _jobs_tmpdir)
