"""Where DDP and the join protocol issue collectives: the functions that say *why* a collective
ran (torch's own Python frames above it), and the label each one gives it.

Used twice: by the runtime, on the live Python stack of the caller (``runtime/labels.py``,
which also checks the text of a line where one function issues several collectives), and by
the flight-recorder reader, on the frames a dump holds (:func:`label_from_frames`). Standard
library only.
"""

from __future__ import annotations

USER = "user"
BUCKET = "ddp.bucket"
UNUSED_PARAMS = "ddp.unused_params"
# Collectives a framework issued on the user's behalf, at a call of the user's that the record
# names as its site (runtime/on_behalf.py): the analysis takes them as the user's own calls.
LIGHTNING_EPOCH_SYNC = "lightning.epoch_sync"
LIGHTNING_STEP_SYNC = "lightning.step_sync"
ON_BEHALF = frozenset({LIGHTNING_EPOCH_SYNC, LIGHTNING_STEP_SYNC})


def is_user_call(label: str | None) -> bool:
    """Whether a collective with ``label`` came from a call in the user's code: their own
    ``torch.distributed`` call, or a framework's on behalf of one (Lightning's ``self.log``)."""
    return label == USER or label in ON_BEHALF

# (path suffix, function, text the executing line must contain or None, label, priority).
# When several rules match frames of one stack, the highest priority wins: the join protocol
# reuses DDP helpers (its final model sync calls the init-time parameter sync), so join
# labels outrank the helpers they call.
RULES: list[tuple[str, str, str | None, str, int]] = [
    ("distributed/algorithms/join.py", "_get_num_nonjoined_procs", None, "join.num_nonjoined", 90),
    ("distributed/algorithms/join.py", "_notify_procs_to_terminate", None, "join.terminate", 90),
    ("distributed/algorithms/join.py", "notify_join_context", None, "join.notify", 90),
    ("nn/parallel/distributed.py", "_match_all_reduce_for_bwd_pass", None, "join.shadow_bucket",
     90),
    ("nn/parallel/distributed.py", "_match_unused_params_allreduce", None, "join.unused_params",
     90),
    ("nn/parallel/distributed.py", "_sync_final_model", None, "join.final_model", 90),
    ("nn/parallel/distributed.py", "_find_common_rank", None, "join.find_common_rank", 90),
    ("nn/parallel/distributed.py", "_check_global_requires_backward_grad_sync", None,
     "join.grad_sync", 90),
    ("nn/parallel/distributed.py", "_pre_forward", "_rebuild_buckets", "ddp.rebuild_buckets", 80),
    ("nn/parallel/distributed.py", "main_hook", "_rebuild_buckets", "ddp.rebuild_buckets", 80),
    ("nn/parallel/distributed.py", "_sync_buffers", None, "ddp.buffers", 70),
    ("nn/parallel/distributed.py", "_sync_module_buffers", None, "ddp.buffers", 70),
    ("distributed/utils.py", "_verify_param_shape_across_processes", None,
     "ddp.init.verify_params", 60),
    ("distributed/utils.py", "_sync_module_states", None, "ddp.init.sync_params", 50),
    ("distributed/utils.py", "_sync_params_and_buffers", None, "ddp.init.sync_params", 50),
    ("nn/parallel/distributed.py", "__init__", None, "ddp.init", 40),
    ("nn/modules/_functions.py", "forward", None, "syncbn", 30),
    ("nn/modules/_functions.py", "backward", None, "syncbn", 30),
    ("distributed/algorithms/ddp_comm_hooks/default_hooks.py", "*", None, BUCKET, 30),
]
API_FILE = "distributed/distributed_c10d.py"
BACKWARD = ("autograd/graph.py", "_engine_run_backward")
# Read from outside by ``ddpdoctor attach`` (launch/discover.py, launch/spy.py,
# analysis/stacks.py): torch's spawn wrapper, whose local ``i`` is the worker's index (its
# rank); the functions of a rank still in the rendezvous; torchrun's agent's command line.
SPAWN_WRAP = ("multiprocessing/spawn.py", "_wrap")
INIT_FUNCTIONS = (("distributed/distributed_c10d.py", "init_process_group"),
                  ("distributed/distributed_c10d.py", "_store_based_barrier"),
                  ("distributed/rendezvous.py", "rendezvous"),
                  ("distributed/rendezvous.py", "_create_c10d_store"),
                  ("distributed/device_mesh.py", "init_device_mesh"))
AGENT_MODULES = ("torch.distributed.run", "torch.distributed.launch")



def label_from_frames(frames: list[tuple[str, str]]) -> str:
    """The label of a collective whose stack holds ``frames`` ((file, function) pairs,
    innermost first): the highest-priority rule that matches, a gradient bucket when the
    autograd engine issued it without any collective API of ``torch.distributed`` on the
    stack, else ``user``. A rule that needs the text of the executing line applies only to the
    innermost frame (the function that issued the collective itself)."""
    label, prio, api, backward = None, -1, False, False
    for i, (file, function) in enumerate(frames):
        norm = file.replace("\\", "/")
        for suffix, fn, text, rule_label, rule_prio in RULES:
            if (text is None or i == 0) and norm.endswith(suffix) and \
                    fn in (function, "*") and rule_prio > prio:
                label, prio = rule_label, rule_prio
        api = api or (norm.endswith(API_FILE) and not function.startswith("_"))
        backward = backward or (norm.endswith(BACKWARD[0]) and function == BACKWARD[1])
    if label is not None:
        return label
    return BUCKET if backward and not api else USER
