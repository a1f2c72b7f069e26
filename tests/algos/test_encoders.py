"""The observation encoders: which network for which frame, channel layouts, and frames kept as they come
(uint8, bool) until the learner's forward."""

from __future__ import annotations

import copy
import importlib.util
import warnings

import pytest
import torch

from rlstruct import RL_Batcher
from rlstruct.algos import EnvSpec, a2c, create_env, describe_env
from rlstruct.algos.encoders import CNNEncoder, MLPEncoder, image_layout, make_encoder
from rlstruct.algos.networks import ActorCritic, EncoderActorCritic, RecurrentActorCritic, build_actor_critic
from rlstruct.algos.policies import create_policy_agent
from rlstruct.errors import SpaceError
from tests import fakes_pixels

pytestmark = pytest.mark.timeout(120)
fakes_pixels.register()


def test_make_encoder_picks_the_mlp_for_flat_frames_and_the_cnn_for_images():
    assert isinstance(make_encoder((4,), (32, 16)), MLPEncoder) and make_encoder((4,), (32, 16)).out_dim == 16
    atari = make_encoder((4, 84, 84), (64,), "uint8")
    assert isinstance(atari, CNNEncoder) and atari.kind == "nature" and atari.out_dim == 512
    assert [m.kernel_size for m in atari.convs if isinstance(m, torch.nn.Conv2d)] == [(8, 8), (4, 4), (3, 3)]
    assert [m.stride for m in atari.convs if isinstance(m, torch.nn.Conv2d)] == [(4, 4), (2, 2), (1, 1)]
    minatar = make_encoder((10, 10, 4), (64,))
    assert isinstance(minatar, CNNEncoder) and minatar.kind == "minatar" and minatar.channels_last
    assert make_encoder((84, 84, 4), (64,)).channels_last and not atari.channels_last
    with pytest.raises(SpaceError, match=r"obs_shape must be flat \(1 dimension\) or an image.*got \(2, 3\)"):
        make_encoder((2, 3), (64,))
    with pytest.raises(SpaceError, match=r"obs_shape must have 3 dimensions.*got \(4,\)"):
        image_layout((4,))


def test_the_actor_critics_pick_their_encoder_from_the_spec():
    flat, image = EnvSpec((4,), "float32", 2, 500), EnvSpec((4, 84, 84), "uint8", 4, 100)
    assert isinstance(build_actor_critic(flat, (8,)), ActorCritic)
    assert isinstance(build_actor_critic(image, (8,)), EncoderActorCritic)
    assert isinstance(build_actor_critic(image, (8,)).encoder, CNNEncoder)
    assert isinstance(RecurrentActorCritic(image.obs_shape, 4, (8,)).encoder, CNNEncoder)
    assert isinstance(RecurrentActorCritic(flat.obs_shape, 2, (8,)).encoder, MLPEncoder)


@pytest.mark.parametrize("shape", [(10, 10, 4), (84, 84, 4)])
def test_channel_last_frames_are_permuted_inside_the_forward(shape):
    h, w, c = shape
    torch.manual_seed(0)
    last = CNNEncoder(shape)
    torch.manual_seed(0)
    first = CNNEncoder((c, h, w))
    assert last.scale == first.scale == 1 / 255
    assert last.channels_last and not first.channels_last
    frames = torch.randint(0, 256, (3, h, w, c), dtype=torch.uint8)
    assert torch.equal(last(frames), first(frames.permute(0, 3, 1, 2)))


def test_uint8_pixels_are_scaled_by_255_whatever_dtype_they_arrive_in():
    torch.manual_seed(0)
    enc = CNNEncoder((4, 10, 10), obs_dtype="uint8")
    torch.manual_seed(0)
    unscaled = CNNEncoder((4, 10, 10), obs_dtype="float32")
    frames = torch.randint(0, 256, (5, 4, 10, 10), dtype=torch.uint8)
    # uint8 frames and the same frames as floats give the same features.
    assert torch.equal(enc(frames), enc(frames.float()))
    assert torch.allclose(enc(frames), unscaled(frames.float() / 255), atol=1e-5)
    planes = torch.rand(5, 4, 10, 10) > 0.5
    bool_enc = CNNEncoder((4, 10, 10), obs_dtype="bool")
    assert torch.equal(bool_enc(planes), bool_enc(planes.float()))
    assert MLPEncoder(3, (4,), obs_dtype="uint8").scale == 1 / 255 and enc.scale == 1 / 255
    assert bool_enc.scale == unscaled.scale == 1.0
    # 0/1 planes handed over as uint8 (gymnax's MinAtar): their space's high is 1, and so is the scale.
    assert CNNEncoder((10, 10, 4), obs_dtype="uint8", obs_high=1.0).scale == 1.0


