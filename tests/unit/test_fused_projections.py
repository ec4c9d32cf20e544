"""Fused q/k/v and gate/up projections (`worker_proc.model.fused_projections`): the model's
outputs equal the separate products, the weight is stored once, and a part called with
another input than its group's last one computes that input's product."""

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx.utils import tree_flatten
from mlx_lm.models import llama

from worker_proc.model.fused_projections import FusedPart, fuse_projections


def _model(seed: int = 0) -> llama.Model:
    args = llama.ModelArgs(
        model_type="llama",
        hidden_size=128,
        num_hidden_layers=3,
        intermediate_size=256,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-5,
        vocab_size=300,
    )
    mx.random.seed(seed)
    model = llama.Model(args)
    mx.eval(model.parameters())
    return model


@pytest.mark.parametrize("quantized", [False, True])
def test_fused_model_gives_the_separate_products_logits(quantized):
    model = _model()
    if quantized:
        nn.quantize(model, group_size=64, bits=4)
    tokens = mx.array([[5, 17, 250, 3, 99], [1, 2, 3, 4, 5]])
    before = model(tokens)
    params_before = sum(v.size for _, v in tree_flatten(model.parameters()))
    assert fuse_projections(model) == 2 * 3  # q/k/v and gate/up in each of 3 layers
    assert mx.allclose(model(tokens), before, atol=1e-5).item()
    attn = model.model.layers[0].self_attn
    assert isinstance(attn.k_proj, FusedPart) and "fused" in attn.q_proj and "fused" not in attn.k_proj
    assert sum(v.size for _, v in tree_flatten(model.parameters())) == params_before  # stored once
    assert mx.allclose(mx.compile(lambda t: model(t))(tokens), before, atol=1e-5).item()


def test_a_part_called_with_another_input_computes_that_inputs_product():
    model = _model(1)
    mlp = model.model.layers[1].mlp
    gate, up = mlp.gate_proj, mlp.up_proj
    x, y = mx.random.normal((2, 128)), mx.random.normal((2, 128))
    w_gate, w_up = mx.split(gate.fused.weight, 2, axis=0) if "fused" in gate else (gate.weight, up.weight)
    fuse_projections(model)
    gate, up = mlp.gate_proj, mlp.up_proj
    g = gate(x)
    u = up(y)  # not x: must be y's product, not a slice of x's
    assert mx.allclose(g, x @ w_gate.T, atol=1e-5).item()
    assert mx.allclose(u, y @ w_up.T, atol=1e-5).item()
    assert mx.allclose(gate(x), x @ w_gate.T, atol=1e-5).item()  # read again after the group moved on


def test_projections_that_cannot_be_concatenated_stay_separate():
    model = _model(2)
    attn = model.model.layers[0].self_attn
    attn.v_proj = nn.Linear(128, 64, bias=True)  # bias where q and k have none
    mx.eval(attn.v_proj.parameters())
    assert fuse_projections(model) == 2 * 3 - 1
    assert isinstance(attn.v_proj, nn.Linear) and isinstance(attn.q_proj, nn.Linear)
