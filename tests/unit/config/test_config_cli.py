"""The one-line forms of Hydra's and OmegaConf's errors (zoo.config.cli)."""
from __future__ import annotations

import pytest
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from zoo.config.cli import hydra_message_line, nearest_key, omegaconf_error_line, schema_keys, unknown_optional_choices
from zoo.config.schema import Config

HYDRA_MISSING_OPTION = """In 'config': Could not find 'model/nope'

Available options in 'model':
\tbert
\tcnn
\tgpt
Config search path:
\tprovider=hydra, path=pkg://hydra.conf
\tprovider=main, path=file:///somewhere/conf

Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.
"""


def test_hydra_message_becomes_one_line_with_the_options():
    assert hydra_message_line(HYDRA_MISSING_OPTION) == \
        "In 'config': Could not find 'model/nope'; Available options in 'model': bert, cnn, gpt"
    assert hydra_message_line("") == "the config did not compose (HYDRA_FULL_ERROR=1 shows why)"


def _raised(fn) -> OmegaConfBaseException:
    with pytest.raises(OmegaConfBaseException) as err:
        fn()
    return err.value


def test_unknown_key_and_unresolved_interpolation_name_the_key_and_the_fix():
    schema = OmegaConf.structured(Config)
    err = _raised(lambda: OmegaConf.merge(schema, OmegaConf.create({"trainer": {"foo": 1}})))
    assert omegaconf_error_line(err).startswith("trainer.foo is not a key of the config")
    cfg = OmegaConf.create({"trainer": {"max_steps": "${oc.env:ZOO_TEST_UNSET_VARIABLE}"}})
    line = omegaconf_error_line(_raised(lambda: OmegaConf.to_yaml(cfg, resolve=True)))
    assert line.startswith("trainer.max_steps: ") and "ZOO_TEST_UNSET_VARIABLE" in line and "\n" not in line
    assert "oc.env:VAR,default" in line


def test_an_optional_group_option_without_a_file_is_named():
    assert unknown_optional_choices({"experiment": "gpt_tiny_3d", "debug": "fast"}) == []
    assert unknown_optional_choices({"experiment": None, "debug": None}) == []
    (problem,) = unknown_optional_choices({"experiment": "nope", "debug": None})
    assert problem.startswith("experiment=nope is not one of conf/experiment/") and "'gpt_tiny_3d'" in problem


HYDRA_UNKNOWN_KEY = """Could not override 'trainer.max_step'.
To append to your config use +trainer.max_step=5
Key 'max_step' not in 'TrainerConfig'
    full_key: trainer.max_step
    object_type=TrainerConfig

Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.
"""


def test_a_misspelled_key_gets_the_nearest_real_key_not_hydras_append_advice():
    line = hydra_message_line(HYDRA_UNKNOWN_KEY)
    assert line.startswith("trainer.max_step is not a key of the config: did you mean trainer.max_steps?")
    assert "+trainer" not in line
    assert nearest_key("model.max_steps") == "trainer.max_steps"  # the right leaf in another group
    assert nearest_key("optim.lrr") == "optim.lr"
    assert nearest_key("completely.unrelated") is None
    keys = schema_keys()
    assert "trainer.max_steps" in keys and "parallel.tp" in keys and "model" not in keys
    # deepspeed.* is free-form: Hydra's own advice (+deepspeed.KEY) is the right one there
    ds = HYDRA_UNKNOWN_KEY.replace("trainer.max_step", "deepspeed.foo")
    assert "+deepspeed.foo" in hydra_message_line(ds)
    schema = OmegaConf.structured(Config)
    err = _raised(lambda: OmegaConf.merge(schema, OmegaConf.create({"trainer": {"max_step": 1}})))
    assert "did you mean trainer.max_steps?" in omegaconf_error_line(err)


def test_the_schema_is_no_group_choice_and_help_lists_none():
    """#49 item 7: the typed schema was also stored in each group: `--help` listed data_schema,
    parallel_schema, ... as choices and `data=data_schema` composed."""
    import subprocess
    import sys

    from hydra import compose, initialize_config_dir
    from hydra.errors import MissingConfigException

    from tests.conftest import REPO
    from zoo.config.schema import SECTIONS, register_configs
    from zoo.plan.settings import register_plan_configs

    register_configs()
    register_plan_configs()
    for config, group in [*(("config", g) for g in SECTIONS), ("plan", "cluster")]:
        with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
            with pytest.raises(MissingConfigException):
                compose(config_name=config, overrides=[f"{group}={group}_schema"])
    shown = subprocess.run([sys.executable, "-m", "zoo.train", "--help"], cwd=REPO, capture_output=True, text=True,
                           timeout=120)
    assert shown.returncode == 0 and "data: chat, digits, files, hub, prepared, pydoc" in shown.stdout
    assert "_schema" not in shown.stdout.split("== Config ==")[0], shown.stdout[:1500]
