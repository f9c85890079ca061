"""A model key that the chosen variant does not read is refused, and ``config show`` prints only the
keys that apply: a hand-built variant has no embedding, score, attention map, norm, scale or
dropout to set."""

from __future__ import annotations

import pytest
import yaml
from test_training import one_line_error, run_cli

from ktframe.core.errors import InputError
from ktframe.learning.config import applicable, load_config
from ktframe.plugin.build import MODEL_OPTIONS, model_keys


@pytest.mark.parametrize("variant", ["soft", "lloyd", "trimmed"])
def test_a_hand_built_variant_refuses_the_heads_keys_naming_those_it_reads(variant):
    with pytest.raises(InputError, match=rf"model.attention_map \(from the command line\) is not read by variant '{variant}'") as caught:
        load_config([f"variant={variant}", "model.attention_map=sparsemax"])
    message = str(caught.value)
    assert "\n" not in message
    assert all(f"model.{name}" in message for name in model_keys(variant))
    assert "expected to leave it out" in message


def test_every_key_the_learned_variant_reads_is_taken():
    cfg = load_config([f"model.{name}={value}" for name, value in [("attention_map", "sparsemax"), ("norm", "rmsnorm"), ("dropout", "0.0")]])
    assert (cfg.model.attention_map, cfg.model.norm, cfg.model.dropout) == ("sparsemax", "rmsnorm", 0.0)
    assert set(MODEL_OPTIONS) <= set(model_keys("learned"))


def test_a_preset_that_names_a_variant_is_held_to_its_keys_and_another_presets_heads_are_left_behind(tmp_path):
    preset = tmp_path / "soft-heads.yaml"
    preset.write_text(yaml.safe_dump({"model": {"variant": "soft", "embedding": "none"}}))
    with pytest.raises(InputError, match=rf"model.embedding \(from preset {preset}\) is not read by variant 'soft'"):
        load_config([f"preset={preset}"])
    # The paper's preset describes the learned layer's heads; switching the variant keeps its
    # tasks and schedule, and what is shown is what the soft model reads.
    cfg = load_config(["preset=paper", "variant=soft"])
    shown = applicable(cfg)["model"]
    assert set(shown) == set(model_keys("soft"))
    assert cfg.data.d == load_config(["preset=paper"]).data.d


def test_config_show_prints_the_keys_that_apply(tmp_path):
    soft = yaml.safe_load(run_cli(["config", "show", "variant=soft"], tmp_path).stdout)
    learned = yaml.safe_load(run_cli(["config", "show"], tmp_path).stdout)
    assert set(soft["model"]) == set(model_keys("soft"))
    assert not set(MODEL_OPTIONS) & set(soft["model"])
    assert set(MODEL_OPTIONS) <= set(learned["model"])


def test_fit_refuses_an_unread_key_in_one_line_before_making_anything(tmp_path):
    done = run_cli(["fit", "variant=soft", "model.attention_map=sparsemax", f"root={tmp_path / 'runs'}"], tmp_path)
    assert "is not read by variant 'soft'" in one_line_error(done)
    assert not (tmp_path / "runs").exists()
