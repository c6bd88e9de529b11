import json
import subprocess
import sys


def test_a_trained_tokenizers_length_comes_without_transformers(tmp_path):
    """In a fresh interpreter: a cached BPE tokenizer's length, as a run's start asks it, imports
    no transformers and equals transformers' own; encoding then loads it."""
    from data_pipelines.tokenizer import train_gpt_tokenizer

    docs = ["the cat sat on the mat. " * 50, "a dog ran far away. " * 50]
    train_gpt_tokenizer(docs, 300, "lazy", str(tmp_path))  # trained and cached here
    code = f"""
import sys
from data_pipelines.tokenizer import LazyTokenizer, train_gpt_tokenizer
d = str(train_gpt_tokenizer({docs!r}, 300, "lazy", {str(tmp_path)!r}))
assert "transformers" not in sys.modules, "the cached tokenizer imported transformers"
tok = LazyTokenizer(d)
n = len(tok)
assert "transformers" not in sys.modules, "its length imported transformers"
ids = tok("the cat")["input_ids"]
assert "transformers" in sys.modules and tok.decode(ids) == "the cat"
print(n, len(tok.loaded))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    n, loaded = out.stdout.split()
    assert n == loaded


def test_a_special_token_only_the_config_names_is_counted_by_transformers(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from data_pipelines.tokenizer import LazyTokenizer

    tok = Tokenizer(models.WordLevel({"a": 0, "b": 1, "<unk>": 2}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>").save_pretrained(str(tmp_path))
    assert len(LazyTokenizer(str(tmp_path))) == 3 == len(PreTrainedTokenizerFast.from_pretrained(str(tmp_path)))
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config["pad_token"] = "<pad>"  # not in tokenizer.json: transformers adds it when it loads
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    lazy = LazyTokenizer(str(tmp_path))
    assert len(lazy) == len(PreTrainedTokenizerFast.from_pretrained(str(tmp_path))) and lazy._loaded is not None
