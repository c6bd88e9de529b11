"""The DeepSpeed zoo was tested with, and what of DeepSpeed's internals it relies on.

pyproject.toml pins DeepSpeed to TESTED. Everything below is reached from this package only
(tests/unit/engine/test_one_home.py fails on such a name anywhere else in zoo/, data_pipelines/
or benchmarks/), and tests/unit/engine/test_versions.py checks, for the installed DeepSpeed,
that each exists with the signature zoo calls it with: an upgrade that moved one fails there,
naming it, not inside a checkpoint or a run.
"""
from __future__ import annotations

TESTED = ">=0.19.8,<0.20"

# DeepSpeed's modules that are documented API: importable from anywhere in zoo.
PUBLIC_MODULES = (
    "deepspeed",  # initialize, init_distributed, zero.GatheredParameters
    "deepspeed.pipe",  # PipelineModule, LayerSpec, TiedLayerSpec
    "deepspeed.comm",
    "deepspeed.accelerator",
    "deepspeed.runtime.pipe.topology",  # ProcessTopology, PipelineParallelGrid: the pipeline docs' topology
)

# Attributes of DeepSpeed's objects that are not its API, each with where it lives and what
# zoo does with it (zoo.engine's modules).
PRIVATE_ATTRIBUTES = {
    "ds_id": "a ZeRO-3 parameter's id: the parameter is partitioned (state.is_zero3)",
    "ds_tensor": "a ZeRO-3 parameter's partition on this rank (state.held)",
    "ds_shape": "a ZeRO-3 parameter's unpartitioned shape (state.full_shape)",
    "ds_numel": "a ZeRO-3 partition's length, padding included (state.held_range)",
    "ds_process_group": "the group a ZeRO-3 parameter is partitioned over (state.held_range)",
    "lp_fragment_address": "where a ZeRO-1/2 fragment sits in its flattened parameter (state.held_range)",
    "_hp_mapping": "a ZeRO-1/2 or bf16 parameter's link to its fp32 fragment (state.has_fp32_fragment)",
    "_hp_optimizer_states_linked": "ZeRO-1/2 and bf16: whether the fragments link the optimizer state",
    "_lazy_init_hp_params_optimizer_state": "ZeRO-1/2 and bf16: link the fragments to the optimizer state",
    "fp32_partitioned_groups_flat": "ZeRO-3's flat fp32 partitions (state.ensure_optimizer_state)",
    "cur_scale": "the fp16 optimizers' loss scale (state.loss_scale, set_loss_scale)",
    "loss_scaler": "the ZeRO optimizers' loss scaler (state.scaler_state)",
    "loss_scale_config": "the ZeRO-0 fp16 optimizers' loss-scaler state (state.scaler_state)",
    "fp32_groups": "the ZeRO-0 fp16 optimizer's fp32 master weights (half.undo_unfused_init_step)",
    "fp16_groups": "the ZeRO-0 fp16 optimizer's fp16 parameters (half.undo_unfused_init_step)",
    "cur_iter": "a loss scaler's iteration count (state.scaler_state)",
    "last_overflow_iter": "a loss scaler's last overflow's iteration (state.scaler_state)",
    "cur_hysteresis": "the ZeRO loss scaler's overflows left before it halves (state.scaler_state)",
    "_global_grad_norm": "the engine's kept gradient norm (state.keep_fp32_grad_norm)",
    "clip_fp32_gradients": "the engine's fp32 clipping, replaced to count every stage (state.keep_fp32_grad_norm)",
    "ds_pipe_replicated": "a tied weight's copy on a later pipeline stage (state.fp32_grad_norm, pipe_hooks)",
    "_reduce_non_expert_gradients": "the engine's dense gradient reduction (initialize.pipeline_reduces_over_context)",
    "allreduce_no_retain": "the engine's bucketed all-reduce (initialize.pipeline_reduces_over_context)",
    "_index_tied_modules": "PipelineModule's tied-weight groups (pipe_hooks.LayerListPipelineModule)",
    "tied_modules": "PipelineModule's tied layers (pipe_hooks.LayerListPipelineModule)",
    "tied_weight_attrs": "PipelineModule's tied weights' names (pipe_hooks.LayerListPipelineModule)",
    "enable_backward_allreduce": "the engine's gradient all-reduce switch (initialize.skip_single_replica_allreduce)",
    "pipeline_enable_backward_allreduce": "the pipeline engine's switch (initialize.skip_single_replica_allreduce)",
    "_INSTRUCTION_MAP": "the pipeline engine's instruction table (pipeline.wrap_instructions)",
    "_layer_specs": "PipelineModule's layer specs (pipeline.LayerListPipelineModule)",
    "_find_layer_type": "PipelineModule's type:REGEX partition hook (pipeline.LayerListPipelineModule)",
    "_count_layer_params": "PipelineModule's parameter-count partition hook (pipeline.LayerListPipelineModule)",
    "checkpoint_engine": "the engine's checkpoint reader, wrapped to load weights-only (native.load)",
    "cdb": "deepspeed.comm's backend (comm.backend_functions)",
    "all_gather_function": "the backend's all-gather, taken from torch at its creation (comm.backend_functions)",
    "reduce_scatter_function": "the backend's reduce-scatter (comm.backend_functions)",
    "__compatible_ops__": "deepspeed.ops' table of buildable ops (lean_start.skip_shm_comm_op)",
}