@pytest.mark.parametrize("env", ["LitSide-v0", "LitSideHWC-v0"])
def test_frames_stay_uint8_through_the_batcher_buffer(env):
    spec = describe_env(env, "gymnasium", None)
    assert spec.pixels and spec.obs_dtype == "uint8" and spec.obs_high == 255.0
    assert build_actor_critic(spec, (8,)).encoder.scale == 1 / 255
    agent_args = {"spec": spec, "hidden_sizes": (8,), "device": "cpu"}
    env_args = {"name": env, "n_envs": 4, "autoreset": True, "backend": "gymnasium"}
    with RL_Batcher(5, create_policy_agent, agent_args, create_env, env_args, 0, [0]) as batcher:
        batcher.reset()
        batcher.execute()
        traj, _ = batcher.get()
    for key in ("observation/frame", "_observation/frame"):
        assert traj.trajectories[key].dtype == torch.uint8
        assert traj.trajectories[key].shape == (4, 5, *spec.obs_shape)
    # The learner's copy is the same uint8 tensor; the encoder makes floats inside its forward.
    assert traj.to("cpu").trajectories["observation/frame"].dtype == torch.uint8


def _cfg(tmp_path, **kw):
    kw = {"backend": "gymnasium", "progress": False, "tensorboard": False, "logdir": str(tmp_path),
          "time_limit": 300.0, "n_evaluation_envs": 8, **kw}
    return a2c.A2CConfig(**kw)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("env", ["LitSide-v0", "LitSideHWC-v0"])
def test_a2c_learns_from_pixels_with_the_cnn(env, tmp_path):
    # Seeds 0-5 reach 15.9-16 (of 16) at 24k env steps; at 16k seed 0 was still at 11.4.
    result = a2c.train(_cfg(tmp_path, env=env, max_env_steps=24_000, n_envs=16, lr=1e-3))
    random_return = fakes_pixels.EPISODE_STEPS / 2
    assert result.eval_return >= 1.5 * random_return, result.eval_return


@pytest.mark.skipif(importlib.util.find_spec("minatar") is None, reason="minatar is not installed")
@pytest.mark.timeout(200)
def test_a2c_runs_on_minatar_breakout_frames(tmp_path):
    spec = describe_env("MinAtar/Breakout-v1", "gymnasium", None)
    assert (spec.obs_shape, spec.obs_dtype, spec.n_actions, spec.max_episode_steps) == ((10, 10, 4), "bool", 3, 1000)
    result = a2c.train(_cfg(tmp_path, env="MinAtar/Breakout-v1", max_env_steps=1024, n_envs=8, n_evaluation_envs=2,
                            max_episode_steps=100))
    assert result.env_steps >= 1024 and result.checkpoint


def test_cnn_layer_norm_normalises_each_layer_before_its_relu():
    plain = CNNEncoder((10, 10, 4), obs_dtype="bool")
    normed = CNNEncoder((10, 10, 4), obs_dtype="bool", layer_norm=True)
    kinds = [type(m).__name__ for m in [*normed.convs, *normed.linear]]
    assert kinds == ["Conv2d", "GroupNorm", "ReLU", "Flatten", "Linear", "LayerNorm", "ReLU"]
    assert not any(isinstance(m, (torch.nn.GroupNorm, torch.nn.LayerNorm)) for m in [*plain.convs, *plain.linear])
    frames = torch.rand(5, 10, 10, 4) < 0.3
    assert normed(frames).shape == plain(frames).shape == (5, 128)


def test_pqn_trains_its_layer_norm_cnn_on_torch_minatar_frames(tmp_path):
    from rlstruct.algos import pqn
    from rlstruct.algos.dqn import PixelQNetwork

    cfg = pqn.PQNConfig(env="MinAtar/Breakout-v1", backend="torch", max_env_steps=1024, n_envs=16, n_steps=32,
                        n_evaluation_envs=2, progress=False, tensorboard=False, logdir=str(tmp_path), preset="none")
    spec = describe_env("MinAtar/Breakout-v1", "torch", None)
    model = pqn.build_model(cfg, spec)
    assert isinstance(model, PixelQNetwork) and any(isinstance(m, torch.nn.LayerNorm) for m in model.modules())
    result = pqn.train(cfg)
    assert result.env_steps >= 1024 and result.checkpoint


