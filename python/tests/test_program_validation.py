"""What the runtime refuses from Python (issue 18): state dictionaries that do
not fit the program (strict by default, PyTorch's strict=False), calls whose
inputs, learning rate or step Program.step would refuse, and damaged program
bytes. Every refusal is an exception naming the cause; nothing changes."""

import numpy as np
import pytest

import ernie
from ernie import _ernie
from ernie.models.llama import LlamaConfig, LlamaForCausalLM

TINY = dict(vocab_size=32, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
            num_attention_heads=4, num_key_value_heads=2)


@pytest.fixture(scope="module")
def prog():
    cfg = LlamaConfig(**TINY, seed=3)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, cfg.vocab_size, size=(2, 8))
    labels = rng.integers(0, cfg.vocab_size, size=(2, 8))
    p = ernie.compile(LlamaForCausalLM(cfg), ernie.optimizer.SGD(0.1), [ids, labels])
    p.test_batch = (ids, labels)
    return p


def test_load_state_dict_is_strict_by_default(prog):
    state = prog.state_dict()
    names = [k for k in state if k != ernie.Program.STEP_KEY]
    first = names[0]
    partial = {k: v for k, v in state.items() if k != first}
    with pytest.raises(KeyError, match=rf"missing keys \['{first}'\]"):
        prog.load_state_dict(partial)
    with pytest.raises(KeyError, match=r"missing keys \[.*\]"):
        prog.load_state_dict({})
    with pytest.raises(KeyError, match=r"unexpected keys \['no.such.weight'\]"):
        prog.load_state_dict({**state, "no.such.weight": np.zeros(3, np.float32)})
    # Both named at once, and the step count is always a known key.
    with pytest.raises(KeyError, match=rf"missing keys \['{first}'\]; unexpected keys \['x'\]"):
        prog.load_state_dict({**partial, "x": np.zeros(1, np.float32)})
    keys = prog.load_state_dict(state)
    assert keys == ([], []) and keys.missing_keys == [] and keys.unexpected_keys == []


def test_load_state_dict_non_strict_returns_the_incompatible_keys(prog):
    state = prog.state_dict()
    first = next(k for k in state if k != ernie.Program.STEP_KEY)
    changed = {first: state[first] + 1.0, "extra": np.zeros(2, np.float32)}
    keys = prog.load_state_dict(changed, strict=False)
    assert keys.unexpected_keys == ["extra"]
    assert first not in keys.missing_keys
    assert sorted(keys.missing_keys) == sorted(k for k in state if k not in (first, ernie.Program.STEP_KEY))
    np.testing.assert_array_equal(prog.state_dict()[first], state[first] + 1.0)
    prog.load_state_dict(state)


def test_load_state_dict_rejects_wrong_dtypes_and_shapes(prog):
    state = prog.state_dict()
    first = next(k for k in state if k != ernie.Program.STEP_KEY)
    value = state[first]
    for bad in (value > 0, value.astype(np.int64), value.astype(np.int32)):
        with pytest.raises(TypeError, match=rf"'{first}' is f32; an array of {bad.dtype} cannot"):
            prog.load_state_dict({**state, first: bad})
    with pytest.raises(ValueError, match=rf"'{first}' has shape \[{value.size}\], the program's is"):
        prog.load_state_dict({**state, first: value.reshape(-1)})
    # A refused dictionary changes nothing, the other entries included.
    second = [k for k in state if k not in (first, ernie.Program.STEP_KEY)][0]
    with pytest.raises(TypeError):
        prog.load_state_dict({**state, second: state[second] * 2, first: value > 0})
    np.testing.assert_array_equal(prog.state_dict()[second], state[second])
    # Wider floats are rounded into f32, as PyTorch's copy_ does.
    prog.load_state_dict({**state, first: value.astype(np.float64)})
    np.testing.assert_array_equal(prog.state_dict()[first], value)


def test_session_call_validates_like_step(prog):
    ids, labels = prog.test_batch
    session = prog._session
    with pytest.raises(ValueError, match=r"@train_step input 0 must be i64, not f64 \(integers and floats"):
        session.call("train_step", [ids.astype(np.float64), labels], 0.1, 1)
    with pytest.raises(ValueError, match=r"the learning rate must be finite, not nan"):
        session.call("train_step", [ids, labels], float("nan"), 1)
    with pytest.raises(ValueError, match=r"the step is counted from 1, not -5"):
        session.call("train_step", [ids, labels], 0.1, -5)
    with pytest.raises(ValueError, match=r"must have shape \[2, 8\], not \[2, 4\]"):
        session.call("train_step", [ids[:, :4], labels], 0.1, 1)
    with pytest.raises(ValueError, match=r"takes 2 batch inputs, not 1"):
        session.call("train_step", [ids], 0.1, 1)
    # Program.step refuses float ids the same way, before the runtime.
    with pytest.raises(TypeError, match="input 0 has dtype float64"):
        prog.step(ids.astype(np.float64), labels)
    assert np.isfinite(prog.step(ids, labels))


def test_damaged_program_bytes_are_value_errors(prog):
    data = prog.program_file
    _ernie.Session(data)  # the intact file loads
    with pytest.raises(ValueError, match=r"bytes after its program"):
        _ernie.Session(data + b"appended")
    with pytest.raises(ValueError, match=r"checksum does not match"):
        damaged = bytearray(data)
        damaged[len(data) // 2] ^= 0xFF
        _ernie.Session(bytes(damaged))
