"""The GPU fast path, on what a CPU can check: weight sharing, overlapped collection, the compiled update, its flags.

Equivalence tests compare each fast path with the path it replaces (same seeds, same weights): the weights a
batcher's agent reads without a host copy are the learner's, bit for bit; an overlapped collection yields what
the sequential batcher yields when driven with the same (one update stale) weights; a compiled update moves the
parameters where the eager update does, within float tolerance. The stream versions are marked ``cuda``.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

from rlstruct.algos import a2c, create_env, describe_env, ppo, reinforce
from rlstruct.algos._train.config import OnPolicyConfig, RunConfig, validate_run_config
from rlstruct.algos._train.session import training_run, validate
from rlstruct.algos._train.update import UpdateStep, clip_groups, reads, weight_sync_mode
from rlstruct.algos.networks import ActorCritic, build_actor_critic, make_adam
from rlstruct.algos.policies import actor_critic_outputs, create_policy_agent
from rlstruct.batchers import Pipeline, RL_Batcher, WeightSync
from rlstruct.errors import BatcherStateError, ConfigError
from rlstruct.structures import DictTensor
from tests.helpers import bare_run

SPEC = describe_env("CartPole-v1", "torch", None)
CUDA = pytest.mark.cuda


def _rows(result) -> list[str]:
    """progress.csv's rows, every column but the clock's (repr: nan equals nan)."""
    return [repr({k: v for k, v in r.items() if k not in ("wall_time_s", "eval/blocked_s")}) for r in result.history]


def _batcher(device="cpu", *, zero_copy=False, n_envs=4, T=6, n_processes=0, hidden=(8,)):
    return RL_Batcher(T, create_policy_agent, {"spec": SPEC, "hidden_sizes": hidden, "device": device}, create_env,
                      {"name": "CartPole-v1", "n_envs": n_envs, "autoreset": True, "device": device}, n_processes,
                      [3] * max(n_processes, 1), agent_info=DictTensor({"stochastic": torch.tensor([True])}),
                      agent_seeds=[7] * max(n_processes, 1), device=device, zero_copy=zero_copy)


def _perturb(model: torch.nn.Module, k: int) -> None:
    """A stand-in for an optimizer step: changes every weight in place."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.sin(torch.arange(p.numel(), dtype=p.dtype, device=p.device).reshape(p.shape) + k))


# ----------------------------------------------------------------------------------------------- WeightSync
def test_shared_weights_are_the_learners_tensors_and_follow_in_place_updates():
    model = build_actor_critic(SPEC, (8,))
    with _batcher() as b:
        sync = WeightSync(b, model, "cpu")
        agent_model = b.local_agent().model
        assert sync.mode == "shared" and not sync.copies_to_host
        for mine, theirs in zip(model.parameters(), agent_model.parameters()):
            assert mine.data_ptr() == theirs.data_ptr() and not theirs.requires_grad
        _perturb(model, 1)
        sync.push()
        for mine, theirs in zip(model.state_dict().values(), agent_model.state_dict().values()):
            assert torch.equal(mine, theirs)


def test_copy_mode_copies_in_place_and_keeps_a_snapshot():
    model = build_actor_critic(SPEC, (8,))
    with _batcher() as b:
        sync = WeightSync(b, model, "cpu", mode="copy")
        agent_model = b.local_agent().model
        before = [p.data_ptr() for p in agent_model.parameters()]
        sync.push()
        snapshot = copy.deepcopy(model.state_dict())
        _perturb(model, 2)  # the learner moves on; the agent keeps what was pushed
        assert all(torch.equal(snapshot[k], v) for k, v in agent_model.state_dict().items())
        sync.push()
        assert all(torch.equal(model.state_dict()[k], v) for k, v in agent_model.state_dict().items())
        assert [p.data_ptr() for p in agent_model.parameters()] == before  # in place: no new tensors


def test_auto_mode_sends_cpu_copies_to_worker_processes():
    model = build_actor_critic(SPEC, (8,))
    with _batcher(n_processes=1) as b:
        assert WeightSync(b, model, "cpu").mode == "cpu"
        with pytest.raises(ConfigError, match="needs an in-process batcher"):
            WeightSync(b, model, "cpu", mode="shared")
        with pytest.raises(BatcherStateError, match="local_agent needs an open batcher with n_processes=0"):
            b.local_agent()


