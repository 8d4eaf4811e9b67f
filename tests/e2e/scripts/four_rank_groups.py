"""Four ranks, two groups over all of them: ranks 0-1 reduce on the gradient group first,
ranks 2-3 on the metric group first. Each half waits in the group the other half is not in."""

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
grad_group = dist.new_group([0, 1, 2, 3])
metric_group = dist.new_group([0, 1, 2, 3])
grads, metrics = torch.ones(8), torch.ones(2)
if rank < 2:
    dist.all_reduce(grads, group=grad_group)  # ddpdoctor: grads_first
    dist.all_reduce(metrics, group=metric_group)
else:
    dist.all_reduce(metrics, group=metric_group)  # ddpdoctor: metrics_first
    dist.all_reduce(grads, group=grad_group)
dist.destroy_process_group()
