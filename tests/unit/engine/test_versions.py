"""The installed DeepSpeed is one zoo was tested with, and has every internal zoo relies on
(zoo.engine.versions) with the signature zoo calls it with: an upgrade that moved one fails
here, by name."""
from __future__ import annotations

import importlib
import importlib.util
import inspect
import re

import pytest

from tests.conftest import REPO
from tests.unit.one_rank import run_one_rank
from zoo.engine import versions


def _version(text: str):
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def test_the_installed_deepspeed_is_in_the_tested_range_and_pyproject_pins_it():
    import deepspeed

    low, high = re.fullmatch(r">=([\d.]+),<([\d.]+)", versions.TESTED).groups()
    assert _version(low) <= _version(deepspeed.__version__) < _version(high), deepspeed.__version__
    assert f'"deepspeed{versions.TESTED}"' in (REPO / "pyproject.toml").read_text()


@pytest.mark.parametrize("module, name, params", versions.RELIED_ON, ids=[f"{m}.{n}" for m, n, _ in versions.RELIED_ON])
def test_each_internal_exists_with_the_parameters_zoo_passes(module, name, params):
    parts = module.split(".")
    for i in range(len(parts), 0, -1):  # the longest importable prefix, then attributes (a class)
        try:
            spec = importlib.util.find_spec(".".join(parts[:i]))
        except ModuleNotFoundError:  # a name inside a module that is not a package
            spec = None
        if spec is not None:
            owner = importlib.import_module(".".join(parts[:i]))
            for attr in parts[i:]:
                owner = getattr(owner, attr)
            break
    found = getattr(owner, name, None)
    assert found is not None, f"{module} has no {name} in this DeepSpeed"
    if params is not None:
        names = list(inspect.signature(found).parameters)
        assert all(p in names for p in params), f"{module}.{name}{inspect.signature(found)} lacks one of {params}"


def test_the_class_level_hooks_exist():
    from deepspeed.pipe import PipelineModule
    from deepspeed.runtime.bf16_optimizer import BF16_Optimizer
    from deepspeed.runtime.engine import DeepSpeedEngine
    from deepspeed.runtime.pipe.engine import PipelineEngine
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    assert list(inspect.signature(PipelineModule._find_layer_type).parameters) == ["self", "layername"]
    assert list(inspect.signature(PipelineModule._count_layer_params).parameters) == ["self"]
    assert isinstance(PipelineEngine._INSTRUCTION_MAP, dict) and PipelineEngine._INSTRUCTION_MAP
    assert callable(DeepSpeedEngine.clip_fp32_gradients) and callable(DeepSpeedEngine.get_global_grad_norm)
    for optimizer in (DeepSpeedZeroOptimizer, BF16_Optimizer):
        assert callable(optimizer._lazy_init_hp_params_optimizer_state), optimizer
    for module in versions.MUON_MODULES:
        assert importlib.util.find_spec(module) is not None, module


def test_the_instance_attributes_exist_on_built_engines():
    """Engines at ZeRO-0, 1 and 3 and a pipeline engine, one rank: the attributes zoo reads
    or sets on them and on their parameters."""
    run_one_rank("""
from deepspeed.pipe import LayerSpec, PipelineModule
from deepspeed.comm import comm as ds_comm
import deepspeed.ops
from zoo.engine import state

def build(stage, model=None):
    model = model or tiny_net()
    config = {"train_batch_size": 4, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}},
              "zero_optimization": {"stage": stage}, "gradient_clipping": 1.0}
    return deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)[0]

zero0 = build(0)
for name in ("checkpoint_engine", "enable_backward_allreduce", "clip_fp32_gradients"):
    assert hasattr(zero0, name), name
zero1 = build(1)
three_steps(zero1)
assert hasattr(zero1.optimizer, "cur_scale") and hasattr(zero1.optimizer, "_hp_optimizer_states_linked")
state.ensure_optimizer_state(zero1)
assert all(hasattr(p, "_hp_mapping") for p in zero1.module.parameters())
zero3 = build(3)
three_steps(zero3)
assert hasattr(zero3.optimizer, "fp32_partitioned_groups_flat")
assert all(hasattr(p, name) for p in zero3.module.parameters() for name in ("ds_id", "ds_tensor", "ds_shape"))
first = next(zero3.module.parameters())
assert state.optimizer_step(zero3) == 3 and state.held_range(first) == (0, 64, False)
assert state.fp32_held(zero3, first).shape == (64,) and state.optimizer_held(zero3, first, "exp_avg").shape == (64,)
assert hasattr(first, "ds_numel") and hasattr(first, "ds_process_group") and first.ds_tensor.ds_numel == 64
fragment = next(zero1.module.parameters())._hp_mapping
assert fragment.lp_fragment_address.numel == 64 and fragment.get_hp_fragment().numel() == 64
pipe = PipelineModule(layers=[LayerSpec(torch.nn.Linear, 8, 8)], num_stages=1, loss_fn=lambda out, y: out.sum())
assert hasattr(pipe, "_layer_specs") and pipe._layer_specs[0].module_args == (8, 8)
engine = build(0, pipe)
assert hasattr(engine, "pipeline_enable_backward_allreduce")
assert ds_comm.cdb is not None and hasattr(ds_comm.cdb, "all_gather_function")
assert hasattr(ds_comm.cdb, "reduce_scatter_function") and "__compatible_ops__" in vars(deepspeed.ops)
from zoo.engine import half
assert half.enable_on_cpu()  # fp16 engines: where their loss scalers keep their state
def build_fp16(stage):
    config = {"train_batch_size": 4, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}},
              "zero_optimization": {"stage": stage}, "fp16": {"enabled": True, "initial_scale_power": 8}}
    model = tiny_net()
    return deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)[0]
for stage, fields in ((0, ("cur_scale", "cur_iter", "last_overflow_iter")),
                      (1, ("cur_scale", "cur_iter", "last_overflow_iter", "cur_hysteresis"))):
    engine = build_fp16(stage)
    holder = engine.optimizer.loss_scaler if stage else engine.optimizer.loss_scale_config
    assert all(hasattr(holder, f) for f in fields), (stage, fields)
    engine.backward(engine(X.half()).float().square().mean())
    engine.step()
    assert state.scaler_state(engine)["cur_iter"] == 1 and state.loss_scale(engine) == 256, state.scaler_state(engine)
    assert hasattr(engine, "skipped_steps")
print("ok")
""")