def test_bad_sync_mode_is_a_value_error():
    model = build_actor_critic(SPEC, (8,))
    with _batcher() as b, pytest.raises(ValueError, match="mode must be one of"):
        WeightSync(b, model, "cpu", mode="gpu")


def test_shared_mode_needs_a_matching_agent_model():
    other = build_actor_critic(SPEC, (16,))  # the batcher's agent has hidden size 8
    with _batcher() as b:
        assert WeightSync(b, other, "cpu").mode == "copy"  # falls back to agent.update with a device copy
        with pytest.raises(ConfigError, match="needs an agent with a `model`"):
            WeightSync(b, other, "cpu", mode="shared")


@pytest.mark.parametrize("mode", ["shared", "copy"])
def test_device_paths_collect_what_the_cpu_copy_path_collects(mode):
    """Same seeds, same weights at every iteration: the same trajectories, bit for bit."""
    outs = {}
    for m in ("cpu", mode):
        model = build_actor_critic(SPEC, (8,))
        torch.manual_seed(0)
        model.load_state_dict(build_actor_critic(SPEC, (8,)).state_dict())
        got = []
        with _batcher() as b:
            pipe = Pipeline(b, WeightSync(b, model, "cpu", mode=m))
            pipe.start()
            for k in range(4):
                got.append(pipe.next().trajectories["action/action"].clone())
                _perturb(model, k)
                pipe.updated()
            pipe.close()
        outs[m] = got
    assert all(torch.equal(x, y) for x, y in zip(outs["cpu"], outs[mode]))


# ----------------------------------------------------------------------------------------------- Pipeline
def test_overlapped_pipeline_alternates_buffers_and_uses_one_update_stale_weights():
    """What an overlapped pipeline returns equals a sequential batcher driven with one update stale weights, and
    batch k stays intact while batch k + 1 is written into the other buffer."""
    model = build_actor_critic(SPEC, (8,))
    reference = copy.deepcopy(model)
    with _batcher(zero_copy=True) as b, _batcher() as ref:
        pipe = Pipeline(b, WeightSync(b, model, "cpu", mode="copy"), overlap=True)
        pipe.start()
        ref.update({k: v.clone() for k, v in reference.state_dict().items()})
        ref.reset()
        pointers = []
        for k in range(5):
            traj = pipe.next()  # on the CPU, acquisition k + 1 has run already, into the other buffer
            frame = traj.trajectories["observation/frame"]
            pointers.append(frame.data_ptr())
            # The reference collects batch k with the weights pushed before it: those of update k - 2.
            ref.execute()
            expected, _ = ref.get()
            assert torch.equal(frame, expected.trajectories["observation/frame"])
            assert torch.equal(traj.trajectories["action/action"], expected.trajectories["action/action"])
            ref.update({key: v.clone() for key, v in model.state_dict().items()})
            _perturb(model, k)  # update k
            pipe.updated()
        pipe.close()
        assert pointers[0::2] == [pointers[0]] * 3 and pointers[1::2] == [pointers[1]] * 2
        assert pointers[0] != pointers[1]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_closing_a_pipeline_whose_worker_died_mid_acquisition_raises_nothing():
    """A worker SIGKILLed while the pipeline's next acquisition runs fails the batcher at the next ``next()``; the
    pipeline's ``close()`` (a run's exit stack calls it) then has nothing to collect, and does not raise a
    ``BatcherStateError`` over the worker's failure, which a run stopped by it reports."""
    import os
    import signal

    from rlstruct.errors import BatcherWorkerError

    model = build_actor_critic(SPEC, (8,))
    with _batcher(n_processes=1) as b:
        pipe = Pipeline(b, WeightSync(b, model, "cpu", mode="cpu"), overlap=True)
        pipe.start()
        pipe.next()  # the next acquisition is under way
        os.kill(b.worker_reports()[0]["pid"], signal.SIGKILL)
        with pytest.raises(BatcherWorkerError, match="was killed by SIGKILL"):
            pipe.next()
        pipe.close()
        pipe.close()


