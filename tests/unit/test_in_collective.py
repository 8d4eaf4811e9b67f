"""Whether the watchdog places the main thread inside a torch.distributed call: the module code
torch.distributed runs while it is imported is no call (the live status line said "inside a
torch.distributed call ddpdoctor does not record" during every rank's ``import torch``)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import FrameType

from ddpdoctor.runtime.watchdog import in_collective

_MODULE = '''
import sys
sys.modules["_ddpdoctor_probe"].look("import")

def call():
    sys.modules["_ddpdoctor_probe"].look("call")

def lazy():
    import _ddpdoctor_lazy  # a module that loads inside a torch.distributed function
'''


class _Probe:
    """Takes in_collective of the frame that calls it."""

    def __init__(self) -> None:
        self.seen: dict[str, bool] = {}

    def look(self, what: str) -> None:
        frame: FrameType | None = sys._getframe(1)
        self.seen[what] = in_collective(frame)


def _load(path: Path, name: str) -> object:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_import_of_torch_distributed_is_no_call_and_a_call_is(tmp_path: Path,
                                                              monkeypatch) -> None:
    folder = tmp_path / "torch" / "distributed"
    folder.mkdir(parents=True)
    (folder / "fake_c10d.py").write_text(_MODULE)
    (tmp_path / "_ddpdoctor_lazy.py").write_text(
        'import sys\nsys.modules["_ddpdoctor_probe"].look("lazy")\n')
    probe = _Probe()
    monkeypatch.setitem(sys.modules, "_ddpdoctor_probe", probe)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "_ddpdoctor_lazy", raising=False)
    module = _load(folder / "fake_c10d.py", "_ddpdoctor_fake_c10d")
    module.call()  # type: ignore[attr-defined]
    module.lazy()  # type: ignore[attr-defined]
    assert probe.seen == {"import": False, "call": True, "lazy": False}


def test_user_code_alone_is_no_call() -> None:
    assert in_collective(sys._getframe()) is False
