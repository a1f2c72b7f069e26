"""Minari datasets (rlstruct.algos.datasets, rlstruct record): the episodes written are the batcher's, step by step,
read back with minari and as Trajectories."""

from __future__ import annotations

import errno
import json

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlstruct import RL_Agent, RL_Batcher
from rlstruct.algos import _recording, create_env, datasets
from rlstruct.algos._recording import DatasetWriter, RandomAgent
from rlstruct.errors import ConfigError, DiskSpaceError, SpaceError
from rlstruct.structures import DictTensor

minari = pytest.importorskip("minari", reason="needs the datasets extra: pip install 'rlstruct[datasets]'")
pytest.importorskip("h5py", reason="needs the datasets extra: pip install 'rlstruct[datasets]'")

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def datasets_path(tmp_path, monkeypatch):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    return tmp_path / "minari"


class ZeroAgent(RL_Agent):
    """Action 0 everywhere (importable: worker processes build it)."""

    def __call__(self, state, observation, agent_info, history=None):
        return DictTensor({"action": torch.zeros(observation.n_elems(), dtype=torch.int64)}), state


def reference_episodes(name, n_envs, n_timesteps, seed, wanted, acquisitions, env_args):
    """The first ``wanted`` episodes to start (then by env) of a random agent, cut from an in-process batcher's
    Trajectories by a plain loop over every env and step: ``{(env, k): episode}``, k the env's k-th episode."""
    args = {"name": name, "n_envs": n_envs, "autoreset": True, **env_args}
    probe = create_env(**{**args, "n_envs": 1}, seed=0)
    action_space = probe.action_space
    probe.close()
    with RL_Batcher(n_timesteps, RandomAgent, {"action_space": action_space}, create_env, args, 0, seed,
                    agent_seeds=seed) as batcher:
        batcher.reset()
        chunks = []
        for _ in range(acquisitions):
            batcher.execute()
            chunks.append(batcher.get()[0].trajectories)
    steps = {k: torch.cat([c[k] for c in chunks], 1).numpy() for k in chunks[0].keys()}
    found = []
    for b in range(n_envs):
        start, k = 0, 0
        for t in range(steps["_observation/done"].shape[1]):
            if steps["_observation/done"][b, t]:
                s = slice(start, t + 1)
                found.append(((start, b), (b, k), {
                    "observations": np.concatenate([steps["observation/frame"][b, s],
                                                    steps["_observation/frame"][b, t][None]]),
                    "actions": steps["action/action"][b, s], "rewards": steps["_observation/reward"][b, s],
                    "terminations": steps["_observation/terminated"][b, s],
                    "truncations": steps["_observation/truncated"][b, s]}))
                start, k = t + 1, k + 1
    found.sort(key=lambda f: f[0])
    assert len(found) >= wanted, "collect more acquisitions for the reference"
    return {key: episode for _, key, episode in found[:wanted]}


def check_round_trip(name, n_processes, n_envs, episodes, n_timesteps, acquisitions, dtype, recoverable=True,
                     **env_args):
    spec = datasets.record(f"test/{name.replace('/', '-').lower()}-v0", None, None, create_env,
                           {"name": name, "n_envs": n_envs, **env_args}, episodes=episodes, n_processes=n_processes,
                           seeds=7, agent_seeds=7, n_timesteps=n_timesteps)
    expected = reference_episodes(name, n_envs * max(n_processes, 1), n_timesteps, 7, episodes, acquisitions,
                                  env_args)
    dataset = minari.load_dataset(spec.dataset_id)
    assert dataset.total_episodes == spec.episodes == episodes and dataset.total_steps == spec.steps
    seen: dict[int, int] = {}
    for episode, env in zip(dataset.iterate_episodes(), spec.envs):
        k = seen[env] = seen.get(env, -1) + 1
        want = expected.pop((env, k))
        for key, value in want.items():
            got = getattr(episode, key)
            assert got.dtype == value.dtype and np.array_equal(got, value), (key, env, k)
        assert episode.observations.dtype == dtype
        assert bool(episode.terminations[-1] or episode.truncations[-1])
    assert not expected
    if recoverable:
        assert dataset.recover_environment().spec.id == name
    else:
        assert dataset.spec.env_spec is None
    return spec


