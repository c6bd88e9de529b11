def test_deepspeed_builds_no_shm_op_for_training():
    """DeepSpeed's torch backend asks build_shm_op() at start: after the switch it is None
    (neither built nor loaded), and the switch names an op DeepSpeed has."""
    import deepspeed.ops
    from deepspeed.comm.torch import build_shm_op

    from zoo import lean_start

    before = dict(deepspeed.ops.__compatible_ops__)
    try:
        lean_start.skip_shm_comm_op()
        changed = {k for k in before if before[k] != deepspeed.ops.__compatible_ops__[k]}
        assert changed <= {"deepspeed_shm_comm"} and deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] is False
        assert build_shm_op() is None
    finally:
        deepspeed.ops.__compatible_ops__.clear()
        deepspeed.ops.__compatible_ops__.update(before)
