"""Raw `deepspeed:` keys, checked against DeepSpeed's own config model before launch.

The config zoo generates, with the raw keys merged over it, is built into DeepSpeed's
`DeepSpeedConfig` in the validation pass (its pydantic models refuse unknown keys inside
sections and values out of their types or ranges; its sanity checks run too). Its error
becomes one line naming the key. Top-level keys DeepSpeed never looks up (a misspelled
section) are warned about. `checkpoint.load_universal` is refused first (DeepSpeed's
universal loader unpickles with weights_only=False). The keys zoo derives from its own config (the batch, the ZeRO
stage, the precision) are refused with the zoo key to set instead. DeepSpeed is imported
only when raw keys are given.
"""
from __future__ import annotations

from typing import Any, Dict, List

from zoo.run.errors import ConfigError

OWNED = {  # raw key: the zoo key that sets it
    "train_batch_size": "trainer.global_batch_size",
    "train_micro_batch_size_per_gpu": "trainer.micro_batch_size (or parallel.num_microbatches under pp)",
    "gradient_accumulation_steps": "trainer.global_batch_size and trainer.micro_batch_size (it is derived)",
    "zero_optimization.stage": "parallel.zero_stage (or parallel=zero1|zero2|zero3)",
    "bf16.enabled": "precision=bf16",
    "fp16.enabled": "precision=fp16",
    "gradient_clipping": "optim.grad_clip",
    "scheduler": "optim.schedule (with optim.warmup_steps, optim.min_lr, optim.decay_steps, optim.decay_fraction)",
}


class _Seen(dict):
    """A dict that records the keys looked up in it (DeepSpeed reads its config by key)."""

    def __init__(self, items=(), seen=None):
        super().__init__(items)
        self.seen = set() if seen is None else seen

    def __copy__(self):
        return _Seen(self, self.seen)

    def get(self, key, *default):
        self.seen.add(key)
        return super().get(key, *default)

    def __getitem__(self, key):
        self.seen.add(key)
        return super().__getitem__(key)

    def __contains__(self, key):
        self.seen.add(key)
        return super().__contains__(key)


def _flat(raw: Dict[str, Any], prefix: str = "") -> List[str]:
    out = []
    for k, v in raw.items():
        out += _flat(v, f"{prefix}{k}.") if isinstance(v, dict) else [f"{prefix}{k}"]
    return out


def _pydantic_line(err, raw: Dict[str, Any]) -> str:
    """DeepSpeed's first complaint, with the raw key it is about."""
    first = err.errors()[0]
    field = ".".join(str(part) for part in first.get("loc", ()))
    keys = [k for k in _flat(raw) if k == field or k.endswith("." + field)]
    key = keys[0] if keys else f"{getattr(err, 'title', '')}.{field}"
    return f"deepspeed.{key}={first.get('input')!r}: DeepSpeed says: {first.get('msg', '')}"


def check_raw_keys(cfg, layout) -> List[str]:
    """Raise ConfigError for raw keys DeepSpeed refuses or zoo owns; warnings for the rest."""
    raw = dict(cfg.deepspeed or {})
    if not raw:
        return []
    ds_checkpoint = raw.get("checkpoint") or {}
    if isinstance(ds_checkpoint, dict) and ds_checkpoint.get("load_universal"):  # a path zoo does not guard
        raise ConfigError("deepspeed.checkpoint.load_universal=true is refused: DeepSpeed's universal-checkpoint "
                          "loader unpickles its files with torch.load(weights_only=False), which runs any code a file "
                          "holds; zoo's own checkpoints already resume on any layout (resume=PATH): drop the key")
    owned = [next(o for o in OWNED if k == o or k.startswith(o + ".")) for k in _flat(raw)
             if any(k == o or k.startswith(o + ".") for o in OWNED)]
    if owned:
        raise ConfigError(f"deepspeed.{owned[0]} is set by zoo from its own config: set {OWNED[owned[0]]} instead "
                          f"and drop the raw key")
    from zoo.engine import deepspeed_config, micro_batching

    merged = deepspeed_config(cfg, layout)
    micro, accum = micro_batching(cfg.trainer, cfg.parallel, layout)
    merged["train_batch_size"] = micro * accum  # checked as one rank: DeepSpeed reads the world from torch.distributed
    seen = _Seen(merged)
    try:
        from deepspeed.runtime.config import DeepSpeedConfig
        from pydantic import ValidationError

        DeepSpeedConfig(seen)
    except ValidationError as err:
        raise ConfigError(f"{_pydantic_line(err, raw)}; fix or drop the raw key") from None
    except Exception as err:  # its sanity checks raise AssertionError, ValueError, ...
        raise ConfigError(f"deepspeed: DeepSpeed refuses the config with the raw keys {sorted(raw)}: "
                          f"{str(err).splitlines()[0] if str(err) else type(err).__name__}; fix or drop them") from None
    unread = sorted(k for k in raw if k not in seen.seen)
    return [f"deepspeed.{k} is not a key DeepSpeed reads (a misspelled section?): it has no effect" for k in unread]