def test_a_cartpole_recording_holds_the_batchers_episodes_step_by_step_across_windows():
    spec = check_round_trip("CartPole-v1", 0, 4, 10, 16, 12, np.float32)
    assert max(spec.lengths) > 16, "an episode spans several acquisitions"
    metadata = minari.load_dataset(spec.dataset_id).storage.metadata
    assert metadata["algorithm_name"] == "random" and metadata["rlstruct"]["episodes"] == 10
    assert metadata["ref_max_score"] == 475.0  # the package's score table has CartPole-v1


@pytest.mark.slow  # MinAtar's simulator compiles its kernels on first use
def test_a_minatar_recording_keeps_its_bool_frames():
    check_round_trip("MinAtar/Breakout-v1", 0, 3, 5, 32, 4, np.bool_)


@pytest.mark.slow  # ale-py's start
def test_an_atari_recording_keeps_its_uint8_frames_and_no_spec_of_other_frames():
    pytest.importorskip("ale_py", reason="needs ale-py: pip install 'rlstruct[atari]'")
    # gymnasium's ALE/Breakout-v5 gives RGB frames [210, 160, 3], the ale backend preprocessed ones [4, 84, 84].
    with pytest.warns(UserWarning, match=r"not the env gymnasium makes of that id \(its observations are "
                                         r"Box\(0, 255, \(210, 160, 3\), uint8\).*--backend gymnasium"):
        spec = check_round_trip("ALE/Breakout-v5", 0, 2, 3, 16, 3, np.uint8, recoverable=False, backend="ale",
                                max_episode_steps=20)
    assert max(spec.lengths) == 20, "the time limit cuts episodes across acquisitions"


@pytest.mark.slow
def test_worker_processes_record_the_episodes_of_one_process():
    check_round_trip("CartPole-v1", 2, 2, 6, 32, 8, np.float32)
    check_round_trip("MinAtar/Breakout-v1", 2, 2, 4, 32, 4, np.bool_)


def test_load_gives_the_dataset_back_as_trajectories():
    spec = datasets.record("test/cartpole-v0", None, None, create_env, {"name": "CartPole-v1", "n_envs": 3},
                           episodes=5, seeds=1, agent_seeds=1, n_timesteps=32)
    traj = datasets.load("test/cartpole-v0")
    tt = traj.trajectories
    assert tt.lengths.tolist() == spec.lengths and traj.info["episode_id"].tolist() == list(range(5))
    for row, episode in enumerate(minari.load_dataset("test/cartpole-v0").iterate_episodes()):
        n = len(episode)
        assert torch.equal(tt["observation/frame"][row, :n], torch.from_numpy(episode.observations[:-1]))
        assert torch.equal(tt["_observation/frame"][row, :n], torch.from_numpy(episode.observations[1:]))
        assert torch.equal(tt["action/action"][row, :n], torch.from_numpy(episode.actions))
        assert bool(tt["_observation/done"][row, n - 1]) and not bool(tt["_observation/done"][row, : n - 1].any())
    assert (tt["_observation/reward"] * tt.mask()).sum(1).tolist() == spec.returns
    assert datasets.load("test/cartpole-v0", episodes=[3]).trajectories.lengths.tolist() == [spec.lengths[3]]


def test_an_existing_dataset_id_is_refused_unless_overwritten():
    args = ("test/exists-v0", None, None, create_env, {"name": "CartPole-v1", "n_envs": 2})
    datasets.record(*args, episodes=2, n_timesteps=32)
    with pytest.raises(ConfigError, match=r"dataset_id 'test/exists-v0' exists already .*pass overwrite=True"):
        datasets.record(*args, episodes=3, n_timesteps=32)
    assert minari.load_dataset("test/exists-v0").total_episodes == 2
    datasets.record(*args, episodes=3, n_timesteps=32, overwrite=True)
    assert minari.load_dataset("test/exists-v0").total_episodes == 3