def test_overlap_without_zero_copy_copies_and_collects_the_same():
    """Without the double buffer (e.g. with cuda_graph), get copies each batch out before the next is launched."""
    got = {}
    for zero_copy in (True, False):
        torch.manual_seed(0)
        model = build_actor_critic(SPEC, (8,))
        with _batcher(zero_copy=zero_copy) as b:
            assert b.zero_copy == zero_copy
            pipe = Pipeline(b, WeightSync(b, model, "cpu", mode="copy"), overlap=True)
            pipe.start()
            batches = []
            for k in range(4):
                tt = pipe.next().trajectories
                batches += [tt["observation/frame"].clone(), tt["action/action"].clone()]
                _perturb(model, k)
                pipe.updated()
            pipe.close()
        got[zero_copy] = batches
    assert all(torch.equal(x, y) for x, y in zip(got[True], got[False]))


def test_pipeline_misuse_is_a_typed_error():
    model = build_actor_critic(SPEC, (8,))
    with _batcher() as b:
        with pytest.raises(BatcherStateError, match="needs start"):
            Pipeline(b, WeightSync(b, model, "cpu")).next()
    with _batcher(zero_copy=True) as b:
        with pytest.raises(ConfigError, match="mode='shared'"):
            Pipeline(b, WeightSync(b, model, "cpu", mode="shared"), overlap=True)


@pytest.mark.slow  # 2.4 CPU s on the reference CPU: slow is 1.5 s or more
def test_weight_sync_mode_of_a_config_and_its_outcome():
    """A run asks for "auto" (or "cpu" without share_weights); WeightSync alone decides from the placement."""
    assert weight_sync_mode(OnPolicyConfig()) == "auto"
    assert weight_sync_mode(OnPolicyConfig(share_weights=False)) == "cpu"
    model = build_actor_critic(SPEC, (8,))
    with _batcher() as b:
        assert WeightSync(b, model, "cpu", "auto").mode == "shared"
        assert WeightSync(b, model, "cpu", "auto", snapshot=True).mode == "copy"  # an overlapped acquisition
    with _batcher(n_processes=1) as b:
        assert WeightSync(b, model, "cpu", "auto", snapshot=True).mode == "cpu"


# ----------------------------------------------------------------------------------------------- algorithms
@pytest.mark.slow  # 1.7 CPU s on the reference CPU: slow is 1.5 s or more
@pytest.mark.timeout(120)
def test_a2c_shared_weights_log_what_cpu_copies_log(tmp_path):
    cfg = dict(max_env_steps=768, n_envs=8, eval_every=3, hidden_sizes=(16,), anneal_lr=False, log_every=1)
    copied = a2c.train(a2c.A2CConfig(**bare_run(tmp_path / "a", share_weights=False, **cfg)))
    shared = a2c.train(a2c.A2CConfig(**bare_run(tmp_path / "b", share_weights=True, **cfg)))
    assert len(copied.history) > 10
    assert _rows(copied) == _rows(shared)


@pytest.mark.slow  # 2.8 CPU s on the reference CPU: slow is 1.5 s or more
@pytest.mark.timeout(120)
def test_reinforce_shared_weights_log_what_cpu_copies_log(tmp_path):
    cfg = dict(max_env_steps=800, n_envs=4, eval_every=2, hidden_sizes=(16,), log_every=1)
    copied = reinforce.train(reinforce.ReinforceConfig(**bare_run(tmp_path / "a", share_weights=False, **cfg)))
    shared = reinforce.train(reinforce.ReinforceConfig(**bare_run(tmp_path / "b", **cfg)))
    assert len(copied.history) > 5
    assert _rows(copied) == _rows(shared)


@pytest.mark.slow  # 1.9 CPU s on the reference CPU: slow is 1.5 s or more
@pytest.mark.timeout(120)
def test_ppo_shared_weights_log_what_cpu_copies_log(tmp_path):
    cfg = dict(max_env_steps=1_024, n_envs=8, n_steps=16, eval_every=3, hidden_sizes=(16,), log_every=1)
    copied = ppo.train(ppo.PPOConfig(**bare_run(tmp_path / "a", share_weights=False, **cfg)))
    shared = ppo.train(ppo.PPOConfig(**bare_run(tmp_path / "b", **cfg)))
    assert _rows(copied) == _rows(shared)


