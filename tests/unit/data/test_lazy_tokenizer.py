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


def test_prepare_reads_a_saved_tokenizer_as_transformers_does_without_importing_it(tmp_path):
    """data_pipelines.prepare's tokenizer (backend, end-of-document id, length) from the files
    alone equals transformers' for a trained GPT (eos) and BERT (no eos: [SEP]) tokenizer and a
    Llama-style one saved by transformers; where the two configs name different end tokens it
    defers to transformers; a --tokenizer that is a file is one line."""
    import pytest
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    from data_pipelines.prepare import _tokenizer
    from data_pipelines.tokenizer import backend_without_transformers, train_bert_tokenizer, train_gpt_tokenizer
    from zoo.run.errors import DataError

    docs = ["the cat sat on the mat. " * 50, "a dog ran far away. " * 50]
    word = Tokenizer(models.WordLevel({"<s>": 0, "</s>": 1, "<unk>": 2, "a": 3}, unk_token="<unk>"))
    word.pre_tokenizer = pre_tokenizers.Whitespace()
    llama = tmp_path / "llama"
    PreTrainedTokenizerFast(tokenizer_object=word, bos_token="<s>", eos_token="</s>",
                            unk_token="<unk>").save_pretrained(str(llama))
    for d in (train_gpt_tokenizer(docs, 300, "p", str(tmp_path)), train_bert_tokenizer(docs, 200, "p", str(tmp_path)),
              llama):
        light = backend_without_transformers(d)
        assert light is not None, d
        tok = AutoTokenizer.from_pretrained(str(d))
        end = tok.eos_token_id if tok.eos_token_id is not None else tok.sep_token_id
        assert (light[1], light[2]) == (end, len(tok)) and end is not None
        assert Tokenizer.from_str(light[0]).encode("a cat", add_special_tokens=False).ids == tok("a cat", add_special_tokens=False)["input_ids"]
    (llama / "special_tokens_map.json").write_text(json.dumps({"eos_token": "<s>"}))
    assert backend_without_transformers(llama) is None
    with pytest.raises(DataError, match=r"--tokenizer .*tokenizer.json is a file: give the directory"):
        _tokenizer(str(llama / "tokenizer.json"))
