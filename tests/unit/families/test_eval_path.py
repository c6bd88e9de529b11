"""data.eval_path's checks in the validation pass, for every family and data source."""
from __future__ import annotations

import pytest

from tests.unit.config.test_config import composed
from zoo.config.paths import check_paths
from zoo.families.registry import family
from zoo.run.errors import ConfigError


def _prepared(root, tokenizer_json: str):
    (root / "tokenizer").mkdir(parents=True)
    (root / "meta.json").write_text("{}")
    (root / "tokenizer" / "tokenizer.json").write_text(tokenizer_json)
    return root


def _check(*overrides):
    cfg = composed(*overrides)
    check_paths(cfg, family(cfg.model.family))


@pytest.mark.parametrize("model", ["gpt", "bert", "cnn"])
def test_an_empty_eval_path_is_refused(model):
    with pytest.raises(ConfigError, match="data.eval_path is empty: give the held-out file, directory or glob"):
        _check(f"model={model}", "data.eval_path=")


def test_the_built_in_digits_have_no_eval_path(tmp_path):
    with pytest.raises(ConfigError, match="data=digits is built in and holds out data.eval_fraction"):
        _check("model=cnn", f"data.eval_path={tmp_path}")


def test_a_held_out_image_folder_must_hold_images(tmp_path):
    (tmp_path / "train" / "a").mkdir(parents=True)
    (tmp_path / "train" / "a" / "0.png").write_bytes(b"")
    (tmp_path / "held").mkdir()
    with pytest.raises(ConfigError, match="data.eval_path=.*held' holds no images in class sub-directories"):
        _check("model=cnn", "data=files", f"data.path={tmp_path / 'train'}", f"data.eval_path={tmp_path / 'held'}")


@pytest.mark.parametrize("model", ["gpt", "bert"])
def test_a_held_out_prepared_file_must_be_one_made_with_the_same_tokenizer(tmp_path, model):
    train = _prepared(tmp_path / "train", '{"model": "a"}')
    common = [f"model={model}", "data=prepared", f"data.path={train}"]
    with pytest.raises(ConfigError, match="data.eval_path=.*nope: no such directory"):
        _check(*common, f"data.eval_path={tmp_path / 'nope'}")
    (tmp_path / "bare").mkdir()
    with pytest.raises(ConfigError, match="is not a prepared dataset \\(no meta.json, tokenizer\\)"):
        _check(*common, f"data.eval_path={tmp_path / 'bare'}")
    other = _prepared(tmp_path / "other", '{"model": "b"}')
    with pytest.raises(ConfigError, match="was prepared with another tokenizer than data.path"):
        _check(*common, f"data.eval_path={other}")
    same = _prepared(tmp_path / "same", '{"model": "a"}')
    _check(*common, f"data.eval_path={same}")


def test_an_import_on_prepared_data_is_refused_instead_of_ignored():
    from tests.unit.config.test_config import check

    with pytest.raises(ConfigError, match="model.init_from=/m with data=prepared: a prepared file trains zoo's own"):
        check(composed("data=prepared", "data.path=/p", "model.init_from=/m"))
