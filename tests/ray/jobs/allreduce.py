"""A rank of a torchrun job across the Ray tests' two nodes: gloo all_reduce of rank + 1 (sum 3.0 of 2)."""

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
total = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(total)
print(f"rank {dist.get_rank()} of {dist.get_world_size()}: sum {total.item()}", flush=True)
dist.destroy_process_group()
