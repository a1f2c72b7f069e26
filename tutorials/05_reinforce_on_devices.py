"""Tutorial 5: REINFORCE with the learner, the training batcher and the evaluation on different devices.

rlstructures' ``reinforce_device`` example put the loss on ``cuda:0`` and the batcher on ``cuda:1``.
Here the library's REINFORCE (``rlstruct.algos.reinforce``) does the same from three config fields:

* ``learner_device``: the model, the loss and the optimizer (here ``cuda:0``);
* ``batcher_device``: the training batcher's envs, agent and buffer (here ``cuda:1``, one worker
  process stepping torch simulators on that GPU);
* ``evaluation_device``: the evaluation batcher (here the CPU, in its own process, so that it runs
  while training goes on).

Data crosses devices at three boundaries only, each one copy:

1. the batcher writes trajectories into its buffer on ``batcher_device`` and ``get()`` returns them
   there; the learner calls ``trajectories.to(learner_device)`` (free when the devices are the same);
2. the learner sends its weights as a CPU state dict, ``batcher.update(cpu_state_dict(model))``;
3. each worker loads them with ``map_location`` onto its own device (copying straight to ``cuda:k``
   could allocate on ``cuda:0``).

And one rule: no CUDA call in this process before the workers are spawned, unless a GPU is actually
asked for. ``train`` builds both batchers first and moves the model to the learner device after.

Without GPUs the tutorial says so and runs everything on the CPU, still in separate processes.

Run it with ``python tutorials/05_reinforce_on_devices.py``. Size knob: the environment variable
``RLSTRUCT_TUTORIAL_SCALE`` (float, default 1.0) scales the training budget (env steps); the tests
run every tutorial with a small value.
"""

from __future__ import annotations

import os
import tempfile

import torch

from rlstruct.algos.reinforce import ReinforceConfig, train

SCALE = float(os.environ.get("RLSTRUCT_TUTORIAL_SCALE", "1.0"))


def pick_devices() -> tuple[dict[str, str], int]:
    """The devices this tutorial asks for, or the CPU with a note when they are missing."""
    # A CPU build of torch cannot see a GPU: then not even the device count is asked for. With a CUDA
    # build, counting devices asks the driver but creates no CUDA context in this process.
    n_gpus = torch.cuda.device_count() if torch.backends.cuda.is_built() else 0
    if n_gpus >= 2:
        return {"learner_device": "cuda:0", "batcher_device": "cuda:1", "evaluation_device": "cpu"}, n_gpus
    if n_gpus == 1:
        print("note: one GPU here: the training batcher shares cuda:0 with the learner (cuda:1 is missing)")
        return {"learner_device": "cuda:0", "batcher_device": "cuda:0", "evaluation_device": "cpu"}, n_gpus
    print("note: no GPU here: the learner and both batchers run on the CPU, each batcher in its own process, "
          "as they would on cuda:0 / cuda:1 / cpu")
    return {"learner_device": "cpu", "batcher_device": "cpu", "evaluation_device": "cpu"}, n_gpus


def main() -> None:
    devices, n_gpus = pick_devices()
    print("== 1. Devices:", ", ".join(f"{k}={v}" for k, v in devices.items()))

    print("== 2. REINFORCE, configured in code")
    budget = max(2_000, int(50_000 * SCALE))
    with tempfile.TemporaryDirectory() as logdir:
        config = ReinforceConfig(
            env="CartPole-v1",
            backend="torch",  # torch simulators: they step on whatever device the batcher is on
            **devices,
            n_envs=16,  # episodes per iteration
            n_processes=1,  # the training batcher is one worker process on batcher_device
            n_evaluation_envs=16,
            n_evaluation_processes=1,  # evaluation in its own process: training does not pause for it
            max_env_steps=budget,
            time_limit=600.0,  # the env-step budget ends the run; this is only a safety net
            # Wrap every agent in RL_Agent_CheckDevice and check the learner's model and inputs: a tensor
            # on the wrong side of a boundary stops the run with a DeviceMismatchError naming it.
            check_devices=True,
            seed=0,
            logdir=logdir,
            progress=False,
            tensorboard=False,
        )
        result = train(config)

        evaluations = [(int(row["env_steps"]), row["eval/return"]) for row in result.history if "eval/return" in row]
        print("   greedy evaluation return along training:")
        for steps, ret in evaluations:
            print(f"   {steps:>8} env steps: {ret:7.1f}")
        print(f"   final: {result.eval_return:.1f} after {result.env_steps} env steps in {result.wall_time_s:.1f} s")
        assert result.env_steps >= budget
        assert len(evaluations) >= 2  # the initial policy, and the final one at least
        # A uniformly random policy balances the pole for about 22 steps, an untrained greedy one often for
        # about 10. Already 5k steps of REINFORCE (the tests' scale) take the greedy policy well past
        # random (seeds 0-2 reach 100-140); 50k steps take it to a few hundred (500 is the time limit).
        assert result.eval_return >= 50, result.eval_return

        print("== 3. The checkpoint holds CPU tensors, whatever the learner device was")
        # map_location only matters for tensors saved on another device; there are none.
        checkpoint = torch.load(result.checkpoint, map_location="cpu", weights_only=True)
        assert all(v.device.type == "cpu" for v in checkpoint["model"].values())
        assert checkpoint["config"]["learner_device"] == devices["learner_device"]
        print(f"   {len(checkpoint['model'])} tensors, algo={checkpoint['algo']}, env_spec={checkpoint['env_spec']}")

    if n_gpus == 0:
        # Nothing in this run asked for a GPU, so nothing touched CUDA.
        assert not torch.cuda.is_initialized()
    print("tutorial 05: all claims hold")


if __name__ == "__main__":
    main()