@pytest.mark.slow  # 2.5 CPU s on the reference CPU: slow is 1.5 s or more
@pytest.mark.timeout(120)
def test_float32_physics_reaches_every_batchers_envs_and_trains(tmp_path):
    """--physics-dtype float32: the training and evaluation envs step float32 physics; a run is reproducible and
    differs from the float64 one only through the rounding."""
    env = create_env("CartPole-v1", 2, seed=0, physics_dtype="float32")
    assert env.physics_dtype == torch.float32 and create_env("CartPole-v1", 2, seed=0).physics_dtype == torch.float64
    cfg = dict(max_env_steps=768, n_envs=8, eval_every=3, hidden_sizes=(16,), anneal_lr=False, log_every=1)
    first = a2c.train(a2c.A2CConfig(**bare_run(tmp_path / "a", physics_dtype="float32", **cfg)))
    second = a2c.train(a2c.A2CConfig(**bare_run(tmp_path / "b", physics_dtype="float32", **cfg)))
    wide = a2c.train(a2c.A2CConfig(**bare_run(tmp_path / "c", **cfg)))
    assert _rows(first) == _rows(second) and _rows(first) != _rows(wide)
    assert len(first.history) == len(wide.history)


@pytest.mark.slow  # 2.8 CPU s on the reference CPU: slow is 1.5 s or more
@pytest.mark.timeout(120)
@pytest.mark.parametrize("module, cls", [(a2c, a2c.A2CConfig), (ppo, ppo.PPOConfig)])
def test_overlap_in_process_runs_and_is_reproducible(tmp_path, module, cls):
    cfg = dict(max_env_steps=1_024, n_envs=8, eval_every=3, hidden_sizes=(16,), log_every=1, overlap=True)
    first = module.train(cls(**bare_run(tmp_path / "a", **cfg)))
    second = module.train(cls(**bare_run(tmp_path / "b", **cfg)))
    plain = module.train(cls(**bare_run(tmp_path / "c", **{**cfg, "overlap": False})))
    assert _rows(first) == _rows(second)
    assert _rows(first) != _rows(plain)  # one update stale: other data from the second batch on
    losses = [v for r in first.history for k, v in r.items() if k.startswith("loss/")]
    assert losses and all(math.isfinite(x) for x in losses)


@pytest.mark.parametrize("module, cls, extra, match", [
    (a2c, a2c.A2CConfig, {"compile_update": True, "recurrent": True}, "does not support recurrent"),
    (ppo, ppo.PPOConfig, {"compile_update": True, "recurrent": True}, "does not support recurrent"),
    (a2c, a2c.A2CConfig, {"compile_update": True, "check_devices": True}, "does not support check_devices"),
    (reinforce, reinforce.ReinforceConfig, {"compile_update": True, "check_devices": True}, "check_devices"),
    (a2c, a2c.A2CConfig, {"autocast": "bfloat16", "check_devices": True},
     "autocast='bfloat16' does not support check_devices=True"),
    (reinforce, reinforce.ReinforceConfig, {"autocast": "bfloat16", "check_devices": True}, "check_devices"),
    (ppo, ppo.PPOConfig, {"compile_policy": True, "recurrent": True},
     "compile_policy=True does not support recurrent=True"),
    (a2c, a2c.A2CConfig, {"cuda_graph": True}, "needs a CUDA batcher_device"),
    (ppo, ppo.PPOConfig, {"cuda_graph": True}, "needs a CUDA batcher_device"),
])
def test_flag_combinations_that_cannot_work_are_config_errors(module, cls, extra, match):
    with pytest.raises(ConfigError, match=match):
        validate(module.ALGORITHM, cls(**extra))


