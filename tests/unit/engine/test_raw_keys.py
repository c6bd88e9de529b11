"""Raw `deepspeed:` keys are checked against DeepSpeed's own config model in the validation pass."""
from __future__ import annotations

import pytest

from tests.unit.config.test_config import check, composed
from zoo.run.errors import ConfigError


@pytest.mark.parametrize("overrides, message", [
    (["+deepspeed.zero_optimization.stage=7"], r"deepspeed.zero_optimization.stage is set by zoo .* set parallel.zero_stage"),
    (["+deepspeed.train_batch_size=64"], r"deepspeed.train_batch_size is set by zoo .* set trainer.global_batch_size"),
    (["+deepspeed.bf16.enabled=true"], r"set precision=bf16 instead"),
    (["+deepspeed.zero_optimization.bogus=1"], r"deepspeed.zero_optimization.bogus=1: DeepSpeed says: Extra inputs are not permitted"),
    (["parallel=zero2", "+deepspeed.zero_optimization.reduce_bucket_size=-5"],
     r"deepspeed.zero_optimization.reduce_bucket_size=-5: DeepSpeed says: Input should be greater than 0"),
    (["+deepspeed.bf16.immediate_grad_update=maybe"], r"deepspeed.bf16.immediate_grad_update='maybe': DeepSpeed says"),
])
def test_raw_keys_deepspeed_refuses_are_one_line_naming_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message) as err:
        check(composed(*overrides))
    assert "\n" not in str(err.value)


def test_good_raw_keys_pass_and_unread_ones_warn():
    assert not [w for w in check(composed("parallel=zero2", "+deepspeed.zero_optimization.reduce_bucket_size=1000000",
                                          "+deepspeed.wall_clock_breakdown=true")) if "deepspeed" in w]
    warnings = check(composed("+deepspeed.zero_optimisation.stage=1"))
    assert "deepspeed.zero_optimisation is not a key DeepSpeed reads (a misspelled section?): it has no effect" in warnings


def test_no_raw_keys_import_no_deepspeed():
    import subprocess
    import sys

    code = ("import sys; from tests.unit.config.test_config import check, composed; check(composed('parallel=zero1')); "
            "print('deepspeed' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "False", out.stderr[-2000:]
