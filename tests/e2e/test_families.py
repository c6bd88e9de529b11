"""BERT and the CNN through the real entry point: every allowed family x parallel preset runs
a few steps on CPU (gloo) and reports its metrics; BERT at tp=2 and the CNN at pp=2 match
their single-process runs step by step; refused combinations exit 2 with their reason; the
CNN also reads an image folder and a Hugging Face image dataset from local directories."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

ALLOWED = {"bert": ["ddp", "zero1", "zero2", "zero3", "tp", "pp", "3d"],
           "cnn": ["ddp", "zero1", "zero2", "zero3", "pp"]}
# global batch 12 = micro 2 x 6 (ddp, tp) = 2 x 3 x dp 2 (zero) = 6 micro-batches of 2 (pp)
# = 6 micro-batches of 1 x dp 2 (3d): every preset sees the same samples per step.
STEPS = ["debug=fast", "trainer.max_steps=4", "trainer.global_batch_size=12", "trainer.micro_batch_size=2",
         "optim.warmup_steps=1", "trainer.eval_batches=2", "trainer.eval_every=2"]
LAYOUTS = {"ddp": (1, 1, 1, 0), "zero1": (1, 1, 2, 1), "zero2": (1, 1, 2, 2), "zero3": (1, 1, 2, 3),
           "tp": (2, 1, 1, 1), "pp": (1, 2, 1, 1), "3d": (2, 2, 2, 1)}


@pytest.fixture(scope="module")
def family_run(run_zoo):
    """family_run(family, preset, *extra) -> Run, each combination run once per module."""
    done = {}

    def run(family: str, preset: str, *extra: str):
        if (family, preset, extra) not in done:
            done[family, preset, extra] = run_zoo(f"model={family}", f"parallel={preset}", *STEPS, *extra)
        return done[family, preset, extra]

    return run


@pytest.mark.parametrize("family, preset", [(f, p) for f, presets in ALLOWED.items() for p in presets])
def test_allowed_combination_trains_and_reports(family_run, family, preset):
    s = family_run(family, preset).summary
    assert (s["tp"], s["pp"], s["dp"], s["zero_stage"]) == LAYOUTS[preset]
    assert s["steps"] == 4 and math.isfinite(s["final_loss"]) and math.isfinite(s["eval_loss"])
    assert 0.0 <= s["eval_accuracy"] <= 1.0
    if family == "bert":
        # Batches padded to their longest sample, length-bucketed; under 3d to the block (see BertTask):
        # then the four global batches' mean length over the block, each batch one length bucket of
        # a pool (0.84 over the whole corpus; 0.66-0.85 for four batches of the seeds tried).
        assert 0.0 <= s["baseline_accuracy"] <= 1.0 and (0.5 if preset == "3d" else 0.97) < s["padding_efficiency"] <= 1
        assert s["eval_loss"] < math.log(4096) + 0.1  # about uniform over the vocabulary, or better


@pytest.mark.parametrize("family, preset", [("bert", "tp"), ("bert", "pp"), ("cnn", "pp")])
def test_layout_matches_single_process_per_step(family_run, family, preset):
    """BERT tp=2 (vocab-parallel MLM loss, heads split) and pp=2 (tied word embeddings across
    stages, batches of varying length), the CNN at pp=2 (BatchNorm inside the stages): the
    loss of every step and the consolidated weights (with BatchNorm statistics) at the end."""
    from zoo.checkpoint.final import load_run_weights

    ref, run = family_run(family, "ddp"), family_run(family, preset)
    assert len(ref.losses()) == 4 and ref.losses()[0] != ref.losses()[-1]
    torch.testing.assert_close(torch.tensor(run.losses()), torch.tensor(ref.losses()), rtol=1e-5, atol=0)
    # the periodic evaluation at step 2: the same 24 held-out samples (2 global batches) on every
    # layout, and its accuracy from the consolidated weights
    assert list(run.evals()) == list(ref.evals()) == [2, 4]
    assert run.evals()[2] == pytest.approx(ref.evals()[2], rel=1e-5)
    accuracy = [next(m["eval_accuracy"] for m in r.metrics if m["step"] == 2 and "eval_loss" in m) for r in (run, ref)]
    assert accuracy[0] == pytest.approx(accuracy[1], abs=1e-6) and 0 <= accuracy[0] <= 1
    ref_w, w = load_run_weights(ref.run_dir), load_run_weights(run.run_dir)
    assert w.keys() == ref_w.keys()
    # Element-wise within rtol 1e-4 and atol 1e-6, or 1e-4 of the tensor's scale where that is
    # larger: below it, the bar measures the order in which gradient clipping sums the squared
    # gradients (per pipeline stage, then across stages; BERT pp=2 with clipping off: 1.2e-7).
    for name in ref_w:
        atol = max(1e-6, 1e-4 * float(ref_w[name].float().abs().max()))
        torch.testing.assert_close(w[name], ref_w[name], rtol=1e-4, atol=atol, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize("family, preset", [(f, p) for f, presets in ALLOWED.items() for p in presets if p != "ddp"])
def test_accuracy_counted_in_place_equals_one_process(family_run, family, preset):
    """The evaluation's accuracy is counted by its own forward on the distributed model (the
    vocab-parallel argmax under tp, the last stage under pp, every ZeRO-3 replica its own
    batches): at steps 2 and 4 the same as one process's (3d's against one process at its
    micro-batch of 1). The plain model was built and filled on rank 0 for it before."""
    extra = ("trainer.micro_batch_size=1",) if preset == "3d" else ()
    ref, run = family_run(family, "ddp", *extra), family_run(family, preset)
    if family == "cnn" and preset.startswith("zero"):
        # BatchNorm's statistics are synchronised over the replicas, so the batches differ
        # from one process's: its own final weights, evaluated in one process, instead.
        assert run.summary["eval_accuracy"] == pytest.approx(_one_process_cnn_accuracy(run, 24), abs=1e-6)
        return

    def accuracy(r):
        return {m["step"]: m["eval_accuracy"] for m in r.metrics if "eval_loss" in m}

    assert list(accuracy(run)) == [2, 4]
    for step, value in accuracy(ref).items():
        assert accuracy(run)[step] == pytest.approx(value, abs=1e-6), step
    assert run.summary["eval_accuracy"] == pytest.approx(ref.summary["eval_accuracy"], abs=1e-6)
    if family == "bert":
        assert run.summary["eval_masked_tokens"] == ref.summary["eval_masked_tokens"] > 0
    else:
        assert run.summary["eval_images"] == ref.summary["eval_images"] == 24


def _one_process_cnn_accuracy(run, count: int) -> float:
    import json

    from safetensors import safe_open

    from data_pipelines.images import load_digits
    from zoo.checkpoint.final import load_run_weights
    from zoo.checkpoint.weights import load_plain
    from zoo.models.cnn import ResNet, cnn_shape

    with safe_open(str(run.run_dir / "model.safetensors"), "pt") as f:
        meta = json.loads(f.metadata()["shape"])
    model = ResNet(cnn_shape(meta["size"], in_channels=meta["in_channels"], num_classes=meta["num_classes"],
                             image_size=meta["image_size"])).eval()
    load_plain(model, load_run_weights(run.run_dir))
    held = load_digits(0.2)
    with torch.no_grad():
        return (model(held.eval_x[:count]).argmax(-1) == held.eval_y[:count]).float().mean().item()


def test_bert_3d_matches_single_process(family_run):
    """tp2 x pp2 x dp2 against one process with 3d's micro-batch of 1: the loss is a mean over
    each micro-batch's masked tokens, so the micro-batches must hold the same samples."""
    ref = family_run("bert", "ddp", "trainer.micro_batch_size=1")
    torch.testing.assert_close(torch.tensor(family_run("bert", "3d").losses()), torch.tensor(ref.losses()),
                               rtol=1e-4, atol=0)


