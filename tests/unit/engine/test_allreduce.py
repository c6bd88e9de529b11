from tests.unit.one_rank import run_one_rank

CODE = """
from zoo.engine import skip_single_replica_allreduce

def engine_of(stage):
    model = tiny_net()
    ds = {"train_batch_size": 4, "train_micro_batch_size_per_gpu": 4, "steps_per_print": 10**9,
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}},
          "zero_optimization": {"stage": stage}}
    engine, *_ = deepspeed.initialize(model=model, config=ds, model_parameters=model.parameters())
    return engine

def run(engine):
    calls = []
    real = engine.allreduce_gradients
    engine.allreduce_gradients = lambda *a, **k: calls.append(1) or real(*a, **k)
    return three_steps(engine), len(calls)

reference, calls = run(engine_of(0))
assert calls == 3, calls
lean = engine_of(0)
assert skip_single_replica_allreduce(lean, dp=1)
losses, calls = run(lean)
assert calls == 0, calls
assert losses == reference, (losses, reference)
assert not skip_single_replica_allreduce(engine_of(0), dp=2)
assert not skip_single_replica_allreduce(engine_of(1), dp=1)  # ZeRO's reduction fills its partitions
print("ok")
"""


def test_one_replica_skips_deepspeeds_gradient_allreduce_and_trains_bit_for_bit_the_same():
    """At dp=1, ZeRO-0, fp32 the engine calls no gradient all-reduce (it would flatten, all-reduce
    over one rank and copy back), and three steps give exactly the losses of an engine that does;
    at dp=2 or under ZeRO nothing is switched off."""
    run_one_rank(CODE)