@pytest.mark.parametrize("where, written", [("episode", 0), ("metadata", 2)])
def test_a_full_disk_removes_the_partial_dataset(monkeypatch, datasets_path, where, written):
    from minari.dataset.minari_storage import MinariStorage

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    if where == "episode":
        monkeypatch.setattr(_recording, "_write_episode", full)
    else:
        monkeypatch.setattr(MinariStorage, "update_metadata", full)
    with pytest.raises(DiskSpaceError, match=rf"filled up after {written} episodes of dataset_id 'test/full-v0' "
                                             r"\(the partial dataset is removed\)"):
        datasets.record("test/full-v0", None, None, create_env, {"name": "CartPole-v1", "n_envs": 2}, episodes=2)
    assert not list((datasets_path / "test").iterdir())


def test_a_recording_the_disk_cannot_hold_is_refused_before_it_starts(monkeypatch):
    monkeypatch.setattr(datasets, "free_bytes", lambda path: 1000)
    with pytest.raises(DiskSpaceError, match=r"1000 episodes of up to 500 steps of CartPole-v1 may take .* GB.*"
                                             r"check_disk=False"):
        datasets.record("test/big-v0", None, None, create_env, {"name": "CartPole-v1", "n_envs": 2}, episodes=1000)


def test_an_env_gymnasium_cannot_recover_is_recorded_without_its_spec_warned_once():
    with pytest.warns(UserWarning, match="no gymnasium spec to keep") as caught:
        datasets.record("test/nospec-v0", None, None, create_env, {"name": "CartPole-v1", "n_envs": 2}, episodes=2,
                        env_id="NoSuchEnv-v0", n_timesteps=64)
    assert len([w for w in caught if "gymnasium spec" in str(w.message)]) == 1
    assert minari.load_dataset("test/nospec-v0").spec.env_spec is None


def test_epsilon_replaces_the_agents_actions_with_random_ones():
    args = {"name": "CartPole-v1", "n_envs": 2}
    calm = datasets.record("test/zero-v0", ZeroAgent, {}, create_env, args, episodes=2, n_timesteps=32)
    noisy = datasets.record("test/noisy-v0", ZeroAgent, {}, create_env, args, episodes=2, epsilon=1.0,
                            n_timesteps=32)
    actions = [np.concatenate([e.actions for e in minari.load_dataset(s.dataset_id).iterate_episodes()])
               for s in (calm, noisy)]
    assert not actions[0].any() and 0.3 < actions[1].mean() < 0.7


class DictObservationEnv:
    """What record reads of an env before it starts, with Dict observations (importable: record probes it)."""

    observation_space = gym.spaces.Dict({"position": gym.spaces.Box(0, 1, (2,))})
    action_space = gym.spaces.Box(-np.inf, np.inf, (1,))

    def close(self):
        pass


class UnboundedActionEnv(DictObservationEnv):
    observation_space = gym.spaces.Box(0, 1, (2,))


@pytest.mark.parametrize("env, epsilon, match", [
    (DictObservationEnv, 0.0, r"record writes Box observations, got Dict\(.*flatten the observation"),
    (UnboundedActionEnv, 0.5, r"random actions need a Discrete or a bounded Box action space, got Box\(-inf, inf"),
])
def test_spaces_record_cannot_write_are_refused_before_it_starts(env, epsilon, match):
    with pytest.raises(SpaceError, match=match):
        datasets.record("test/space-v0", ZeroAgent, {}, lambda **kwargs: env(), {"name": "x"}, episodes=1,
                        epsilon=epsilon)