@pytest.mark.parametrize("layer_norm", [False, True])
@pytest.mark.parametrize("obs_shape", [(10, 10, 4), (84, 84, 4)])
@pytest.mark.slow
def test_a_large_batch_of_channels_last_frames_gets_the_features_and_gradients_of_the_nchw_flattening(obs_shape,
                                                                                                     layer_norm):
    # Above out_dim rows the encoder flattens the maps in memory order and permutes the first linear layer's weight
    # instead; the reference is the module chain as registered (the maps flattened in (C, H, W) order).
    torch.manual_seed(0)
    atari = obs_shape[0] == 84
    enc = CNNEncoder(obs_shape, obs_dtype="uint8" if atari else "bool", layer_norm=layer_norm)
    n = enc.out_dim + 3
    frames = (torch.rand(n, *obs_shape) * 255).to(torch.uint8) if atari else torch.rand(n, *obs_shape) < 0.3
    scale = 1 / 255 if atari else 1.0

    def reference(x):
        return enc.linear(enc.convs(x.permute(0, 3, 1, 2).float() * scale))

    params = list(enc.parameters())
    got = enc(frames)
    grads = torch.autograd.grad(got.square().sum(), params)
    want = reference(frames)
    want_grads = torch.autograd.grad(want.square().sum(), params)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for g, w in zip(grads, want_grads):
        # float32 sums of up to 3,136 products in another order: within a thousandth of the gradient's scale
        torch.testing.assert_close(g, w, rtol=1e-3, atol=1e-3 * float(w.abs().max()))
    small = frames[:enc.out_dim]
    # a batch of at most out_dim rows takes the registered chain (the MinAtar maps laid out row by row, where the
    # LayerNorm's sums run in another order)
    torch.testing.assert_close(enc(small), reference(small), rtol=1e-6 if layer_norm else 0,
                               atol=1e-6 if layer_norm else 0)
    assert list(enc.state_dict()) == [k for k, _ in enc.named_parameters()], "the layers are registered once"


@pytest.mark.parametrize("layer_norm", [False, True])
def test_the_minatar_cnn_lays_a_small_batchs_maps_out_row_by_row_with_the_features_and_gradients_of_channels_last(
        layer_norm):
    # Up to out_dim rows the flattening copies the maps; the MinAtar conv's output is copied row-major right after the
    # conv instead, so that its ReLU's backward gets a gradient of its own layout. Same numbers as the maps kept
    # channels-last through the registered chain (the reference: the permuted frames are channels-last maps).
    torch.manual_seed(0)
    enc = CNNEncoder((10, 10, 4), obs_dtype="bool", layer_norm=layer_norm)
    frames = torch.rand(enc.out_dim, 10, 10, 4) < 0.3
    relu = next(m for m in enc.convs if isinstance(m, torch.nn.ReLU))
    layouts = []
    handle = relu.register_forward_pre_hook(lambda module, args: layouts.append(args[0].is_contiguous()))
    params = list(enc.parameters())
    got = enc(frames)
    grads = torch.autograd.grad(got.square().sum(), params)
    assert layouts == [True], "the ReLU runs on row-major maps"
    want = enc.linear(enc.convs(frames.permute(0, 3, 1, 2).float()))
    handle.remove()
    assert layouts[1:] == [False], "the reference's maps are channels-last"
    # the same products; the LayerNorm's sums run in another order on the other layout
    torch.testing.assert_close(got, want, rtol=1e-6 if layer_norm else 0, atol=1e-6 if layer_norm else 0)
    for g, w in zip(grads, torch.autograd.grad(want.square().sum(), params)):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6 * float(w.abs().max()))


def test_the_nature_cnn_keeps_its_maps_channels_last():
    # there a row-major copy after the last conv saved nothing measurable (benchmarks/encoder_layout.py)
    enc = CNNEncoder((4, 84, 84))
    layouts = []
    for m in enc.convs:
        if isinstance(m, torch.nn.ReLU):
            m.register_forward_pre_hook(lambda module, args: layouts.append(args[0].is_contiguous()))
    enc(torch.zeros(2, 4, 84, 84, dtype=torch.uint8))
    assert layouts == [False, False, False]


def test_a_copied_encoder_computes_its_large_batches_with_its_own_weights():
    # a target network is a deepcopy: its large-batch path must read the copy's layers, not the original's
    enc = CNNEncoder((10, 10, 4), obs_dtype="bool")
    copied = copy.deepcopy(enc)
    with torch.no_grad():
        for p in copied.parameters():
            p.mul_(2.0)
    frames = torch.rand(enc.out_dim + 1, 10, 10, 4) < 0.3
    want = copied.linear(copied.convs(frames.permute(0, 3, 1, 2).float()))
    torch.testing.assert_close(copied(frames), want, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(enc(frames), want)


def test_a_trace_of_the_cnn_is_clean_and_right_for_batches_of_any_size():
    """``rlstruct export``'s TorchScript traces the policy on a batch of 2: the CNN's fast path for large batches is
    a branch on the batch size, which a trace would record (with a TracerWarning) instead of following."""
    encoder = CNNEncoder((10, 10, 4), obs_dtype="uint8", channels_last=True).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("error", torch.jit.TracerWarning)
        warnings.simplefilter("ignore", DeprecationWarning)  # torch's own notice that torch.jit.trace is deprecated
        with torch.no_grad():
            traced = torch.jit.trace(encoder, (torch.zeros(2, 10, 10, 4, dtype=torch.uint8),), check_trace=False)
    frames = torch.randint(0, 2, (600, 10, 10, 4), dtype=torch.uint8)  # past out_dim: the fast path's batches
    with torch.no_grad():
        torch.testing.assert_close(traced(frames), encoder(frames), rtol=1e-5, atol=1e-5)