# Functions and classes of DeepSpeed's internal modules (and its fragment API) zoo calls: (module, name, the
# parameters zoo passes, by name; None: not called, only used as a class or a value).
RELIED_ON = (
    ("deepspeed.runtime.utils", "is_model_parallel_parameter", ("p",)),
    ("deepspeed.utils.bwc", "bwc_tensor_model_parallel_rank", ("mpu",)),
    ("deepspeed.runtime.engine", "split_half_float_double_sparse", ("tensors",)),
    ("deepspeed.runtime.pipe.module", "PipelineParallelGrid", None),
    ("deepspeed.runtime.pipe.schedule", "ForwardPass", None),
    ("deepspeed.runtime.pipe.schedule", "BackwardPass", None),
    ("deepspeed.runtime.pipe.schedule", "OptimizerStep", None),
    ("deepspeed.runtime.pipe.schedule", "ReduceGrads", None),
    ("deepspeed.runtime.pipe.schedule", "ReduceTiedGrads", None),
    ("deepspeed.runtime.pipe.schedule", "LoadMicroBatch", None),
    ("deepspeed.runtime.pipe.schedule", "SendActivation", None),
    ("deepspeed.runtime.pipe.schedule", "RecvActivation", None),
    ("deepspeed.runtime.pipe.schedule", "SendGrad", None),
    ("deepspeed.runtime.pipe.schedule", "RecvGrad", None),
    ("deepspeed.runtime.pipe.engine", "PipelineEngine", None),
    ("deepspeed.runtime.lr_schedules", "WarmupCosineLR", ("optimizer", "total_num_steps", "warmup_min_ratio",
                                                          "warmup_num_steps", "cos_min_ratio", "warmup_type")),
    ("deepspeed.runtime.zero.utils", "ZERO_SUPPORTED_OPTIMIZERS", None),
    ("deepspeed.runtime.config", "DeepSpeedConfig", ("config", "mpu")),
    ("deepspeed.runtime.zero.config", "ZeroStageEnum", None),
    ("deepspeed.utils.tensor_fragment", "fragment_address", None),
    ("deepspeed.runtime.fp16.loss_scaler", "DynamicLossScaler", None),
    ("deepspeed.runtime.fp16.loss_scaler", "LossScaler", None),
    ("deepspeed.runtime.fp16.unfused_optimizer", "FP16_UnfusedOptimizer", None),
    ("deepspeed.runtime.fp16.fused_optimizer", "FP16_Optimizer", None),
    ("deepspeed.utils", "safe_set_full_fp32_param", ("param", "value")),
    ("deepspeed.utils", "safe_set_full_optimizer_state", ("param", "value", "optim_state_key")),
    ("deepspeed.utils", "safe_get_local_fp32_param", ("param",)),
    ("deepspeed.utils", "safe_get_local_optimizer_state", ("param", "optim_state_key")),
    ("deepspeed.utils.tensor_fragment.tensor_fragment", "get_hp_fragment", ("optim_state_key",)),
    ("deepspeed.utils.tensor_fragment.tensor_fragment", "get_optim_state_fragment", ("key",)),
)

# Modules lean_start replaces with stand-ins (they must exist for the stand-ins to stand in).
MUON_MODULES = ("deepspeed.runtime.zero.muon.muon_optimizer", "deepspeed.runtime.zero.muon.original_muon")
