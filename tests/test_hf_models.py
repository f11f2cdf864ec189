"""A model from a Hugging Face config.json: the published presets build to their published sizes, the file's
sizes fill the model's fields (a command-line override still wins), and what the theory lacks is refused."""
from __future__ import annotations

import json

import pytest

from harness.config import rules
from harness.config.compose import compose
from harness.runtime import models

# parameter counts as published on each model's card (Qwen2.5-0.5B: 0.49B; Mistral-7B-v0.1: 7.24B;
# Meta-Llama-3-8B: 8.03B); exact figures from the released safetensors indexes
PUBLISHED = {"qwen2_5_0_5b": 494_032_768, "mistral_7b": 7_241_732_096, "llama3_8b": 8_030_261_248}


@pytest.mark.parametrize("preset", PUBLISHED)
def test_the_published_model_presets_build_to_their_published_parameter_counts(preset):
    cfg = compose([f"model={preset}"])
    assert models.param_count(cfg.model)["total"] == PUBLISHED[preset]
    assert rules.problems(cfg, lambda: 0) == []


def test_the_file_sets_the_model_fields_the_theory_reads_and_the_command_line_still_wins():
    cfg = compose(["model=llama3_8b", "model.num_layers=2"])
    m = cfg.model
    assert (m.family, m.model_type, m.hidden_size, m.num_kv_heads, m.vocab_size, m.rope_theta) == \
        ("llama", "llama", 4096, 8, 128256, 500000.0)
    assert m.num_layers == 2 and models.hf_config(m).num_hidden_layers == 2
    qwen = compose(["model=tiny_qwen2"]).model
    built = models.build(qwen, device="meta")
    assert type(built).__name__ == "Qwen2ForCausalLM" and qwen.tie_embeddings
    assert built.model.layers[0].self_attn.q_proj.bias is not None  # Qwen2's q/k/v biases, from its class
    # a config given on the command line names the run's model after its dir
    assert compose(["model.hf_config=conf/model/hf/tiny_mistral"]).model.name == "tiny_mistral"


def test_a_config_saved_by_transformers_5_builds_at_another_depth(tmp_path):
    # transformers 5 writes RoPE's base inside rope_parameters and one layer_types entry per layer
    saved = {"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 176, "num_attention_heads": 4,
             "num_hidden_layers": 2, "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 512,
             "rope_parameters": {"rope_theta": 1e6, "rope_type": "default"}, "tie_word_embeddings": True,
             "layer_types": ["full_attention"] * 2, "dtype": "float32"}
    cfg = compose([f"model.hf_config={write(tmp_path, **saved)}", "model.num_layers=3"])
    assert cfg.model.rope_theta == 1e6 and cfg.model.num_layers == 3
    built = models.hf_config(cfg.model)
    assert built.num_hidden_layers == 3 and len(built.layer_types) == 3


def write(tmp_path, **config):
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


@pytest.mark.parametrize("config, says", [
    ({"model_type": "deepseek_v3", "n_routed_experts": 8, "hidden_size": 64}, "multi-head latent attention"),
    ({"model_type": "gemma", "hidden_size": 64}, "'gemma' is not covered"),
    ({"model_type": "mistral", "hidden_size": 64, "num_attention_heads": 4, "sliding_window": 32},
     "sliding_window=32"),
])
def test_what_the_theory_lacks_is_refused_in_one_line_before_any_rank_starts(tmp_path, config, says):
    cfg = compose([f"model.hf_config={write(tmp_path, **config)}"])
    with pytest.raises(rules.ConfigError) as err:
        rules.check(cfg, lambda: 0)
    assert says in str(err.value) and "\n" not in str(err.value)
    missing = compose(["model.hf_config=/nonexistent/dir"])
    assert "no config.json there" in rules.problems(missing, lambda: 0)[0]


@pytest.mark.parametrize("overrides, named", [
    (["model.hf_config=conf/model/hf/tiny_mistral"], "tiny_mistral"),  # a dir holding config.json
    (["model.hf_config=/data/Llama-3-8B/config.json"], "Llama-3-8B"),
    (["model.hf_config=/data/mixtral.json"], "mixtral"),
    (["model.hf_config=conf/model/hf/tiny_mistral", "model.name=mine"], "mine"),  # a name given wins
    (["model=llama3_8b"], "llama3_8b"),  # a preset keeps its own name
])
def test_a_single_runs_dir_is_named_after_the_model_it_trains(overrides, named):
    # a walkthrough found `…-ddp-tiny_llama` run dirs for a Llama-3-8B config: Hydra names the dir before the run
    # reads the file, so the dir's name comes from the command line (schema.run_model_name)
    from hydra import compose as hydra_compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig

    from harness.config import schema
    from harness.core.paths import CONF

    schema.register()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = hydra_compose(config_name="config", overrides=overrides, return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    try:
        assert cfg.hydra.run.dir.endswith(f"-ddp-{named}")
    finally:
        HydraConfig.instance().cfg = None