def test_cli_rejects_a_bad_combination_in_one_line(capsys):
    from rlstruct.algos._train.cli import main

    assert main(["train", "a2c", "--compile-update", "--recurrent"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "compile_update=True does not support recurrent=True" in err[0]


def test_cli_has_the_fast_path_flags(capsys):
    from rlstruct.algos._train.cli import main

    for algo in ("a2c", "ppo", "reinforce"):
        with pytest.raises(SystemExit):
            main(["train", algo, "--help"])
        out = capsys.readouterr().out
        for flag in ("--compile-update", "--share-weights", "--learner-device", "--batcher-device", "--autocast",
                     "--compile-policy"):
            assert flag in out, (algo, flag)
        # a captured loop cannot stop early: only the algorithms that collect from auto-reset envs take --cuda-graph
        assert ("--cuda-graph" in out) == (algo != "reinforce"), algo


def test_matmul_precision_is_set_for_the_run_and_restored_after(tmp_path):
    seen = []
    previous = torch.get_float32_matmul_precision()
    config = RunConfig(matmul_precision="high", **bare_run(tmp_path))
    with pytest.raises(RuntimeError, match="inside"):  # restored on the way out of a failing run too
        with training_run("a2c", config, SPEC, start=0.0):
            seen.append(torch.get_float32_matmul_precision())
            raise RuntimeError("inside")
    assert seen == ["high"] and torch.get_float32_matmul_precision() == previous
    with pytest.raises(ValueError, match=r"matmul_precision must be one of .*'medium'\], got 'tf32'; pass"):
        validate_run_config(RunConfig(matmul_precision="tf32"))


@pytest.mark.slow  # 2.5 CPU s on the reference CPU: slow is 1.5 s or more
@pytest.mark.timeout(120)
def test_a2c_at_high_matmul_precision_is_reproducible_and_close_to_highest(tmp_path):
    """Whether "high" changes bits depends on the machine (TF32 on an Ampere or later GPU; oneDNN's reduced
    precision on CPUs with bfloat16 instructions, none on others): a run is reproducible, and its first update
    matches full float32 to reduced-precision rounding."""
    cfg = dict(max_env_steps=512, n_envs=8, eval_every=3, hidden_sizes=(16,), anneal_lr=False, log_every=1)
    highest = a2c.train(a2c.A2CConfig(**bare_run(tmp_path / "a", **cfg)))
    high = a2c.train(a2c.A2CConfig(**bare_run(tmp_path / "b", matmul_precision="high", **cfg)))
    again = a2c.train(a2c.A2CConfig(**bare_run(tmp_path / "c", matmul_precision="high", **cfg)))
    assert len(high.history) == len(highest.history) > 5 and _rows(high) == _rows(again)
    first = [next(r for r in run.history if "loss/value" in r) for run in (highest, high)]
    for key in ("loss/policy", "loss/value", "loss/entropy"):
        assert first[1][key] == pytest.approx(first[0][key], rel=1e-2, abs=1e-3), key


# ----------------------------------------------------------------------------------------------- compiled update
def _a2c_like_loss(model):
    """An A2C-like loss over a batch of :func:`_batch`'s keys."""
    @reads("frame", "next_frame", "action", "advantage", "mask")
    def loss_fn(batch):
        out = actor_critic_outputs(model, batch["frame"], batch["next_frame"], batch["action"])
        return a2c.a2c_loss(out["log_prob"], out["entropy"], out["value"], batch["advantage"], batch["mask"],
                            value_coef=0.5, entropy_coef=0.01, normalize_advantages=True)
    return loss_fn


def _a2c_like_step(model, compile, backend="inductor", dynamic=None):
    return UpdateStep(_a2c_like_loss(model), make_adam(model, 1e-2, "cpu"), clip_groups(model), max_grad_norm=0.5,
                      device="cpu", compile=compile, backend=backend, dynamic=dynamic)


def _batch(B=6, T=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"frame": torch.randn(B, T, 4, generator=g), "next_frame": torch.randn(B, T, 4, generator=g),
            "action": torch.randint(0, 2, (B, T), generator=g), "advantage": torch.randn(B, T, generator=g),
            "mask": torch.ones(B, T)}


def _compare_updates(backend, batches, dynamic=None):
    torch.manual_seed(0)
    eager_model = ActorCritic(4, 2, (16,))
    compiled_model = copy.deepcopy(eager_model)
    eager, compiled = _a2c_like_step(eager_model, False), _a2c_like_step(compiled_model, True, backend, dynamic)
    start = [p.detach().clone() for p in eager_model.parameters()]
    for batch in batches:
        a, b = eager(batch), compiled(batch)
        assert a.keys() == b.keys()
        for k in a:
            torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5)
    for p, q, s in zip(eager_model.parameters(), compiled_model.parameters(), start):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)
        assert not torch.equal(p, s)  # the updates moved the weights


