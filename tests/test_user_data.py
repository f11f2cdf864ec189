"""The user's own data and the training schedule, in process: local JSONL and text packed into the same
sequences for every split of the ranks, a held-out split the training never reads, a local tokenizer, the
learning rate of each step, and the one-line refusals before any rank starts."""
from __future__ import annotations

import json
import math

import pytest
import torch
from omegaconf import OmegaConf

from harness.config import rules
from harness.config.compose import compose
from harness.runtime import data, schedule


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    docs = [f"document {i}: " + "the quick brown fox jumps over the lazy dog. " * (3 + i % 5) for i in range(40)]
    (root / "a.jsonl").write_text("".join(json.dumps({"body": d}) + "\n" for d in docs[:30]))
    (root / "b.txt").write_text("\n".join(docs[30:]))  # one text file: one document
    return root, docs


def batches(cfg, rank=0, world=1, micro_batch=None):
    par = OmegaConf.merge(cfg.parallelism, {"micro_batch": micro_batch or cfg.parallelism.micro_batch})
    return data.Batches(cfg.data, par, cfg.model.vocab_size, cfg.train.seed, rank, world, "cpu")


def files_cfg(root, *extra):
    return compose(["data=files", f"data.files=[{root}/a.jsonl,{root}/b.txt]", "data.text_field=body",
                    "data.eval_fraction=0.1", *extra])


def test_files_are_packed_into_the_same_global_batch_whatever_the_split_over_ranks(corpus):
    root, docs = corpus
    cfg = files_cfg(root)
    assert rules.problems(cfg, lambda: 0) == []
    one = batches(cfg, micro_batch=4)
    halves = [batches(cfg, rank=r, world=2, micro_batch=2) for r in (0, 1)]
    for step in range(3):
        whole = one.get(step, 0)[0]
        assert torch.equal(whole, torch.cat([h.get(step, 0)[0] for h in halves]))
    # the byte-level stream is the documents in order: 30 JSONL lines, then the text file as one document; the
    # last 10% of the 31 documents (3: two lines and the file) held out, never in the training stream
    text = bytes(one.corpus.to(torch.uint8).tolist()).decode()
    held = bytes(one.held_out.to(torch.uint8).tolist()).decode()
    assert text == "".join(docs[:28]) and held == docs[28] + docs[29] + "\n".join(docs[30:])
    # targets are the inputs shifted by one, sequences consecutive in the stream
    inputs, targets = one.get(0, 0)
    assert torch.equal(inputs[:, 1:], targets[:, :-1])
    first_eval = one.eval_batch(0)[0][0]
    assert bytes(first_eval.to(torch.uint8).tolist()).decode() == held[:cfg.parallelism.seq_len]


def test_a_local_tokenizer_is_used_and_must_fit_the_models_vocabulary(corpus, tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    root, docs = corpus
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(docs, trainers.BpeTrainer(vocab_size=120, special_tokens=["<unk>", "</s>"]))
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", unk_token="<unk>").save_pretrained(tmp_path)
    vocab = Tokenizer.from_file(str(tmp_path / "tokenizer.json")).get_vocab_size(with_added_tokens=True)
    cfg = files_cfg(root, f"data.tokenizer={tmp_path}")
    assert rules.problems(cfg, lambda: 0) == []
    stream = batches(cfg).corpus
    eos = tok.token_to_id("</s>")
    assert int(stream.max()) < vocab and int((stream == eos).sum()) == 28  # each training document ends in EOS
    small = files_cfg(root, f"data.tokenizer={tmp_path}", f"model.vocab_size={vocab - 1}")
    assert any(f"its {vocab} tokens do not fit" in p for p in rules.problems(small, lambda: 0))


def test_the_learning_rate_warms_up_linearly_then_follows_half_a_cosine_to_its_floor():
    optim = OmegaConf.create({"lr": 1e-3, "warmup_steps": 4, "schedule": "cosine", "min_lr_ratio": 0.1})
    lrs = [schedule.learning_rate(optim, 20, k) for k in range(24)]
    assert lrs[:4] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3])
    assert lrs[4] == pytest.approx(1e-3) and lrs[12] == pytest.approx(1e-4 + 9e-4 * 0.5 * (1 + math.cos(math.pi / 2)))
    assert lrs[20:] == pytest.approx([1e-4] * 4)  # the extra measurement steps stay at the floor
    assert all(a >= b for a, b in zip(lrs[4:], lrs[5:]))
    constant = OmegaConf.merge(optim, {"schedule": "constant", "warmup_steps": 0})
    assert {schedule.learning_rate(constant, 20, k) for k in range(20)} == {1e-3}


@pytest.mark.parametrize("overrides, says", [
    (["data=files"], "data.files: data=files needs"),
    (["data=files", "data.files=[/nonexistent/x.jsonl]"], "/nonexistent/x.jsonl matches no file"),
    (["data=files", "data.files=[README.md]", "data.tokenizer=/nonexistent"], "no tokenizer.json there"),
    (["data.files=[README.md]"], "only data=files reads it"),
    (["data=synthetic", "train.eval_every=5"], "random tokens have no held-out split"),
    (["train.eval_every=5", "data.eval_fraction=0"], "data.eval_fraction=0"),
    (["optim.schedule=linear"], "optim.schedule"),
])
def test_bad_data_and_schedule_settings_are_refused_in_one_line(overrides, says):
    problems = rules.problems(compose(overrides), lambda: 0)
    assert problems and says in problems[0] and "\n" not in problems[0]


def test_a_jsonl_without_the_text_field_is_refused_naming_the_keys_it_has(corpus):
    root, _ = corpus
    problems = rules.problems(compose(["data=files", f"data.files=[{root}/a.jsonl]"]), lambda: 0)
    assert problems == [f"data.text_field=text: {root}/a.jsonl's first record has no such key (it has body); set "
                        "data.text_field to the key of the text"]


@pytest.mark.parametrize("lines, says", [
    (['{"text": "a"}', '{"text": "b"'], "line 2: not JSON"),
    (['{"text": "a"}', "", '["text", "c"]'], "line 3: a JSON list, not an object"),
])
def test_a_broken_jsonl_is_refused_before_any_rank_naming_its_file_and_line(tmp_path, lines, says):
    broken = tmp_path / "broken.jsonl"
    broken.write_text("\n".join(lines) + "\n")
    problems = rules.problems(compose(["data=files", f"data.files=[{broken}]"]), lambda: 0)
    assert len(problems) == 1 and problems[0].startswith(f"data.files: {broken}, {says}")
