"""zshard: train any torch.nn.Module through zshard's shard servers.

A DeepSpeed script changes little::

    import zshard
    engine, optimizer, _, scheduler = zshard.initialize(
        model=model, config="ds_config.json")   # ZSHARD_COORDINATOR
    for batch in data:
        loss = engine(batch)
        engine.backward(loss)
        engine.step()

Run it with ``zshard launch --shards 4 --trainers 2 -- python train.py``.
"""

from .engine import (ZShardEngine, ZShardOptimizer, ZShardScheduler,
                     initialize)
from .errors import RolledBack, ZShardError
from .grouping import make_groups
from .materialize import empty_parameters

__all__ = ["initialize", "ZShardEngine", "ZShardOptimizer",
           "ZShardScheduler", "ZShardError", "RolledBack", "make_groups",
           "empty_parameters"]