def test_load_refuses_a_dataset_it_cannot_find_or_no_episodes():
    with pytest.raises(FileNotFoundError, match=r"dataset_id 'test/absent-v0' is not at .*set MINARI_DATASETS_PATH"):
        datasets.load("test/absent-v0")
    datasets.record("test/one-v0", None, None, create_env, {"name": "CartPole-v1", "n_envs": 1}, episodes=1)
    with pytest.raises(ValueError, match=r"episodes must select at least one episode of 'test/one-v0', got \[\]"):
        datasets.load("test/one-v0", episodes=[])


@pytest.mark.parametrize("kwargs, match", [
    ({"episodes": 0}, r"episodes must be an int >= 1, got \[0\]"),
    ({"episodes": 2, "epsilon": 1.5}, r"epsilon must lie in \[0, 1\], got 1.5"),
])
def test_bad_settings_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        datasets.record("test/bad-v0", None, None, create_env, {"name": "CartPole-v1", "n_envs": 2}, **kwargs)
    with pytest.raises(ValueError, match=r"dataset_id must be Minari's NAMESPACE/NAME-vVERSION .*got 'noversion'"):
        datasets.record("noversion", None, None, create_env, {"name": "CartPole-v1", "n_envs": 2}, episodes=1)


def evaluated_returns(capsys, run, *flags):
    """The returns ``rlstruct eval RUN --returns FLAGS`` reports, in env order."""
    from rlstruct.algos._train.cli import main

    capsys.readouterr()
    assert main(["eval", str(run), "--returns", *flags]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])["returns"]


def test_a_run_records_the_episodes_rlstruct_eval_plays(tiny_cartpole_run, capsys):
    from rlstruct.algos._train.cli import main

    spec = datasets.record_run("test/run-v0", tiny_cartpole_run, episodes=5, seed=3, command="rlstruct record x")
    evaluated = evaluated_returns(capsys, tiny_cartpole_run, "--episodes", "5", "--seed", "3")
    order = np.argsort(spec.envs)
    assert [spec.returns[i] for i in order] == evaluated
    # CartPole pays 1 a step: the returns are the lengths.
    assert [spec.lengths[i] for i in order] == [int(r) for r in evaluated] and len(set(evaluated)) > 1
    # The command, with eval's defaults on both sides (seed, policy), writes the episodes eval reports.
    assert main(["record", str(tiny_cartpole_run), "--episodes", "4", "--dataset-id", "test/cli-run-v0"]) == 0
    written = sorted(float(e.rewards.sum()) for e in minari.load_dataset("test/cli-run-v0").iterate_episodes())
    assert written == sorted(evaluated_returns(capsys, tiny_cartpole_run, "--episodes", "4"))
    metadata = minari.load_dataset("test/run-v0").storage.metadata
    assert metadata["algorithm_name"] == "a2c" and metadata["rlstruct"]["command"] == "rlstruct record x"
    assert len(metadata["rlstruct"]["checkpoints"][0]["sha256"]) == 64
    mixed = datasets.record_run("test/mixed-v0", [tiny_cartpole_run, tiny_cartpole_run / "checkpoint.pt"],
                                episodes=5, epsilon=0.5)
    assert mixed.sources.count(0) == 3 and mixed.sources.count(1) == 2


def in_env_order(spec, source=0):
    """A recording's returns of one source, in env order (eval's)."""
    rows = [i for i in np.argsort(spec.envs, kind="stable") if spec.sources[i] == source]
    return [spec.returns[i] for i in rows]