@pytest.mark.slow  # 2.4 CPU s on the reference CPU: slow is 1.5 s or more
@pytest.mark.timeout(300)
def test_compiled_update_equals_eager_update_aot_eager():
    """Dynamo and AOTAutograd (the compiled forward and backward) without inductor's C++ code generation."""
    _compare_updates("aot_eager", [_batch(seed=0), _batch(seed=1)])


@pytest.mark.slow  # 2.2 CPU s on the reference CPU: slow is 1.5 s or more
@pytest.mark.timeout(300)
def test_compiled_update_with_changing_shapes_aot_eager():
    """REINFORCE's batches change their T: ``dynamic=True`` compiles once for every length."""
    _compare_updates("aot_eager", [_batch(T=5), _batch(T=9, seed=1), _batch(T=3, seed=2)], dynamic=True)


def _a2c_like_sgd_step(model, *, autocast=None, compile=False, backend="aot_eager"):
    """An A2C-like update with SGD: the weights move by lr x gradient, so two updates' weights differ as much as
    their gradients do (Adam's first step, lr x sign(gradient), would flip with the sign of a tiny gradient)."""
    return UpdateStep(_a2c_like_loss(model), torch.optim.SGD(model.parameters(), lr=0.1), clip_groups(model),
                      max_grad_norm=0.0, device="cpu", autocast=autocast, compile=compile, backend=backend)


def test_autocast_update_computes_in_bfloat16_and_stays_close_to_float32():
    torch.manual_seed(0)
    full = ActorCritic(4, 2, (64, 64))
    half = copy.deepcopy(full)
    dtypes = []
    half.actor[0].register_forward_hook(lambda module, args, out: dtypes.append(out.dtype))
    batch = _batch(B=16, T=8)
    a = _a2c_like_sgd_step(full)(batch)
    b = _a2c_like_sgd_step(half, autocast=torch.bfloat16)(batch)
    assert dtypes == [torch.bfloat16]  # the forward's products ran in bfloat16
    assert a.keys() == b.keys() and all(v.dtype == torch.float32 for v in b.values())
    assert any(not torch.equal(a[k], b[k]) for k in a)  # other bits than float32 ...
    for k in a:  # ... within bfloat16's rounding (8 bits of mantissa)
        torch.testing.assert_close(b[k], a[k], rtol=3e-2, atol=3e-3)
    for p, q in zip(full.parameters(), half.parameters()):
        assert q.dtype == torch.float32 and (q.grad is None or q.grad.dtype == torch.float32)
        torch.testing.assert_close(q, p, rtol=3e-2, atol=3e-3)


@pytest.mark.slow  # 2.5 CPU s on the reference CPU: slow is 1.5 s or more
@pytest.mark.timeout(300)
def test_compiled_autocast_update_equals_eager_autocast_update_aot_eager():
    torch.manual_seed(0)
    eager_model = ActorCritic(4, 2, (16,))
    compiled_model = copy.deepcopy(eager_model)
    eager = _a2c_like_sgd_step(eager_model, autocast=torch.bfloat16)
    compiled = _a2c_like_sgd_step(compiled_model, autocast=torch.bfloat16, compile=True)
    for batch in (_batch(seed=0), _batch(seed=1)):
        a, b = eager(batch), compiled(batch)
        for k in a:
            torch.testing.assert_close(b[k], a[k], rtol=1e-2, atol=1e-3)
    for p, q in zip(eager_model.parameters(), compiled_model.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-2, atol=1e-3)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("module, cls", [(a2c, a2c.A2CConfig), (ppo, ppo.PPOConfig)])
