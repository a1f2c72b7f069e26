"""A saved run's deterministic policy as a file that runs without rlstruct (``rlstruct export``,
:meth:`~rlstruct.algos.Policy.export`): ONNX for onnxruntime, or TorchScript for ``torch.jit.load``.

The file maps ``observation`` (a batch ``[N, *obs]`` of the env's raw observations, in the env's dtype) to
``action`` (``int64 [N]``, or ``float32 [N, D]`` within the bounds); the run's observation normalisation is inside.
A recurrent policy also takes its memory ``h``, ``c`` (``float32 [N, core]``, zeros at an episode's start) and
returns the next one: ``(action, h, c)``. An ONNX file is self-contained: its weights are inside it, not in a
``.data`` file beside it (a policy is far below ONNX's 2 GB limit for that).
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from rlstruct.algos._env_spec import EnvSpec
from rlstruct.algos._train.run_folder import check_output
from rlstruct.algos.policies import NetworkAgent
from rlstruct.errors import MissingDependencyError

__all__ = ["EXPORT_FORMATS", "DeterministicPolicy", "export_policy", "export_format"]

#: ``--format``'s values -> the file suffix each is written with by default
EXPORT_FORMATS = {"onnx": ".onnx", "torchscript": ".pt"}


class DeterministicPolicy(nn.Module):
    """The greedy policy of an agent of ``rlstruct.algos`` as a module of tensors alone: its forward is the agent's
    :meth:`~rlstruct.algos.policies.NetworkAgent.deterministic` over the agent's network (registered here, so that
    its weights and normalisation statistics are exported with it).

    Args:
        agent: the agent (a :class:`~rlstruct.algos.Policy`'s ``agent``).
    """

    def __init__(self, agent: NetworkAgent):
        super().__init__()
        self.model = agent.model
        self._act = agent.deterministic

    def forward(self, observation: torch.Tensor, *state: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """``action``, or ``(action, h, c)`` for a recurrent policy given ``(h, c)``."""
        out = self._act(observation, *state)
        return out[0] if len(out) == 1 else out


def export_format(output: str | os.PathLike, format: str | None) -> str:
    """The format of an export: ``format``, or the one ``output``'s suffix names (``.onnx``; anything else is
    TorchScript).

    Raises:
        ValueError: ``format`` is not one of :data:`EXPORT_FORMATS`.

    >>> export_format("policy.onnx", None), export_format("policy.pt", None)
    ('onnx', 'torchscript')
    """
    if format is None:
        return "onnx" if Path(output).suffix.lower() == ".onnx" else "torchscript"
    if format not in EXPORT_FORMATS:
        raise ValueError(f"format must be one of {list(EXPORT_FORMATS)}, got {format!r}")
    return format


def export_policy(agent: NetworkAgent, spec: EnvSpec, output: str | os.PathLike, *, format: str | None = None,
                  recurrent: bool = False) -> Path:
    """Writes ``agent``'s deterministic policy (:class:`DeterministicPolicy`) to ``output``.

    Args:
        agent: a CPU agent holding the run's weights (a loaded :class:`~rlstruct.algos.Policy`'s ``agent``).
        spec: the env's description (the observation's shape and dtype).
        output: the file to write (its folder is created), outside every run folder (:func:`~.run_folder.check_output`).
        format: ``"onnx"`` or ``"torchscript"`` (``None``: by ``output``'s suffix, :func:`export_format`).
        recurrent: whether the agent's memory ``(h, c)`` goes in and out.

    Returns:
        ``output``.

    Raises:
        ValueError: an unknown ``format``.
        ConfigError: ``output`` is in a run's folder (the run's checkpoint, its rows...).
        MissingDependencyError: ONNX without the ``export`` extra (onnx, onnxscript).
    """
    check_output(output, argument="output")
    format = export_format(output, format)
    if format == "onnx":
        import importlib.util

        missing = [m for m in ("onnx", "onnxscript") if importlib.util.find_spec(m) is None]
        if missing:
            raise MissingDependencyError(f"format='onnx' needs {' and '.join(missing)}, which torch's ONNX exporter "
                                         "imports; pip install 'rlstruct[export]'")
    module = DeterministicPolicy(agent).eval()
    n = 2  # any batch: the batch dimension of the file is dynamic
    inputs: tuple[torch.Tensor, ...] = (torch.zeros(n, *spec.obs_shape, dtype=getattr(torch, spec.obs_dtype)),)
    names = ["observation"]
    if recurrent:
        inputs += agent.model.initial_state(n, "cpu")
        names += ["h", "c"]
    path = Path(output)
    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        if format == "torchscript":
            torch.jit.trace(module, inputs, check_trace=False).save(str(path))
        else:
            batch = torch.export.Dim("batch", min=1)
            outputs = ["action", "h_next", "c_next"] if recurrent else ["action"]
            # torch.export reads the shapes by the forward's signature: the observation, then *state as one tuple.
            dynamic = ({0: batch}, ({0: batch}, {0: batch})) if recurrent else ({0: batch},)
            with _quiet_exporter():
                torch.onnx.export(module, inputs, str(path), input_names=names, output_names=outputs,
                                  dynamic_shapes=dynamic, dynamo=True, external_data=False, verbose=False)
    return path


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    """Keeps torch's ONNX exporter's notes about itself off the console: the operators of torchvision it skips
    (a policy uses none) and the deprecations inside torch's own tree handling. Errors still raise."""
    exporter_log = logging.getLogger("torch.onnx")
    level = exporter_log.level
    exporter_log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            yield
    finally:
        exporter_log.setLevel(level)