def test_a_sampling_policy_records_the_episodes_rlstruct_eval_samples(tiny_cartpole_run, capsys):
    from rlstruct.algos._train.cli import main

    spec = datasets.record_run("test/sample-v0", tiny_cartpole_run, episodes=5, seed=3, policy="sample")
    sampled = evaluated_returns(capsys, tiny_cartpole_run, "--episodes", "5", "--seed", "3", "--policy", "sample")
    greedy = evaluated_returns(capsys, tiny_cartpole_run, "--episodes", "5", "--seed", "3", "--policy", "greedy")
    assert sampled != greedy, "the draws change the episodes"
    assert in_env_order(spec) == sampled and [spec.lengths[i] for i in np.argsort(spec.envs)] == sampled
    assert main(["record", str(tiny_cartpole_run), "--episodes", "4", "--policy", "sample", "--seed", "5",
                 "--dataset-id", "test/cli-sample-v0"]) == 0
    written = sorted(float(e.rewards.sum()) for e in minari.load_dataset("test/cli-sample-v0").iterate_episodes())
    assert written == sorted(evaluated_returns(capsys, tiny_cartpole_run, "--episodes", "4", "--seed", "5",
                                               "--policy", "sample"))
    # --checkpoints: checkpoint i plays eval's episodes of seed + i, its share of them.
    mixed = datasets.record_run("test/mixed-sample-v0", [tiny_cartpole_run, tiny_cartpole_run / "checkpoint.pt"],
                                episodes=5, seed=3, policy="sample")
    # Eval's envs are its episodes: the draws of 3 envs are not those of 5.
    assert in_env_order(mixed, 0) == evaluated_returns(capsys, tiny_cartpole_run, "--episodes", "3", "--seed", "3",
                                                       "--policy", "sample")
    assert in_env_order(mixed, 1) == evaluated_returns(capsys, tiny_cartpole_run, "--episodes", "2", "--seed", "4",
                                                       "--policy", "sample")


def test_an_episodic_batchers_shrinking_rows_are_cut_at_their_envs():
    from rlstruct.algos._recording import EpisodeCutter
    from rlstruct.structures import TemporalDictTensor, Trajectories

    ends, T = [2, 6, 9], 4  # env b's one episode ends at its step ends[b], over three acquisitions of T steps

    def acquisition(k):
        envs = [b for b in range(3) if ends[b] >= k * T]
        t = k * T + torch.arange(T)
        lengths = torch.tensor([min(T, ends[b] - k * T + 1) for b in envs])
        frame = torch.stack([b * 100.0 + t for b in envs]).unsqueeze(-1)
        done = torch.stack([t == ends[b] for b in envs])
        steps = {"observation/frame": frame, "_observation/frame": frame + 1, "action/action": frame.long()[..., 0],
                 "_observation/reward": frame[..., 0], "_observation/terminated": done,
                 "_observation/truncated": torch.zeros_like(done), "_observation/done": done}
        return Trajectories(DictTensor({}), TemporalDictTensor(steps, lengths))

    cutter = EpisodeCutter(3, 3, episodic=True)
    got = [cutter.add(acquisition(k)) for k in range(3)]
    assert [[e["env"] for e in ended] for ended in got] == [[0], [1], [2]] and cutter.finished
    for (episode,) in got:
        b = episode["env"]
        assert episode["observation"][:, 0].tolist() == [b * 100.0 + t for t in range(ends[b] + 2)]
        assert episode["action"].tolist() == [b * 100 + t for t in range(ends[b] + 1)]
        assert episode["terminated"].tolist() == [False] * ends[b] + [True]


@pytest.mark.slow  # worker processes
@pytest.mark.parametrize("policy", ["greedy", "sample"])
def test_a_run_recorded_by_workers_holds_the_episodes_rlstruct_eval_plays_with_as_many(tiny_cartpole_run, capsys,
                                                                                        policy):
    spec = datasets.record_run(f"test/workers-{policy}-v0", tiny_cartpole_run, episodes=5, seed=4, n_processes=2,
                               policy=policy)
    evaluated = evaluated_returns(capsys, tiny_cartpole_run, "--episodes", "5", "--seed", "4", "--n-processes", "2",
                                  "--policy", policy)
    order = np.argsort(spec.envs)
    assert [spec.returns[i] for i in order] == evaluated and [spec.lengths[i] for i in order] == evaluated