def test_compile_policy_collects_what_the_eager_policy_collects(tmp_path, module, cls):
    """--compile-policy: the same actions, so the same episodes; the losses within float rounding (the compiled
    step's log-probabilities may differ in their last bits)."""
    cfg = dict(max_env_steps=2_048, n_envs=16, eval_every=4, hidden_sizes=(16,), log_every=1)
    eager = module.train(cls(**bare_run(tmp_path / "a", **cfg)))
    compiled = module.train(cls(**bare_run(tmp_path / "b", compile_policy=True, **cfg)))
    assert len(eager.history) == len(compiled.history) > 4
    for a, b in zip(eager.history, compiled.history):
        assert a.keys() == b.keys()
        for k in a:
            if k.startswith("train/") or k.startswith("eval/return") or k in ("iteration", "env_steps"):
                assert repr(a[k]) == repr(b[k]), k  # repr: nan (no episode ended yet) equals nan
            elif k not in ("wall_time_s", "eval/blocked_s"):
                assert b[k] == pytest.approx(a[k], rel=1e-4, abs=1e-6, nan_ok=True), k


def test_bad_autocast_is_a_value_error_naming_the_choices():
    with pytest.raises(ValueError, match=r"autocast must be one of \['none', 'bfloat16'\], got 'float16'; pass"):
        validate(a2c.ALGORITHM, a2c.A2CConfig(autocast="float16"))


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("module, cls, steps, best, seed", [
    (a2c, a2c.A2CConfig, 25_000, 150.0, 1),
    (ppo, ppo.PPOConfig, 20_480, 150.0, 0),
    (reinforce, reinforce.ReinforceConfig, 20_000, 150.0, 0),
])
def test_autocast_bfloat16_learns_cartpole(tmp_path, module, cls, steps, best, seed):
    """In bfloat16 (the update and the training agent), far above the random policy's 22: bare A2C's seeds 0-3
    reach 84, 209, 143 and 228 within 25k env steps (in float32 500, 219, 145, 133: one budget, noisy either way);
    PPO's and REINFORCE's seed 0 clear 150 too."""
    result = module.train(cls(**bare_run(tmp_path, autocast="bfloat16", max_env_steps=steps, seed=seed)))
    evals = [r["eval/return"] for r in result.history if "eval/return" in r and r["eval/launch_env_steps"] > 0]
    assert max(evals) >= best, evals


@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("module, cls, cfg", [
    (ppo, ppo.PPOConfig, dict(max_env_steps=512, n_envs=8, n_steps=16, n_epochs=2)),
    (reinforce, reinforce.ReinforceConfig, dict(max_env_steps=600, n_envs=4)),  # changing T: dynamic shapes
])
def test_compile_update_logs_what_eager_logs(tmp_path, module, cls, cfg):
    cfg = dict(cfg, eval_every=100, hidden_sizes=(16,), anneal_lr=False, log_every=1) if module is ppo else \
        dict(cfg, eval_every=100, hidden_sizes=(16,), log_every=1)
    eager = module.train(cls(**bare_run(tmp_path / "a", **cfg)))
    compiled = module.train(cls(**bare_run(tmp_path / "b", compile_update=True, time_limit=1200.0, **cfg)))
    assert len(eager.history) == len(compiled.history)
    compared = 0
    for x, y in zip(eager.history, compiled.history):
        for k in x:
            if k.startswith(("loss/", "grad_norm", "ppo/")):
                assert math.isclose(x[k], y[k], rel_tol=1e-3, abs_tol=1e-4), (k, x[k], y[k])
                compared += 1
    assert compared > 5


