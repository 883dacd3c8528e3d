"""The spec §2.5 layer (vla_verify.layer)."""

from __future__ import annotations

import numpy as np
import pytest

from vla_verify.errors import ConfigError, ShapeError, UnknownVariantError
from vla_verify.layer import elu_plus_one, init_layer, layer_forward, layer_inputs


def test_inputs_follow_spec_2_5():
    w = init_layer(d_model=16, n_heads=2, vocab=10, seed=1)
    q, k, v, u = layer_inputs(w, np.arange(7) % 10)
    assert q.shape == k.shape == v.shape == u.shape == (1, 7, 2, 8)
    assert (q > 0).all() and (k > 0).all()  # φ = ELU + 1
    assert np.allclose(np.sum(u**2, axis=-1), 1 / 8)  # ||u||² = 1/d_h
    assert elu_plus_one(np.array([-50.0, 0.0, 2.0])).tolist() == pytest.approx([np.exp(-50), 1, 3])


@pytest.mark.parametrize("mixer", ["vla", "delta", "linear", "softmax"])
def test_forward_shapes_and_finite(mixer):
    w = init_layer(d_model=16, n_heads=2, vocab=10)
    out = layer_forward(w, np.array([[1, 2, 3, 4, 5]]), mixer=mixer)
    assert out.y.shape == (1, 5, 16)
    assert np.isfinite(out.y).all()
    if mixer == "softmax":
        assert out.final_state is None
    else:
        assert out.state_norms.shape == (1, 5, 2)


def test_linear_state_grows_faster_than_vla():
    w = init_layer(seed=0)
    tokens = np.random.default_rng(0).integers(0, 128, size=300)
    lin = layer_forward(w, tokens, mixer="linear").state_norms[0, -1].mean()
    vla = layer_forward(w, tokens, mixer="vla").state_norms[0, -1].mean()
    assert lin > 10 * vla


def test_errors_name_the_argument():
    w = init_layer(d_model=16, n_heads=2, vocab=10)
    with pytest.raises(ShapeError, match="tokens"):
        layer_inputs(w, np.array([0, 10]))
    with pytest.raises(UnknownVariantError, match="mixer"):
        layer_forward(w, np.array([0]), mixer="gru")
    with pytest.raises(ConfigError, match="n_heads"):
        init_layer(d_model=10, n_heads=3)


@pytest.mark.parametrize("mixer", ["vla", "linear", "delta"])
def test_trainable_layer_reproduces_the_numpy_layer(mixer):
    """vla_verify.experiments.model.AttentionLayer holding init_layer's weights is layer_forward."""
    torch = pytest.importorskip("torch")
    from vla_verify.experiments.model import AttentionLayer
    from vla_verify.layer import layer_norm

    w = init_layer(d_model=16, n_heads=2, vocab=10, seed=1)
    tokens = np.random.default_rng(0).integers(0, 10, size=(2, 25))  # crosses a nudge period
    layer = AttentionLayer.from_weights(w, mixer, backend="torch")
    y = layer(torch.as_tensor(layer_norm(w.embedding[tokens]))).detach().numpy()
    ref = layer_forward(w, tokens, mixer=mixer).y
    assert np.allclose(y, ref, rtol=1e-12, atol=1e-12)
    # a planted change (W_u transposed) moves the vla output, so the comparison can fail
    if mixer == "vla":
        with torch.no_grad():
            layer.W_u.copy_(layer.W_u.transpose(1, 2).clone())
        moved = layer(torch.as_tensor(layer_norm(w.embedding[tokens]))).detach().numpy()
        assert not np.allclose(moved, ref, rtol=1e-6, atol=1e-6)