def test_the_command_records_a_random_policy_and_refuses_bad_input_in_one_line(capsys):
    from rlstruct.algos._train.cli import main

    assert main(["record", "--env", "CartPole-v1", "--episodes", "3", "--dataset-id", "test/cli-v0"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["episodes"] == 3 and minari.load_dataset("test/cli-v0").total_episodes == 3
    assert main(["record", "--env", "CartPole-v1", "--episodes", "3", "--dataset-id", "test/cli-v0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "exists already" in err and "--overwrite" in err
    assert main(["record", "--episodes", "3", "--dataset-id", "test/cli-v1"]) == 2
    assert "takes one of RUN, --checkpoints or --env, got none" in capsys.readouterr().err
    # An id rlstruct does not simulate is stepped on gymnasium, whose Taxi has Discrete observations.
    assert main(["record", "--env", "Taxi-v4", "--episodes", "1", "--dataset-id", "test/cli-taxi-v0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "record writes Box observations, got Discrete(500)" in err


# Pixels: observations past _COMPACT_BYTES, stored contiguous.
@pytest.mark.parametrize("shape, dtype", [((4,), np.float32), ((10, 10, 4), np.bool_), ((84, 84), np.uint8)])
def test_the_writer_writes_what_minaris_update_episodes_writes(shape, dtype):
    from minari.data_collector import EpisodeBuffer
    from minari.dataset.minari_storage import MinariStorage

    rng = np.random.default_rng(0)
    observation_space = gym.spaces.Box(0, 1, shape, dtype)
    action_space = gym.spaces.Discrete(3)
    episodes = []
    for length in (1, 7, 30):
        episodes.append({"observation": rng.integers(0, 2, (length + 1, *shape)).astype(dtype),
                         "action": rng.integers(0, 3, length), "reward": rng.random(length).astype(np.float32),
                         "terminated": np.arange(length) == length - 1, "truncated": np.zeros(length, bool)})
    writer = DatasetWriter("test/fast-v0", observation_space, action_space, None)
    writer.write(episodes[:2])
    writer.write([])
    writer.write(episodes[2:])
    writer.finish({"algorithm_name": "test"})
    reference = MinariStorage.new(writer.path.parent / "reference", observation_space=observation_space,
                                  action_space=action_space, jpeg_encoding=False)
    reference.update_episodes([EpisodeBuffer(observations=e["observation"], actions=e["action"],
                                             rewards=e["reward"], terminations=e["terminated"],
                                             truncations=e["truncated"]) for e in episodes])
    written = minari.load_dataset("test/fast-v0").storage
    assert (written.total_episodes, written.total_steps) == (reference.total_episodes, reference.total_steps) == (3, 38)
    assert list(written.get_episode_metadata(range(3))) == list(reference.get_episode_metadata(range(3)))
    for got, want in zip(written.get_episodes(range(3)), reference.get_episodes(range(3))):
        assert got.keys() == want.keys()
        for key in ("observations", "actions", "rewards", "terminations", "truncations"):
            assert got[key].dtype == want[key].dtype and np.array_equal(got[key], want[key]), key
    import h5py

    with h5py.File(writer.path / "data" / "main_data.hdf5", "r") as f:
        observations = f["episode_2/observations"]
        layout = observations.id.get_create_plist().get_layout()
        big = observations.nbytes > _recording._COMPACT_BYTES
        assert layout == (h5py.h5d.CONTIGUOUS if big else h5py.h5d.COMPACT) and big == (shape == (84, 84))
    # Minari appends to it as to its own: the next episode's id follows.
    written.update_episodes([EpisodeBuffer(observations=episodes[0]["observation"], actions=episodes[0]["action"],
                                           rewards=episodes[0]["reward"], terminations=episodes[0]["terminated"],
                                           truncations=episodes[0]["truncated"])])
    assert written.total_episodes == 4 and next(iter(written.get_episodes([3])))["id"] == 3