# ----------------------------------------------------------------------------------------------- CUDA
@CUDA
def test_cuda_shared_weights_and_overlap_on_a_side_stream(tmp_path):
    """The stream version: acquisition k + 1 on its own stream, ordered by events; results equal the CPU's
    semantics (same as a sequential batcher driven with the stale weights)."""
    model = build_actor_critic(SPEC, (8,)).to("cuda")
    reference = copy.deepcopy(model)
    with _batcher("cuda", zero_copy=True) as b, _batcher("cuda") as ref:
        pipe = Pipeline(b, WeightSync(b, model, "cuda", mode="copy"), overlap=True)
        assert pipe.stream is not None
        pipe.start()
        ref.update({k: v.cpu() for k, v in reference.state_dict().items()})
        ref.reset()
        for k in range(4):
            traj = pipe.next()
            ref.execute()
            expected, _ = ref.get()
            assert torch.equal(traj.trajectories["action/action"], expected.trajectories["action/action"])
            ref.update({key: v.cpu() for key, v in model.state_dict().items()})
            _perturb(model, k)
            pipe.updated()
        pipe.close()


@CUDA
@pytest.mark.timeout(600)
@pytest.mark.parametrize("autocast, compile_policy", [("none", False), ("bfloat16", True)])
@pytest.mark.parametrize("algo", ["a2c", "ppo"])
def test_cuda_fast_path_trains(tmp_path, algo, autocast, compile_policy):
    """Every fast-path flag at once; with --autocast and --compile-policy, the captured acquisition runs the
    compiled bfloat16 policy step and the compiled update its bfloat16 forward."""
    module, cls = {"a2c": (a2c, a2c.A2CConfig), "ppo": (ppo, ppo.PPOConfig)}[algo]
    cfg = dict(max_env_steps=4_096, n_envs=64, eval_every=4, hidden_sizes=(32,), learner_device="cuda",
               batcher_device="cuda", cuda_graph=True, compile_update=True, overlap=True, autocast=autocast,
               compile_policy=compile_policy)
    result = module.train(cls(**bare_run(tmp_path, **cfg)))
    losses = [v for r in result.history for k, v in r.items() if k.startswith("loss/")]
    assert losses and all(math.isfinite(x) for x in losses)


@CUDA
@pytest.mark.timeout(600)
def test_cuda_compiled_update_equals_eager_update():
    torch.manual_seed(0)
    eager_model = ActorCritic(4, 2, (16,)).cuda()
    compiled_model = copy.deepcopy(eager_model)

    def step(model, compile):
        return UpdateStep(_a2c_like_loss(model), make_adam(model, 1e-2, "cuda"), clip_groups(model), max_grad_norm=0.5,
                          device="cuda", compile=compile)

    eager, compiled = step(eager_model, False), step(compiled_model, True)
    for seed in range(3):
        batch = {key: t.cuda() for key, t in _batch(seed=seed).items()}
        a, b = eager(batch), compiled(batch)
        for k in a:
            torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5)
    for p, q in zip(eager_model.parameters(), compiled_model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)


@CUDA
def test_cuda_episodic_batcher_continues_with_the_running_rows():
    """An episodic batcher on the GPU (the evaluation's) whose later acquisitions start with only the envs still
    running: their agent_info (kept on the CPU) is written into those rows of the CUDA buffer and reaches the agent
    (greedy rows take the policy's mode at every step)."""
    model = build_actor_critic(SPEC, (8,))
    flags = torch.tensor([False, True] * 3)
    with RL_Batcher(3, create_policy_agent, {"spec": SPEC, "hidden_sizes": (8,), "device": "cuda"}, create_env,
                    {"name": "CartPole-v1", "n_envs": 6, "autoreset": False, "device": "cuda"}, 0, [3],
                    agent_info=DictTensor({"stochastic": torch.tensor([True])}), device="cuda") as b:
        b.update(model.state_dict())
        b.reset(agent_info=DictTensor({"stochastic": flags}))
        sizes = []
        while True:
            b.execute()
            traj, n_running = b.get()
            tt, stochastic = traj.trajectories.to("cpu"), traj.info["agent_info/stochastic"].cpu()
            sizes.append(stochastic.numel())
            valid = tt.mask().bool() & ~stochastic.unsqueeze(1)
            with torch.no_grad():
                mode = model.policy(tt["observation/frame"]).mode()
            assert torch.equal(tt["action/action"][valid], mode[valid])
            if n_running == 0:
                break
        assert sizes[0] == 6 and len(sizes) > 1 and sizes[-1] < 6  # later acquisitions ran on the running rows
