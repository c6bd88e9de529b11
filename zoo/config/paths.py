"""Every path a user gives, checked in the validation pass before any process starts.

`data.path` (and each `data.mix` file source), `data=prepared`'s directory, `data.tokenizer`,
`model.init_from` and `resume`: each must exist and hold what it must (files of a readable
kind, class sub-directories of images, the prepared manifest, a tokenizer file, safetensors
weights, a checkpoint). For `model.init_from` a name that is not a local path (`gpt2`) is a
Hub name: the ranks load it, and what fails there is reported in one line too. What can only
be seen by reading the data (a missing column, an empty file) stays with the ranks.
"""
from __future__ import annotations

from pathlib import Path

from zoo.run.errors import ConfigError, DataError


def _local(path: str) -> bool:
    """A path the user means on this machine (not a Hub name)."""
    p = Path(path).expanduser()
    return p.exists() or path.startswith(("/", ".", "~")) or path.count("/") > 1


def _directory(key: str, path: str, what: str) -> Path:
    p = Path(path).expanduser()
    if not p.exists():
        raise ConfigError(f"{key}={path}: no such directory; give {what}")
    if not p.is_dir():
        raise ConfigError(f"{key}={path} is a file; give {what}")
    return p


def check_paths(cfg, spec) -> None:
    """Raise a ZooError (one line, with the fix) for the first path that cannot be what it names."""
    d, m = cfg.data, cfg.model
    if d.name == "files" and not d.mix and d.path:
        if spec.reads == "images":
            from data_pipelines.images import find_image_folder

            find_image_folder(d.path)
        else:
            from data_pipelines.text_sources import expand_paths

            expand_paths(d.path)
    for source in d.mix or []:
        if isinstance(source, dict) and source.get("name") == "files":
            from data_pipelines.text_sources import expand_paths

            expand_paths(str(source.get("path") or ""))
    _check_mixed_prepared(d)
    if d.eval_path is not None:
        _check_eval_path(d, spec)
    if d.name == "prepared" and d.path:
        _prepared("data.path", d.path)
    if d.name == "chat":  # a chat directory prepared already: its tokens and target masks intact
        for key, path in (("data.path", d.path), ("data.eval_path", d.eval_path)):
            _intact_chat(key, path)
    if d.tokenizer:  # read from its tokenizer.json: a Hub name is saved to a directory first
        p = _directory("data.tokenizer", d.tokenizer, "a directory with tokenizer.json (save_pretrained's output; "
                                                      "for a Hub tokenizer: AutoTokenizer.from_pretrained(name)"
                                                      ".save_pretrained(DIR))")
        if not any((p / name).exists() for name in ("tokenizer.json", "tokenizer_config.json")):
            raise ConfigError(f"data.tokenizer={d.tokenizer} holds no tokenizer.json or tokenizer_config.json; give "
                              f"the directory a transformers tokenizer was saved to (save_pretrained)")
        if (p / "tokenizer.json").exists():
            _readable_tokenizer_json("data.tokenizer", d.tokenizer, p / "tokenizer.json")
    if m.init_from is not None and not m.init_from.strip():
        raise ConfigError("model.init_from is empty: give a local transformers model directory, or drop the key "
                          "to train from zoo's own initialisation")
    if m.init_from and _local(m.init_from):
        p = _directory("model.init_from", m.init_from, "a local transformers model directory")
        if not any(p.glob("*.safetensors")):
            raise ConfigError(f"model.init_from={m.init_from} holds no *.safetensors weights (a pytorch_model.bin "
                              f"is not read: unpickling can run code); save the model with "
                              f"save_pretrained(safe_serialization=True)")
    if cfg.trainer.profile.start and cfg.trainer.profile.dir is not None:
        if not cfg.trainer.profile.dir.strip():
            raise ConfigError("trainer.profile.dir is empty: give a directory for the traces, or drop the key for "
                              "RUN_DIR/profile")
        _writable("trainer.profile.dir", cfg.trainer.profile.dir)
    if cfg.resume and cfg.resume != "auto" and not Path(cfg.resume).expanduser().exists():
        raise ConfigError(f"resume={cfg.resume}: no such checkpoint or run directory; give a checkpoint "
                          f"(RUN_DIR/checkpoints/step_N), a run directory, or resume=auto")


def _readable_tokenizer_json(key: str, value: str, path: Path) -> None:
    """The tokenizer.json that the data pipeline and the run read: it must load (milliseconds)."""
    from tokenizers import Tokenizer

    try:
        Tokenizer.from_file(str(path))
    except Exception as err:  # tokenizers raises a bare Exception for malformed JSON or an unknown model
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(f"{key}={value}: its tokenizer.json does not load ({first}); save the tokenizer there "
                          f"again with save_pretrained, or give another directory") from None


def _prepared(key: str, path: str) -> Path:
    p = _directory(key, path, "the output directory of `python -m data_pipelines.prepare`")
    missing = [name for name in ("meta.json", "tokenizer") if not (p / name).exists()]
    if missing:
        raise ConfigError(f"{key}={path} is not a prepared dataset (no {', '.join(missing)}); run "
                          f"`python -m data_pipelines.prepare` into it, or use data=files for raw text")
    from data_pipelines.cache import cache_root
    from data_pipelines.prepare import check_shards

    try:  # every shard there, of its size and digest (each file version read once: the cache remembers it)
        check_shards(p, cache_root())
    except DataError as err:
        raise ConfigError(f"{key}={path}: {err}") from None
    return p


