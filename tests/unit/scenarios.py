"""Hand-built runs of the seed stories and the known causes, as recorded on gloo (2 ranks
unless said otherwise). Each function returns a :class:`~ddpdoctor.trace.model.Run`.
"""

from __future__ import annotations

from ddpdoctor.trace.model import Run

from .factories import TraceBuilder, make_run, ranks

CONN_CLOSED = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] "
               "Connection closed by peer [127.0.0.1]:27060. This is typically caused by a "
               "remote worker crashing.")
TIMEOUT = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] "
           "Timed out waiting 15000ms for recv operation to complete")


def _linear(world: int = 2) -> list[TraceBuilder]:
    """DDP(torch.nn.Linear(1, 1)): no buffers, one bucket of 2 parameters."""
    bs = ranks(world)
    for b in bs:
        b.ddp_init(params=2, numel=2, buffers=False)
    return bs


def seed000_nograd() -> Run:
    """Rank 0 evaluates through the DDP wrapper under no_grad after epoch 1 and at the end."""
    bs = ranks(2)
    for b in bs:
        b.ddp_init().train(3)
    bs[0].forward(line=63, function="evaluate", grad=False)
    bs[0].backward()  # rank 0's next training backward (its forward skipped the buffers)
    bs[1].step()
    bs[0].train(2)
    bs[1].train(2)
    bs[0].forward(line=63, function="evaluate", grad=False)
    bs[0].fail_last().raise_("RuntimeError", CONN_CLOSED, line=63, function="evaluate",
                             internal=True)
    bs[1].finish()
    return make_run(*bs)


def extra_step_without_buffers() -> Run:
    """pytorch/examples' ddp/example.py (a model without buffers) with one more training step
    on rank 0 alone, from another function: its bucket-rebuild broadcast waits."""
    bs = ranks(2)
    for b in bs:
        b.ddp_init(buffers=False).train(1, buffers=False)
    bs[0].forward(line=51, function="demo_basic", buffers=False)
    bs[0].pend_last()
    bs[1].finish()
    return make_run(*bs)


def eval_at_end_only() -> Run:
    """Rank 0 alone evaluates through the DDP wrapper after the last epoch; rank 1 finished."""
    bs = ranks(2)
    for b in bs:
        b.ddp_init().train(3)
    bs[0].forward(line=63, function="evaluate", grad=False)
    bs[0].pend_last()
    bs[1].finish()
    return make_run(*bs)


def seed001_case2() -> Run:
    """Rank 1 has one more batch, no join: it dies when rank 0 leaves."""
    bs = _linear()
    bs[0].train(5, (2,), buffers=False).finish()
    bs[1].train(6, (2,), buffers=False).fail_last()
    bs[1].raise_("RuntimeError", CONN_CLOSED, line=21, internal=True)
    return make_run(*bs)


def seed001_case3() -> Run:
    """A barrier inside the loop, rank 1 has one more batch."""
    bs = _linear()
    for i in range(6):
        for b in bs:
            if b.rank == 0 and i == 5:
                continue
            b.step((2,), buffers=False)
            if not (b.rank == 1 and i == 5):
                b.user("barrier", line=22)
    bs[0].finish()
    bs[1].fail_last().raise_("RuntimeError", CONN_CLOSED, line=21, internal=True)
    return make_run(*bs)


def seed001_case4() -> Run:
    """A barrier inside ``with model.join():``; rank 1 has one more batch."""
    bs = _linear()
    for _ in range(5):
        for b in bs:
            b.step((2,), buffers=False, join=True, authority=1)
            b.user("barrier", line=22)
    bs[1].step((2,), buffers=False, join=True, authority=1)
    bs[0].join_shadow((2,), buffers=False)
    bs[1].user("barrier", line=22).fail_last()
    bs[0].coll("all_reduce", "join.num_nonjoined", reduce_op="SUM", line=18)
    bs[0].fail_last()
    for b, line in ((bs[0], 18), (bs[1], 22)):
        b.raise_("RuntimeError", TIMEOUT, line=line, internal=True)
    return make_run(*bs)


def seed001_case5() -> Run:
    """A barrier after an uneven loop (no join)."""
    bs = _linear()
    bs[0].train(5, (2,), buffers=False).user("barrier", line=32).pend_last()
    bs[1].train(6, (2,), buffers=False).pend_last()
    return make_run(*bs, stopped_for_hang=True)


def seed001_join_healthy(extra_barrier: bool = False) -> Run:
    """Cases 1 and 6: uneven inputs under join() (case 6: a barrier after the join block)."""
    bs = _linear()
    for _ in range(5):
        for b in bs:
            b.step((2,), buffers=False, join=True, authority=1)
    bs[1].step((2,), buffers=False, join=True, authority=1)
    bs[0].join_shadow((2,), buffers=False)
    for b in bs:
        b.join_end(last_joiner=1, numel=2)
        if extra_barrier:
            b.user("barrier", line=40)
        b.finish()
    return make_run(*bs)


def seed003_crash() -> Run:
    """Rank 1 raises in its third iteration; rank 0 loses its peer in the bucket all-reduce."""
    bs = _linear()
    for b in bs:
        b.train(2, (2,), buffers=False)
    bs[1].raise_("ValueError", "Simulated error in process 1", line=8, function="<module>")
    bs[0].step((2,), buffers=False).fail_last()
    bs[0].raise_("RuntimeError", CONN_CLOSED, line=9, function="<module>", internal=True)
    return make_run(*bs)


