"""pipeline/config.py: precedence defaults < YAML < --set < flags, and one exact line per rejection."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline import config
from pipeline.errors import InputError


def _yaml(tmp_path: Path, text: str, name: str = "run.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def _error(*args, **kwargs) -> str:
    with pytest.raises(InputError) as info:
        config.load(*args, **kwargs)
    msg = str(info.value)
    assert "\n" not in msg
    assert info.value.exit_code == 2
    return msg


# ------------------------------------------------------------------ precedence


def test_defaults_without_any_source():
    cfg = config.load()
    assert cfg == config.RunConfig()
    assert (cfg.train.epochs, cfg.train.lr, cfg.train.batch_size, cfg.train.optimizer) == (12, 3e-3, 64, "adamw")
    assert (cfg.data.source, cfg.model.name, cfg.dist.nproc_per_node) == ("digits", "digits_cnn", 1)
    assert cfg.amp.init_loss_scaling == 65536.0 and cfg.amp.incr_every_n_steps == 2000


def test_precedence_defaults_yaml_set_flags(tmp_path):
    path = _yaml(tmp_path, "train:\n  epochs: 5\n  lr: 0.01\n  batch_size: 32\n  seed: 7\n"
                           "data:\n  source: digits\n")
    cfg = config.load(
        path,
        sets=["train.lr=3e-4", "train.batch_size=16", "train.epochs=6"],
        flags={"train.epochs": ("--epochs", 9), "train.batch_size": ("--batch-size", None)},
    )
    assert cfg.train.epochs == 9  # flag beats --set beats YAML
    assert cfg.train.lr == 3e-4  # --set beats YAML
    assert cfg.train.batch_size == 16  # a flag left at None does not override
    assert cfg.train.seed == 7  # YAML beats the default
    assert cfg.train.weight_decay == 1e-4  # untouched default
    assert cfg.data.source == "digits"


def test_later_set_wins_over_earlier_set():
    cfg = config.load(sets=["train.epochs=3", "train.epochs=4"])
    assert cfg.train.epochs == 4


def test_set_scientific_notation_parses_as_float():
    cfg = config.load(sets=["train.lr=3e-4"])
    assert cfg.train.lr == 3e-4 and type(cfg.train.lr) is float


def test_yaml_scientific_without_dot_parses_as_float(tmp_path):
    # YAML 1.1 reads `3e-4` as a string; the float field still takes it.
    cfg = config.load(_yaml(tmp_path, "train:\n  lr: 3e-4\n  warmup_epochs: 2\n"))
    assert cfg.train.lr == 3e-4 and type(cfg.train.lr) is float
    assert cfg.train.warmup_epochs == 2.0 and type(cfg.train.warmup_epochs) is float  # int given float: widened


def test_set_values_are_typed():
    cfg = config.load(sets=["data.persistent_workers=true", "dist.gpus=0", "model.name=mlp",
                            "data.source=pkg.mod:load", "train.label_smoothing=0.1"])
    assert cfg.data.persistent_workers is True
    assert cfg.dist.gpus == "0"  # a number where a string is expected stays text
    assert cfg.model.name == "mlp"
    assert cfg.data.source == "pkg.mod:load"
    assert cfg.train.label_smoothing == 0.1


def test_empty_yaml_and_empty_section_are_defaults(tmp_path):
    assert config.load(_yaml(tmp_path, "# nothing yet\n")) == config.RunConfig()
    assert config.load(_yaml(tmp_path, "train:\n  # epochs: 3\n", "b.yaml")) == config.RunConfig()


def test_config_is_frozen_and_round_trips_through_the_manifest():
    cfg = config.load(sets=["train.lr=0.5", "model.name=mlp"])
    with pytest.raises(AttributeError):
        cfg.train.lr = 1.0  # type: ignore[misc]
    assert config.from_dict(cfg.to_dict()) == cfg


def test_examples_digits_yaml_resolves():
    cfg = config.load(Path(__file__).resolve().parent.parent / "examples" / "digits.yaml")
    assert (cfg.data.source, cfg.model.name, cfg.train.epochs, cfg.train.lr) == ("digits", "digits_cnn", 12, 3e-3)


# ------------------------------------------------------------------ rejections, exact messages


def test_unknown_set_key_suggests_the_close_one():
    assert _error(sets=["train.lrr=3e-4"]) == "--set train.lrr: unknown key (did you mean train.lr?)"


def test_unknown_section_in_set():
    assert _error(sets=["trian.lr=1"]) == "--set trian.lr: unknown key (did you mean train.lr?)"


def test_unknown_key_without_a_close_match_has_no_hint():
    assert _error(sets=["zzz.qqq=1"]) == "--set zzz.qqq: unknown key"


def test_unknown_key_in_yaml_names_the_file(tmp_path):
    path = _yaml(tmp_path, "train:\n  lrr: 0.1\n")
    assert _error(path) == f"{path}: train.lrr: unknown key (did you mean train.lr?)"


def test_unknown_scalar_section_in_yaml_names_the_file(tmp_path):
    path = _yaml(tmp_path, "epochs: 3\n")
    assert _error(path).startswith(f"{path}: epochs: unknown key")


def test_known_section_that_is_not_a_mapping(tmp_path):
    path = _yaml(tmp_path, "train: 3\n")
    assert _error(path) == f"{path}: train: expected a mapping of keys"


def test_int_field_given_float():
    assert _error(sets=["train.epochs=2.5"]) == "--set train.epochs: expected int, got float 2.5"


def test_int_field_given_float_in_yaml(tmp_path):
    path = _yaml(tmp_path, "train:\n  batch_size: 32.0\n")
    assert _error(path) == f"{path}: train.batch_size: expected int, got float 32.0"


def test_int_field_given_bool():
    assert _error(sets=["train.epochs=true"]) == "--set train.epochs: expected int, got bool True"


def test_bool_field_given_string():
    assert _error(sets=["data.persistent_workers=maybe"]) == \
        "--set data.persistent_workers: expected bool, got str 'maybe'"


def test_float_field_given_text():
    assert _error(sets=["train.lr=fast"]) == "--set train.lr: expected float, got str 'fast'"


@pytest.mark.parametrize("text", ["nan", ".inf", "inf", "-.inf"])
def test_float_field_rejects_non_finite(text):
    assert _error(sets=[f"train.lr={text}"]).startswith("--set train.lr: must be a finite number, got ")


def test_str_field_given_bool():
    assert _error(sets=["model.name=yes"]) == "--set model.name: expected str, got bool True"


def test_bad_choice():
    assert _error(sets=["train.optimizer=sgd"]) == "--set train.optimizer: must be one of adamw, momentum, got 'sgd'"


def test_bad_choice_in_yaml(tmp_path):
    path = _yaml(tmp_path, "amp:\n  level: O3\n")
    assert _error(path) == f"{path}: amp.level: must be one of O0, O1, O2, got 'O3'"


def test_below_minimum():
    assert _error(sets=["train.epochs=0"]) == "--set train.epochs: must be >= 1, got 0"
    assert _error(sets=["train.lr=-1e-3"]) == "--set train.lr: must be >= 0, got -0.001"


def test_explicit_flag_errors_name_the_flag():
    assert _error(flags={"dist.nproc_per_node": ("--nproc", 0)}) == "--nproc: must be >= 1, got 0"
    assert _error(flags={"amp.level": ("--amp", "O9")}) == "--amp: must be one of O0, O1, O2, got 'O9'"


def test_malformed_set_without_equals():
    assert _error(sets=["train.lr"]) == "--set train.lr: expected section.key=value"


def test_set_with_empty_value_for_number():
    assert _error(sets=["train.lr="]) == "--set train.lr: expected float, got str ''"


def test_invalid_yaml_names_the_file(tmp_path):
    path = _yaml(tmp_path, "train:\n  lr: [0.1\n  epochs: 3\n")
    msg = _error(path)
    assert msg.startswith(f"{path}: invalid YAML at line ")


def test_tab_indented_yaml_is_invalid(tmp_path):
    path = _yaml(tmp_path, "train:\n\tlr: 0.1\n")
    assert _error(path).startswith(f"{path}: invalid YAML")


def test_non_mapping_yaml_names_the_file(tmp_path):
    path = _yaml(tmp_path, "- train\n- export\n")
    assert _error(path) == f"{path}: expected a mapping of sections (data, model, train, ...)"
    path = _yaml(tmp_path, "just a string\n", "s.yaml")
    assert _error(path) == f"{path}: expected a mapping of sections (data, model, train, ...)"


def test_missing_config_file(tmp_path):
    path = tmp_path / "nope.yaml"
    assert _error(path) == f"{path}: config file not found"


def test_config_path_is_a_directory(tmp_path):
    assert _error(tmp_path) == f"{tmp_path}: cannot read config (IsADirectoryError)"


def test_yaml_does_not_construct_python_objects(tmp_path):
    path = _yaml(tmp_path, "train:\n  lr: !!python/object/apply:os.getcwd []\n")
    assert _error(path).startswith(f"{path}: invalid YAML")


def test_from_dict_is_strict():
    with pytest.raises(InputError) as info:
        config.from_dict({"train": {"lrr": 1.0}})
    assert str(info.value) == "manifest config: train.lrr: unknown key (did you mean train.lr?)"


def test_describe_lists_every_key_with_help():
    rows = config.describe()
    keys = [k for k, _, _ in rows]
    assert "train.lr" in keys and "dist.nproc_per_node" in keys and "export.parity_tol" in keys
    assert len(keys) == len(set(keys))
    assert all(help_text for _, _, help_text in rows)
    assert dict((k, d) for k, d, _ in rows)["train.epochs"] == 12
