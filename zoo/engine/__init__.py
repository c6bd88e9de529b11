"""DeepSpeed's one home: everything zoo asks of DeepSpeed goes through this package.

- `config`: the DeepSpeed config, generated from zoo's; `raw_keys`: the check of raw
  `deepspeed:` keys before launch;
- `initialize`: the engine over a built model (zoo's `optimizers` and `schedules`);
- `state`: the interface over a built engine that checkpoints, the monitor and the trainer
  use (a parameter's fp32 value and optimizer state, the loss scale, the gradient norm,
  where ZeRO partitions sit);
- `pipeline`: DeepSpeed's PipelineModule with zoo's layer list, and its instruction hooks;
- `native`: DeepSpeed's own per-rank checkpoint files, loaded without running pickles;
- `comm`: DeepSpeed's communication backend functions the monitor times;
- `lean_start`: what a start skips of DeepSpeed's import;
- `versions`: the DeepSpeed versions this was tested with and the private names it relies on
  (tests/unit/engine checks both for the installed version, and that no module outside this
  package names one of them).
"""
from zoo.engine.config import deepspeed_config, micro_batching, optimizer_config, schedule_steps
from zoo.engine.initialize import initialize_engine, param_groups, skip_single_replica_allreduce

__all__ = ["deepspeed_config", "initialize_engine", "micro_batching", "optimizer_config", "param_groups",
           "schedule_steps", "skip_single_replica_allreduce"]