def _intact_chat(key: str, path: str | None) -> None:
    """A chat directory (`python -m data_pipelines.prepare --format chat`): every shard of tokens
    and of target masks there, of its size and digest (read once per file version)."""
    from data_pipelines.chat_blocks import is_chat

    if not path or not is_chat(Path(path).expanduser()):
        return  # conversation files: rendered, then written with their digests
    from data_pipelines.cache import cache_root
    from data_pipelines.prepare import check_shards

    try:
        check_shards(Path(path).expanduser(), cache_root(), lists=("shards", "mask_shards"))
    except DataError as err:
        raise ConfigError(f"{key}={path}: {err}") from None


def _check_mixed_prepared(d) -> None:
    """data.mix's prepared directories: each intact, all of one tokenizer (the one data.tokenizer
    names, where set), since the mixture is one token stream."""
    prepared = [(i, str(m["path"])) for i, m in enumerate(d.mix or [])
                if isinstance(m, dict) and m.get("name") == "prepared" and m.get("path")]
    first = None
    for i, path in prepared:
        tok = _prepared(f"data.mix[{i}].path", path) / "tokenizer" / "tokenizer.json"
        if first is None:
            first = (i, path, tok)
        elif tok.read_bytes() != first[2].read_bytes():
            raise ConfigError(f"data.mix[{i}].path={path} was prepared with another tokenizer ({_vocab(tok)} tokens) "
                              f"than data.mix[{first[0]}].path={first[1]} ({_vocab(first[2])} tokens): a mixture is "
                              f"one token stream; prepare both with one --tokenizer")
    if first is not None and d.tokenizer:
        given = Path(d.tokenizer).expanduser() / "tokenizer.json"
        if given.exists() and given.read_bytes() != first[2].read_bytes():
            raise ConfigError(f"data.tokenizer={d.tokenizer} is not the tokenizer data.mix[{first[0]}].path={first[1]} "
                              f"was prepared with; drop data.tokenizer (the mixture uses the prepared one) or prepare "
                              f"with it")


def _vocab(tokenizer_json: Path) -> str:
    import json

    try:
        return f"{len(json.loads(tokenizer_json.read_text())['model']['vocab']):,}"
    except (ValueError, KeyError, TypeError):
        return "?"


def _check_eval_path(d, spec) -> None:
    """data.eval_path: a held-out source in the forms data.path takes for data.name."""
    if not str(d.eval_path).strip():
        raise ConfigError("data.eval_path is empty: give the held-out file, directory or glob (the forms of "
                          "data.path), or drop the key to evaluate on a data.eval_fraction split")
    if d.name == "digits":
        raise ConfigError("data.eval_path: data=digits is built in and holds out data.eval_fraction of its images; "
                          "a held-out source of its own needs data=files (an image folder) or data=hub")
    if d.name == "prepared":
        held = _prepared("data.eval_path", d.eval_path)
        if d.path and (Path(d.path).expanduser() / "tokenizer").exists():
            ours = (Path(d.path).expanduser() / "tokenizer" / "tokenizer.json")
            theirs = held / "tokenizer" / "tokenizer.json"
            if ours.exists() and theirs.exists() and ours.read_bytes() != theirs.read_bytes():
                raise ConfigError(f"data.eval_path={d.eval_path} was prepared with another tokenizer than "
                                  f"data.path={d.path}; prepare the held-out text with data.path's tokenizer "
                                  f"(python -m data_pipelines.prepare ... --tokenizer {Path(d.path) / 'tokenizer'})")
        return
    if d.name == "hub" and not _local(d.eval_path):
        return  # a Hub name: the ranks load it
    if d.name == "hub":
        if not Path(d.eval_path).expanduser().exists():
            raise ConfigError(f"data.eval_path={d.eval_path}: no such dataset directory")
        return
    if spec.reads == "images":
        from data_pipelines.images import find_image_folder

        try:
            find_image_folder(d.eval_path, "data.eval_path")
        except DataError as err:
            raise ConfigError(str(err)) from None
        return
    from data_pipelines.text_sources import as_eval_path_error, expand_paths

    try:
        expand_paths(d.eval_path)
    except DataError as err:
        raise as_eval_path_error(err, d.eval_path) from None


def _writable(key: str, path: str) -> None:
    """A directory this process can create files in, or ConfigError. What it had to create for
    the test is removed again (the run makes it)."""
    import tempfile

    p = Path(path).expanduser().absolute()
    made = [d for d in (p, *p.parents) if not d.exists()]
    try:
        p.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=p, prefix=".zoo-write-test-"):
            pass
    except OSError as err:
        raise ConfigError(f"{key}={path} is not a writable directory ({err.strerror or err}); give one this user "
                          f"can write to, or drop the key for RUN_DIR/profile") from None
    finally:
        for d in made:  # innermost first
            if d.exists():
                d.rmdir()