def logging_reduce_on_rank0() -> Run:
    """``if rank == 0: dist.reduce(loss, dst=0)`` inside the training loop (seed 002 gone
    wrong)."""
    bs = ranks(2)
    for b in bs:
        b.ddp_init().train(2)
    bs[0].user("reduce", root=0, reduce_op="SUM", line=45).pend_last()
    bs[1].step().pend_last()
    return make_run(*bs, stopped_for_hang=True)


def nan_skip() -> Run:
    """``if torch.isnan(loss): continue`` before the loss all-reduce: rank 1 skips it at step
    3, and its next gradient all-reduce meets rank 0's loss all-reduce."""
    bs = ranks(2)
    for b in bs:
        b.ddp_init()
        for _ in range(2):
            b.step().user("all_reduce", shapes=[[1]], reduce_op="SUM", line=45)
        b.step()
    bs[0].user("all_reduce", shapes=[[1]], reduce_op="SUM", line=45).pend_last()
    bs[1].step().pend_last()
    return make_run(*bs, stopped_for_hang=True)


def micro_batch_skip() -> Run:
    """A sharded job's own collectives (no DDP): each micro-batch all-reduces its statistics
    at line 30, then its gradients at line 34; rank 1 skips one micro-batch's statistics (an
    empty batch), so its gradient all-reduce meets rank 0's statistics all-reduce."""
    bs = ranks(2)
    for b in bs:
        for _ in range(3):
            b.user("all_reduce", shapes=[[8]], line=30).user("all_reduce", shapes=[[64]],
                                                             line=34)
    bs[0].user("all_reduce", shapes=[[8]], line=30).pend_last()
    bs[1].user("all_reduce", shapes=[[64]], line=34).pend_last()
    return make_run(*bs, stopped_for_hang=True)


def logging_reduce_no_buffers() -> Run:
    """The same with a model without buffers: its first forward issues nothing, so rank 1's
    next collective is the bucket rebuild of iteration 2, from the forward line."""
    bs = _linear()
    for b in bs:
        b.step((2,), buffers=False)
    bs[0].user("reduce", root=0, reduce_op="SUM", line=60).pend_last()
    bs[1].forward(buffers=False).pend_last()
    return make_run(*bs, stopped_for_hang=True)


def checkpoint_barrier_on_rank0() -> Run:
    """``if rank == 0: torch.save(...); dist.barrier()`` at the end; rank 1 finished."""
    bs = ranks(2)
    for b in bs:
        b.ddp_init().train(3)
    bs[0].user("barrier", line=70).pend_last()
    bs[1].finish()
    return make_run(*bs, stopped_for_hang=True)


def group_inversion() -> Run:
    """Rank 0 all-reduces on group 1 then 2; rank 1 on group 2 then 1."""
    bs = ranks(2)
    for b in bs:
        b.new_group("1", [0, 1]).new_group("2", [0, 1]).user("all_reduce", shapes=[[3]])
    bs[0].user("all_reduce", group="1", shapes=[[3]], line=9).pend_last()
    bs[1].user("all_reduce", group="2", shapes=[[3]], line=12).pend_last()
    return make_run(*bs, stopped_for_hang=True)


def rank_dependent_shape() -> Run:
    """``dist.all_reduce(torch.tensor(local_counts))`` with a per-rank length."""
    bs = ranks(2)
    for b in bs:
        b.ddp_init().train(2)
    bs[0].user("all_reduce", shapes=[[3]], line=50).pend_last()
    bs[1].user("all_reduce", shapes=[[4]], line=50).pend_last()
    return make_run(*bs, stopped_for_hang=True)


def rank_dependent_dtype() -> Run:
    """``dist.all_reduce(torch.tensor(np.mean(losses)))`` on rank 0 (float64), a float32
    tensor on rank 1: the same shape."""
    bs = ranks(2)
    for b in bs:
        b.ddp_init().train(2)
    bs[0].user("all_reduce", shapes=[[1]], dtypes=["float64"], line=50).pend_last()
    bs[1].user("all_reduce", shapes=[[1]], dtypes=["float32"], line=50).pend_last()
    return make_run(*bs, stopped_for_hang=True)


def broadcast_root_mismatch() -> Run:
    """``dist.broadcast(t, src=rank)``."""
    bs = ranks(2)
    for b in bs:
        b.user("broadcast", root=b.rank, shapes=[[10]], line=14).pend_last()
    return make_run(*bs, stopped_for_hang=True)


def reduce_op_mismatch() -> Run:
    bs = ranks(2)
    for b in bs:
        b.user("all_reduce", reduce_op="MAX" if b.rank else "SUM", line=14)
    for b in bs:
        b.finish()
    return make_run(*bs)


def model_mismatch() -> Run:
    """A rank-dependent layer size: DDP's construction check sees different shapes."""
    bs = ranks(2)
    bs[0].ddp_init(params=6)
    bs[1].ddp_init(params=7)
    return make_run(*bs)


def uneven_loop_without_ddp() -> Run:
    """A plain loop of all-reduces, one iteration longer on rank 1."""
    bs = ranks(2)
    for b in bs:
        for _ in range(3 + b.rank):
            b.user("all_reduce", shapes=[[8]], line=30)
    bs[0].finish()
    bs[1].pend_last()
    return make_run(*bs, stopped_for_hang=True)
