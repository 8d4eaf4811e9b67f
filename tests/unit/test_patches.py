"""Every change ddpdoctor makes to torch in a rank is in one registry and can be undone."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent('''
    import importlib, tempfile
    import torch, torch.distributed as dist, torch.utils.data
    spawn = importlib.import_module("torch.multiprocessing.spawn")  # the module, not spawn()
    import torch.distributed.elastic.multiprocessing.api as api
    from torch.nn.parallel import DistributedDataParallel as DDP
    from ddpdoctor.runtime import cpu_mode, exit_codes, patches, torch_hooks
    from ddpdoctor.runtime.recorder import Recorder

    targets = [(torch.cuda, "is_available"), (torch.cuda, "set_device"), (torch.nn.Module, "to"),
               (torch, "load"), (torch, "set_default_device"), (dist, "init_process_group"),
               (dist.distributed_c10d, "init_process_group"), (dist, "new_group"),
               (DDP, "__init__"), (DDP, "_pre_forward"), (spawn, "_wrap"),
               (api.SubprocessContext, "_poll"), (spawn.ProcessContext, "join"),
               (torch.utils.data.DataLoader, "__init__")]
    before = [getattr(o, n) for o, n in targets]
    logdir = tempfile.mkdtemp()
    assert torch_hooks.install(Recorder(logdir, "t"), None)
    assert cpu_mode.install()
    exit_codes.install(logdir, "torchrun")
    exit_codes.install(logdir, "python")
    changed = [f"{o.__name__}.{n}" for (o, n), b in zip(targets, before) if getattr(o, n) is b]
    assert not changed, f"not patched: {changed}"
    assert torch.cuda.is_available() is not None and hasattr(DDP, "_ddpdoctor")
    names = [what for what, _ in patches._PATCHES]
    patches.uninstall_all()
    kept = [f"{o.__name__}.{n}" for (o, n), b in zip(targets, before) if getattr(o, n) is not b]
    assert not kept, f"not restored: {kept}"
    assert not hasattr(DDP, "_ddpdoctor") and not patches._PATCHES
    assert torch.ones(1).device.type == "cpu"
    print("PATCHES", len(names))
''')


def test_every_patch_is_registered_and_uninstall_restores_torch() -> None:
    # A fresh interpreter: installing patches torch for the rest of the process.
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    count = int(proc.stdout.split("PATCHES")[1].split()[0])
    # recorder: 4 group functions, 4 DDP attributes, spawn; CPU mode: 8 torch.cuda, the
    # accelerator, modules, data, distributed, the mode; exit codes: 2
    assert count >= 30
