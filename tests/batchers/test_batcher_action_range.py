"""An action outside the env's action space reaches the batcher's caller as the env's ActionRangeError: at once on
the CPU (in process and from a worker process), and on an accelerator from the check the env records on the device,
read at the end of the acquisition (the recording fake of ``tests/fakes_accel.py`` drives that path on the CPU,
eager and with the captured acquisition)."""

from __future__ import annotations

import pytest
import torch

from rlstruct import DictTensor, RL_Agent, _accel
from rlstruct.batchers import RL_Batcher
from rlstruct.envs import CartPole
from rlstruct.errors import ActionRangeError
from tests.fakes_accel import RecordingAccelerator

pytestmark = pytest.mark.timeout(120)

N, T = 4, 3


class InfoActionAgent(RL_Agent):
    """Acts ``agent_info["action"]`` (one per env) at every step."""

    def __call__(self, state, observation, agent_info, history=None):
        action = agent_info["action"].to(observation.device(), non_blocking=True)
        return DictTensor._trusted({"action": action + 0}), state

    def update(self, state_dict):
        pass


def actions(*values: int) -> DictTensor:
    return DictTensor({"action": torch.tensor(values, dtype=torch.int64)})


GOOD, BAD = actions(0, 1, 0, 1), actions(0, 2, 0, 1)


def batcher(n_processes: int = 0, **kwargs) -> RL_Batcher:
    return RL_Batcher(T, InfoActionAgent, {}, CartPole, {"n_envs": N, "autoreset": True}, n_processes, [0],
                      agent_info=GOOD, **kwargs)


@pytest.mark.parametrize("n_processes", [0, 1], ids=["in-process", "worker-process"])
def test_an_out_of_range_action_is_an_action_range_error_from_get(n_processes):
    with batcher(n_processes) as b:
        b.reset()
        b.execute()
        b.get()
        b.execute(agent_info=BAD)
        worker = "worker 0: " if n_processes else ""
        with pytest.raises(ActionRangeError, match=rf"^{worker}action\['action'\] must be in Discrete\(2\), the "
                                                   r"integers in \[0, 1\], got 2 at env ids 1 \(1 of 4 rows\)"):
            b.get()


@pytest.mark.parametrize("cuda_graph", [False, True], ids=["eager", "captured"])
def test_on_an_accelerator_the_check_is_read_at_the_end_of_the_acquisition_naming_the_step(cuda_graph):
    fake = RecordingAccelerator()
    with _accel.installed("cpu", fake), batcher(cuda_graph=cuda_graph) as b:
        assert b._workers[0].acq.env.deferred_action_check() is not None
        b.reset()
        for _ in range(3):  # with cuda_graph: the warm-up, the capture, a replay
            b.execute()
            b.get()
        b.execute(agent_info=BAD)
        with pytest.raises(ActionRangeError, match=r"got 2 at env ids 1 \(1 of 4 rows\) at step 0, the first of 3 "
                                                   r"offending rows over 3 steps of acquisition 4; .*never clamped"):
            b.get()
    if cuda_graph:  # acquisitions 2 to 4 were replays: the check ran inside the captured loop
        assert fake.graphs[0].replays == 3
