"""The preamble of a subprocess that runs megatron-core's parallel_state on CPU with
torch.distributed's group calls stubbed (initialize_model_parallel only needs world sizes and
rank lists to build its groups; every group sees rank 0). Shared by tests/test_etp.py and
tests/test_ep_fold.py; the stubs must stay in their subprocess."""

GROUP_STUBS = r'''
import json, sys, warnings
warnings.filterwarnings("ignore")
import torch.distributed as dist

class Group:
    def __init__(self, ranks): self.ranks = list(ranks)
    def size(self): return len(self.ranks)
    def rank(self): return 0

world = [1]
dist.is_initialized = lambda: True
dist.get_world_size = lambda group=None: world[0] if group is None else group.size()
dist.get_rank = lambda group=None: 0
dist.new_group = lambda ranks=None, *a, **k: Group(range(world[0]) if ranks is None else ranks)
dist.get_process_group_ranks = lambda g: g.ranks
from megatron.core import parallel_state as ps
'''
