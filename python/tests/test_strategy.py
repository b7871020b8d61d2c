"""ernie.Strategy is the one home of a compile's settings: Paddle's config
dicts and compile's keywords are spellings of it (the same program file,
byte for byte, for every configuration of compile_configs), and it checks
every key and value, naming the nearest valid key of a misspelt one."""

import math

import pytest

import ernie
from ernie import strategy as S
from compile_configs import CONFIGS, compile_config

_SECTIONS = {"dp_config": ("dp", S.DataParallel), "mp_config": ("mp", S.TensorParallel),
             "pp_config": ("pp", S.PipelineParallel), "ep_config": ("ep", S.ExpertParallel),
             "moe_config": ("moe", S.MoE), "fp8_config": ("fp8", S.FP8)}


def _as_strategy(config, fuse=None, cluster=None):
    """The Strategy a config dict spells, built section by section."""
    sections = {}
    for key, value in (config or {}).items():
        if key == "recompute":
            spec = value if isinstance(value, dict) else {"granularity": value}
            sections["recompute"] = S.Recompute(**spec)
        elif key == "even_splits":
            sections["even_splits"] = value
        else:
            name, cls = _SECTIONS[key]
            sections[name] = cls(**value)
    if fuse is not None:
        sections["fusion"] = fuse
    return ernie.Strategy(**sections, cluster=cluster)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_old_spellings_compile_the_program_a_strategy_does(name):
    old = compile_config(name)
    _, _, _, kwargs = CONFIGS[name]()
    strategy = _as_strategy(kwargs.get("config"), kwargs.get("fuse"), kwargs.get("cluster"))
    new = compile_config(name, config=None, fuse=S.UNSET, cluster=None, strategy=strategy)
    assert new.program_file == old.program_file
    assert new.strategy == old.strategy


def test_fp8_keyword_and_config_are_one_setting():
    by_keyword = compile_config("dp2", fp8_config={"recipe": "delayed", "margin": 1})
    by_strategy = compile_config("dp2", config=None, strategy=ernie.Strategy(
        dp=S.DataParallel(), fp8=S.FP8(recipe="delayed", margin=1)))
    assert by_keyword.program_file == by_strategy.program_file


@pytest.mark.parametrize("config, message", [
    ({"dp_confg": {}}, r"unknown parallelize config keys \['dp_confg'\].*did you mean 'dp_config'"),
    ({"dp_config": {"sharding_levl": 1}},
     r"unknown dp_config keys \['sharding_levl'\].*did you mean 'sharding_level'"),
    ({"pp_config": {"schedule": "1F1B"}}, r"unknown pp_config keys.*did you mean 'schedule_mode'"),
    ({"ep_config": {"axes": "ep"}}, r"unknown ep_config keys.*did you mean 'axis'"),
    ({"moe_config": {"capacity": 2}}, r"unknown moe_config keys \['capacity'\].*'capacity_factor'"),
    ({"fp8_config": {"recipie": "delayed"}}, r"unknown fp8_config keys.*did you mean 'recipe'"),
    ({"recompute": {"granularty": "full"}}, r"unknown recompute keys.*did you mean 'granularity'"),
])
def test_a_misspelt_key_names_the_nearest_valid_one(config, message):
    with pytest.raises(ValueError, match=message):
        ernie.Strategy.from_config(config)


@pytest.mark.parametrize("section, kwargs, error, message", [
    (S.DataParallel, {"bucket_mb": math.nan}, ValueError, "bucket_mb is a size in MiB >= 0"),
    (S.DataParallel, {"bucket_mb": math.inf}, ValueError, "bucket_mb is a size in MiB >= 0"),
    (S.DataParallel, {"sharding_level": 4}, ValueError, "sharding_level must be 0..3"),
    (S.DataParallel, {"grad_reduce_dtype": "fp16"}, ValueError, "grad_reduce_dtype"),
    (S.TensorParallel, {"sequence_parallel_overlap": 1}, TypeError, "is a bool"),
    (S.PipelineParallel, {"accumulate_steps": 0}, ValueError, "accumulate_steps must be an integer"),
    (S.PipelineParallel, {"split_spec": 3}, TypeError, "split_spec is a layer-name prefix"),
    (S.ExpertParallel, {"token_groups": 0}, ValueError, "token_groups = 0 must be a positive"),
    (S.ExpertParallel, {"axis": ""}, TypeError, "ep_config.axis is a mesh axis name"),
    (S.MoE, {"aux_loss_coef": math.nan}, ValueError, "aux_loss_coef must be a finite number"),
    (S.FP8, {"margin": 1}, ValueError, "belong to the delayed recipe"),
    (S.Recompute, {"granularity": "some"}, ValueError, "recompute is one of none, selective, full"),
])
def test_values_are_checked_where_the_section_is_made(section, kwargs, error, message):
    with pytest.raises(error, match=message):
        section(**kwargs)


def test_one_setting_one_spelling():
    strategy = ernie.Strategy(fusion=False)
    with pytest.raises(ValueError, match="fuse given both as compile keywords and in the Strategy"):
        ernie.Strategy.from_config(strategy, fuse=True)
    with pytest.raises(ValueError, match="strategy= or as config=, not both"):
        compile_config("dp2", strategy=strategy)
    with pytest.raises(ValueError, match="device 'tpu'"):
        ernie.Strategy(device="tpu")
    with pytest.raises(TypeError, match="config is a dict of Paddle's parallelize configs"):
        ernie.Strategy.from_config(["dp_config"])


def test_a_strategy_spells_back_as_the_configs():
    config = {"dp_config": {"sharding_level": 2}, "pp_config": {"accumulate_steps": 4},
              "recompute": {"granularity": "selective", "layers": None}, "even_splits": True}
    strategy = ernie.Strategy.from_config(config)
    assert strategy.dp.sharding_level == 2 and strategy.dp.bucket_mb == 25
    assert strategy.to_config() == config
    assert ernie.Strategy.from_config(strategy.to_config()) == strategy
