"""The native path for resuming on the layout that wrote a checkpoint: DeepSpeed's own files.

Next to the layout-free files (zoo/checkpoint.py), a checkpoint can hold `native/`: what
`engine.save_checkpoint` writes, with no gather over any group: per tensor-parallel rank and
pipeline stage the module's weights (written once per data-parallel group), and per rank its
ZeRO partition of the fp32 master weights and AdamW moments (under ZeRO-3 also of the
weights). A resume whose layout key (tp, pp, dp, ZeRO stage, precision, pipeline partition)
equals the checkpoint's reads those files back; any other layout reads the layout-free files.

DeepSpeed loads its files with `torch.load(weights_only=False)`, which runs whatever a pickle
says. Here it loads through torch's weights_only unpickler instead, with an allowlist of the
few plain DeepSpeed data classes its files hold: a file that needs anything else is refused.
Two layers: DeepSpeed's checkpoint engine is swapped for one that loads weights-only, and
every `torch.load` made while DeepSpeed loads (its universal-checkpoint and optimizer paths
call `torch.load(weights_only=False)` themselves, past the engine) is forced weights-only too.
Validation also refuses `deepspeed.checkpoint.load_universal` before launch (zoo.engine.raw_keys).
"""
from __future__ import annotations

import contextlib
import pickle
from pathlib import Path

import torch

TAG = "native"
PIPELINE_FORMAT = 2  # the pipeline's layer list: each model's pipeline_layers() (zoo.models.stages)


def enabled(checkpoint, layout) -> bool:
    """checkpoint.native, where set; by default only under ZeRO-3. There each rank's native
    files hold 1/dp of the weights and optimizer states and resuming read them about 2x faster
    than the layout-free files on the 2-core machine; under ZeRO-1 and tp alone it was slower
    (DeepSpeed's model-state file holds every weight of the stage, so a rank reads not much
    less, and torch.load was slower than memory-mapped safetensors), for twice the disk."""
    native = checkpoint.native  # the config's checkpoint section
    return layout.zero_stage == 3 if native is None else native


def layout_key(layout, parallel, dtype: str) -> dict:
    """What must match for one rank's native shard to be this rank's shard. Under pp the
    files are per pipeline layer, so the layer list's format is part of it (checkpoints of
    an older list are read from the layout-free files)."""
    key = {"tp": layout.tp, "pp": layout.pp, "dp": layout.dp, "zero_stage": layout.zero_stage,
           "precision": dtype, "sequence_parallel": parallel.sequence_parallel,
           "partition_method": parallel.partition_method if layout.pp > 1 else None}
    if layout.pp > 1:
        key["pipeline_format"] = PIPELINE_FORMAT
    if layout.cp > 1:  # ZeRO partitions over dp x cp
        key["cp"] = layout.cp
    return key


def save(engine, directory: Path) -> None:
    """Every rank writes its shards to `directory/native/` (collective)."""
    engine.save_checkpoint(str(directory), tag=TAG, client_state={}, save_latest=False)
    for script in ("zero_to_fp32.py", "zero_to_torch.py"):  # DeepSpeed's converters: zoo.export does that
        (directory / script).unlink(missing_ok=True)


def usable(path: Path, state: dict, key: dict) -> bool:
    return (path / TAG).is_dir() and state.get("native") == key


def _safe_globals() -> list:
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    found = [fragment_address, ZeroStageEnum]
    try:  # the loss scaler's state in fp16/bf16 checkpoints, where this DeepSpeed has it
        from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
        found += [LossScaler, DynamicLossScaler]
    except ImportError:
        pass
    return found


class RefusedPickle(pickle.UnpicklingError):
    """A file that needs objects outside the allowlist; the message names the file."""


@contextlib.contextmanager
def weights_only_loading():
    """Inside, every `torch.load` (whoever calls it, whatever `weights_only` it passes)
    unpickles weights-only with the allowlist; a refusal raises RefusedPickle naming the file."""
    original, allowed = torch.load, _safe_globals()

    def load(f, *args, **kwargs):
        kwargs["weights_only"] = True
        try:
            with torch.serialization.safe_globals(allowed):
                return original(f, *args, **kwargs)
        except pickle.UnpicklingError as err:
            raise RefusedPickle(f"{f}: {str(err).splitlines()[0]}") from None

    torch.load = load
    try:
        yield
    finally:
        torch.load = original


class _WeightsOnlyEngine:
    """DeepSpeed's checkpoint engine with loading through torch's weights_only unpickler."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def load(self, path: str, map_location=None):
        with weights_only_loading():
            return torch.load(path, map_location=map_location)


def refused_files(path: Path, rank: int, world: int) -> list:
    """This rank's share (every world-th file) of the native files that the weights-only
    unpickler refuses, each as one line naming the file. Memory-mapped: only the pickles
    are read, not the tensor bytes."""
    found = []
    for f in sorted((path / TAG).rglob("*.pt"))[rank::world]:
        with weights_only_loading():
            try:
                try:
                    torch.load(f, map_location="cpu", mmap=True)
                except RuntimeError:  # a legacy (non-zip) file cannot be memory-mapped
                    torch.load(f, map_location="cpu")
            except RefusedPickle as err:
                found.append(str(err))
    return found


def load(engine, path: Path) -> None:
    """Restore module, optimizer and LR schedule from this rank's native shard."""
    original = engine.checkpoint_engine
    engine.checkpoint_engine = _WeightsOnlyEngine(original)
    try:
        with weights_only_loading():
            loaded, _ = engine.load_checkpoint(str(path), tag=TAG, load_module_strict=True,
                                               load_optimizer_states=True, load_lr_scheduler_states=True)
    finally:
        engine.checkpoint_engine = original
    if loaded is None:
        raise RuntimeError(f"DeepSpeed could not read the native checkpoint in {path / TAG}")