@pytest.mark.parametrize("overrides, needle", [
    (["model=cnn", "parallel=tp"], "parallel.tp=2 with model.family=cnn: tensor parallelism splits"),
    (["model=cnn", "parallel=3d"], "data parallelism is the right tool: use parallel=ddp or parallel=zero1"),
])
def test_refused_combination_says_why(run_zoo, overrides, needle):
    """The CLI's exit; the other refusals (sequence parallelism, data of the wrong kind) are
    checked in tests/unit/config/test_config.py."""
    run = run_zoo(*overrides, check=False)
    assert run.returncode == 2, run.stderr
    assert needle in run.stderr and "Traceback" not in run.stderr + run.stdout


# -- other image sources, from local directories ------------------------------------------
def _digit_images(n: int):
    """(PIL image, label) pairs: 16x16 grey renderings of scikit-learn digits."""
    from PIL import Image
    from sklearn.datasets import load_digits

    d = load_digits()
    return [(Image.fromarray((d.images[i] * 15).astype(np.uint8)).resize((16, 16)), int(d.target[i]))
            for i in range(n)]


def test_image_folder_source(run_zoo, tmp_path):
    """A folder of class sub-directories; with data.eval_path a second one is the held-out
    split (all of it evaluated), and a held-out class the training folder lacks is refused."""
    from data_pipelines.images import load_image_folder
    from zoo.run.errors import DataError

    for i, (image, label) in enumerate(_digit_images(160)):
        root = tmp_path / ("images" if i < 120 else "held") / str(label)
        root.mkdir(parents=True, exist_ok=True)
        image.save(root / f"{i}.png")
    images, held = tmp_path / "images", tmp_path / "held"
    splits = load_image_folder(str(images), 0.25, image_size=12)
    assert splits.train_x.shape[1:] == (1, 12, 12) and len(splits.eval_y) == 30 and splits.classes[:2] == ["0", "1"]
    splits = load_image_folder(str(images), 0.25, image_size=12, eval_path=str(held))
    assert len(splits.train_y) == 120 and splits.eval_x.shape == (40, 1, 12, 12)
    (tmp_path / "odd" / "x").mkdir(parents=True)
    _digit_images(1)[0][0].save(tmp_path / "odd" / "x" / "0.png")
    with pytest.raises(DataError, match="has 1 class\\(es\\) the training data lacks \\(x\\)"):
        load_image_folder(str(images), 0.25, eval_path=str(tmp_path / "odd"))
    steps = [s for s in STEPS if not s.startswith("trainer.eval_batches=")]
    run = run_zoo("model=cnn", "data=files", f"data.path={images}", f"data.eval_path={held}",
                  "trainer.eval_batches=null", *steps)
    assert run.summary["eval_images"] == 40 and (run.run_dir / "classes.json").exists()


def test_hf_image_dataset_source(tmp_path):
    import datasets

    pairs = _digit_images(40)
    features = datasets.Features({"img": datasets.Image(), "digit": datasets.ClassLabel(names=[str(i) for i in range(10)])})
    ds = datasets.Dataset.from_dict({"img": [p[0].convert("RGB") for p in pairs], "digit": [p[1] for p in pairs]},
                                    features=features)
    ds.train_test_split(test_size=0.25, seed=0).save_to_disk(str(tmp_path / "digits"))
    from data_pipelines.images import load_hub_images

    splits = load_hub_images(str(tmp_path / "digits"), 0.2, image_column="img", label_column="digit")
    assert splits.train_x.shape == (30, 3, 16, 16) and splits.eval_x.shape == (10, 3, 16, 16)
    assert splits.num_classes == 10 and torch.allclose(splits.train_x.mean((0, 2, 3)), torch.zeros(3), atol=1e-4)
    with pytest.raises(ValueError, match="has no column 'image'"):
        load_hub_images(str(tmp_path / "digits"), 0.2)
