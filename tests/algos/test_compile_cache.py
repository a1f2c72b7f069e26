"""The compile cache: a second launch of a run with a compiled update loads its graphs from rlstruct's cache folder
(inductor's and AOTAutograd's on-disk caches) instead of compiling them again, and each launch's summary says what it
spent compiling and how often the caches answered. Its cold launch is also the suite's inductor proof of A2C's
compiled update: what the eager update logs and trains."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from rlstruct.algos import A2CConfig
from rlstruct.algos._train import entry
from rlstruct.algos._train.compile_cache import (
    COMPILE_CACHE_ENV,
    INDUCTOR_CACHE_ENV,
    JAX_CACHE_ENV,
    CompileMeter,
    compile_cache,
    compile_cache_dir,
    jax_compile_cache,
)
from rlstruct.errors import ConfigError
from tests.helpers import ForkedCommand, wall_limit

# Four updates, each logged (--log-every 1).
FLAGS = ["--env", "CartPole-v1", "--seed", "0", "--n-envs", "4", "--n-steps", "8", "--max-env-steps", "128",
         "--eval-every", "100", "--n-evaluation-envs", "2", "--evaluation-max-steps", "20", "--hidden-sizes", "16",
         "--log-every", "1", "--no-progress", "--no-tensorboard", "--preset", "none"]
#: the columns of progress.csv an update writes: its losses, gradient norms and the training episodes' returns
UPDATE_COLUMNS = ("loss/", "grad_norm/", "train/")


def _launch(logdir: Path, cache: Path, *more: str) -> dict:
    """``rlstruct train a2c FLAGS MORE`` forked from this process (:class:`~tests.helpers.ForkedCommand`: a fresh
    interpreter's imports of torch and its compiler are not what this file checks), with nothing compiled in memory:
    dynamo's and inductor's in-memory caches are emptied in the child first, so only the on-disk cache in ``cache``
    can spare a compile; its summary."""

    def from_a_clean_compiler() -> None:
        import torch._dynamo
        from torch._inductor.utils import clear_caches

        os.environ.pop(INDUCTOR_CACHE_ENV, None)  # inductor sets it in a process that compiled without it
        os.environ[COMPILE_CACHE_ENV] = str(cache)
        torch._dynamo.reset()
        clear_caches()

    run = ForkedCommand(["train", "a2c", *FLAGS, *more, "--logdir", str(logdir)],
                        logdir.parent / f"{logdir.name}-command", seam=from_a_clean_compiler)
    try:
        assert run.wait(600) == 0, run.stderr
    finally:
        run.kill()
    return json.loads((logdir / "summary.json").read_text())


def _updates(logdir: Path) -> list[dict[str, float]]:
    """The rows of the run's progress.csv that an update wrote, each its :data:`UPDATE_COLUMNS`."""
    with open(logdir / "progress.csv", newline="") as f:
        return [{k: float(v) for k, v in row.items() if k.startswith(UPDATE_COLUMNS)}
                for row in csv.DictReader(f) if row["loss/policy"]]


def _weights(logdir: Path) -> dict[str, torch.Tensor]:
    return torch.load(logdir / "checkpoint.pt", weights_only=True)["model"]


@pytest.mark.compiles
@pytest.mark.long(reason="three forked launches, the second compiling A2C's update cold with inductor into a fresh "
                         "cache folder (the test about 30 CPU s of the 2-core machine's alone, 19 in a process that "
                         "imported the compiler already, at the test session's -O0 builds: tests/conftest.py's "
                         "TEST_INDUCTOR_ENV)")
@pytest.mark.timeout(900)
def test_a_second_launch_loads_the_compiled_update_from_the_cache(tmp_path):
    """The cold launch is also the suite's inductor proof of :class:`~rlstruct.algos._train.update.UpdateStep` (C++
    code generation, its costliest compile; the step-level comparisons of tests/algos/test_fast_path.py compile with
    ``aot_eager``): the same losses, gradient norms and episodes as the eager update at every update, and the same
    final weights within float tolerance; the cached launch gives the cold one's, bit for bit."""
    import torch._dynamo  # noqa: F401  (imported once here for the launches, as each would)
    import torch._inductor.compile_fx  # noqa: F401

    cache = tmp_path / "cache"
    _launch(tmp_path / "eager", cache)
    first = _launch(tmp_path / "first", cache, "--compile-update")["compile"]
    second = _launch(tmp_path / "second", cache, "--compile-update")["compile"]
    eager, cold, warm = (_updates(tmp_path / name) for name in ("eager", "first", "second"))
    assert len(eager) == len(cold) == len(warm) == 4 and len(eager[0]) == 7, eager
    for x, y, z in zip(eager, cold, warm):
        for k in x:
            assert (math.isnan(x[k]) and math.isnan(y[k])) or math.isclose(x[k], y[k], rel_tol=1e-3, abs_tol=1e-5), \
                (k, x[k], y[k])
            assert y[k] == z[k] or (math.isnan(y[k]) and math.isnan(z[k])), (k, y[k], z[k])
    weights = [_weights(tmp_path / name) for name in ("eager", "first", "second")]
    assert weights[0].keys() == weights[1].keys() == weights[2].keys() and weights[0]
    for k, p in weights[0].items():
        torch.testing.assert_close(weights[1][k], p, rtol=1e-4, atol=1e-5, msg=k)
        assert torch.equal(weights[2][k], weights[1][k]), k
    # The first compiles the update's forward and backward (AOTAutograd's joint graph, inductor's two kernels' files)
    # and writes them to the cache; the second finds every one of them there and generates nothing.
    # One graph (the update's forward and loss at the run's one batch shape), compiled once: no shape recompiled.
    assert first["graphs"] == second["graphs"] == 1, (first, second)
    assert first["fx_graph_cache_misses"] == 2 and first["fx_graph_cache_hits"] == 0, first  # forward, backward
    assert first["autograd_cache_misses"] > 0 and first["autograd_cache_hits"] == 0, first
    assert second["fx_graph_cache_hits"] == first["fx_graph_cache_misses"], (first, second)
    assert second["autograd_cache_hits"] == first["autograd_cache_misses"], (first, second)
    assert second["fx_graph_cache_misses"] == 0 and second["autograd_cache_misses"] == 0, second
    assert {"fxgraph", "aotautograd"} <= {p.name for p in cache.iterdir()}
    # Dynamo still traces the function: what the cache saves is the code generation and the C++ build.
    assert 0 < second["seconds"] < first["seconds"] / 3, (first, second)


def test_the_cache_folder_is_the_users_own_and_the_run_leaves_the_environment_as_it_found_it(tmp_path, monkeypatch):
    monkeypatch.delenv(INDUCTOR_CACHE_ENV, raising=False)
    monkeypatch.delenv(COMPILE_CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert compile_cache_dir() == tmp_path / "xdg" / "rlstruct" / "compile"
    monkeypatch.setenv(COMPILE_CACHE_ENV, str(tmp_path / "mine"))
    with compile_cache() as folder:
        assert folder == tmp_path / "mine" and os.environ[INDUCTOR_CACHE_ENV] == str(folder)
    assert INDUCTOR_CACHE_ENV not in os.environ
    monkeypatch.setenv(COMPILE_CACHE_ENV, "off")
    with compile_cache() as folder:
        assert folder is None and INDUCTOR_CACHE_ENV not in os.environ
    monkeypatch.setenv(COMPILE_CACHE_ENV, str(tmp_path / "mine"))
    monkeypatch.setenv(INDUCTOR_CACHE_ENV, str(tmp_path / "theirs"))  # the user's choice wins
    with compile_cache() as folder:
        assert folder == tmp_path / "theirs" and os.environ[INDUCTOR_CACHE_ENV] == str(tmp_path / "theirs")


def test_jaxs_cache_goes_into_the_compile_caches_jax_folder_unless_the_user_chose_one(tmp_path, monkeypatch):
    """JAX's persistent compilation cache: the compile cache's ``jax`` folder, for this process (a JAX already
    imported is told) and the processes it starts; a folder the user gave JAX, by its variable or its config, wins,
    and the compile cache ``off`` leaves JAX's default (no cache)."""
    updates = []
    fake = types.SimpleNamespace(config=types.SimpleNamespace(jax_compilation_cache_dir=None,
                                                              update=lambda *a: updates.append(a)))
    monkeypatch.setitem(sys.modules, "jax", fake)  # the worker's JAX, if it has one, is left alone
    monkeypatch.delenv(JAX_CACHE_ENV, raising=False)
    monkeypatch.setenv(COMPILE_CACHE_ENV, str(tmp_path / "mine"))
    assert jax_compile_cache() == tmp_path / "mine" / "jax"
    assert os.environ[JAX_CACHE_ENV] == str(tmp_path / "mine" / "jax")
    assert updates == [("jax_compilation_cache_dir", str(tmp_path / "mine" / "jax"))]
    monkeypatch.setenv(JAX_CACHE_ENV, str(tmp_path / "theirs"))  # the user's variable
    assert jax_compile_cache() == tmp_path / "theirs" and len(updates) == 1
    monkeypatch.delenv(JAX_CACHE_ENV)
    fake.config.jax_compilation_cache_dir = str(tmp_path / "configured")  # the user's jax.config.update
    assert jax_compile_cache() == tmp_path / "configured" and len(updates) == 1 and JAX_CACHE_ENV not in os.environ
    fake.config.jax_compilation_cache_dir = None
    monkeypatch.setenv(COMPILE_CACHE_ENV, "off")
    assert jax_compile_cache() is None and len(updates) == 1 and JAX_CACHE_ENV not in os.environ


@pytest.mark.slow  # a fresh interpreter, which imports torch and JAX: 5-6 CPU s
@pytest.mark.timeout(300)
def test_a_run_on_a_jax_env_keeps_its_compiled_programs_in_the_compile_cache(tmp_path):
    """A run on a gymnax env, in a fresh interpreter with no JAX cache of the user's: the programs XLA compiled for
    it, its env's description's first among them, are in the compile cache's ``jax`` folder, where a second launch
    finds them (every program kept here: JAX's threshold of a second's compile lowered to 0)."""
    pytest.importorskip("gymnax", reason="the jax extra: pip install 'rlstruct[jax]'")
    env = {k: v for k, v in os.environ.items() if k != JAX_CACHE_ENV}
    env.update({COMPILE_CACHE_ENV: str(tmp_path / "cache"), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"})
    program = ("from rlstruct.algos import ppo\n"
               "ppo.train(ppo.PPOConfig(env='CartPole-v1', backend='gymnax', n_envs=2, n_steps=8, max_env_steps=32, "
               f"eval_every=100, n_evaluation_envs=1, evaluation_max_steps=10, progress=False, tensorboard=False, "
               f"preset='none', logdir={str(tmp_path / 'run')!r}))")
    done = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True,
                          timeout=wall_limit(240))
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "run" / "summary.json").is_file()
    kept = sorted(p.name for p in (tmp_path / "cache" / "jax").iterdir())
    assert kept and all(name.startswith("jit_") for name in kept if not name.startswith(".")), kept


def test_a_cache_folder_that_cannot_be_made_is_refused_before_the_run_starts(tmp_path, monkeypatch):
    monkeypatch.delenv(INDUCTOR_CACHE_ENV, raising=False)
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv(COMPILE_CACHE_ENV, str(tmp_path / "a-file" / "cache"))
    config = A2CConfig(logdir=str(tmp_path / "run"), progress=False, tensorboard=False)
    with pytest.raises(ConfigError, match=r"RLSTRUCT_COMPILE_CACHE must name a folder this process can write .*"
                                          r"a-file/cache' \(Not a directory\); set RLSTRUCT_COMPILE_CACHE to another "
                                          r"folder, or to off"):
        entry.validate(config)
    assert not (tmp_path / "run").exists()
    # the user's inductor folder leaves the compile cache JAX's programs to keep: it is still checked
    monkeypatch.setenv(INDUCTOR_CACHE_ENV, str(tmp_path / "theirs"))
    monkeypatch.delenv(JAX_CACHE_ENV, raising=False)
    with pytest.raises(ConfigError, match="RLSTRUCT_COMPILE_CACHE must name a folder this process can write"):
        entry.validate(config)
    monkeypatch.setenv(JAX_CACHE_ENV, str(tmp_path / "their-jax"))  # both taken by the user's: not used, not checked
    entry.validate(config).lock.release()


def test_a_run_that_compiles_nothing_reports_no_compile_time(tmp_path):
    meter = CompileMeter()
    result = entry.train(A2CConfig(env="CartPole-v1", n_envs=4, n_steps=4, max_env_steps=32, eval_every=100,
                                   n_evaluation_envs=2, evaluation_max_steps=10, progress=False, tensorboard=False,
                                   preset="none", logdir=str(tmp_path / "run")))
    assert result.summary()["compile"] == meter.read() == {"seconds": 0.0, "graphs": 0, "fx_graph_cache_hits": 0,
                                                           "fx_graph_cache_misses": 0, "autograd_cache_hits": 0,
                                                           "autograd_cache_misses": 0}
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["compile"] == result.summary()["compile"]
