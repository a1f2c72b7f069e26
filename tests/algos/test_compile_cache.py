"""The compile cache: a second launch of a run with a compiled update loads its graphs from rlstruct's cache folder
(inductor's and AOTAutograd's on-disk caches) instead of compiling them again, and each launch's summary says what it
spent compiling and how often the caches answered."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rlstruct.algos import A2CConfig
from rlstruct.algos._train import entry
from rlstruct.algos._train.compile_cache import (
    COMPILE_CACHE_ENV,
    INDUCTOR_CACHE_ENV,
    CompileMeter,
    compile_cache,
    compile_cache_dir,
)
from rlstruct.errors import ConfigError
from tests.helpers import ForkedCommand

FLAGS = ["--compile-update", "--env", "CartPole-v1", "--seed", "0", "--n-envs", "4", "--n-steps", "8",
         "--max-env-steps", "128", "--eval-every", "100", "--n-evaluation-envs", "2", "--evaluation-max-steps", "20",
         "--hidden-sizes", "16", "--no-progress", "--no-tensorboard", "--preset", "none"]


def _launch(logdir: Path, cache: Path) -> dict:
    """``rlstruct train a2c --compile-update`` forked from this process (:class:`~tests.helpers.ForkedCommand`: a
    fresh interpreter's imports of torch and its compiler are not what this file checks), with nothing compiled in
    memory: dynamo's and inductor's in-memory caches are emptied in the child first, so only the on-disk cache in
    ``cache`` can spare a compile; its summary."""

    def from_a_clean_compiler() -> None:
        import torch._dynamo
        from torch._inductor.utils import clear_caches

        os.environ.pop(INDUCTOR_CACHE_ENV, None)  # inductor sets it in a process that compiled without it
        os.environ[COMPILE_CACHE_ENV] = str(cache)
        torch._dynamo.reset()
        clear_caches()

    run = ForkedCommand(["train", "a2c", *FLAGS, "--logdir", str(logdir)], logdir.parent / f"{logdir.name}-command",
                        seam=from_a_clean_compiler)
    try:
        assert run.wait(600) == 0, run.stderr
    finally:
        run.kill()
    return json.loads((logdir / "summary.json").read_text())


@pytest.mark.compiles
@pytest.mark.long(reason="two forked launches, the first compiling A2C's update cold with inductor into a fresh "
                         "cache folder (the test about 30 CPU s of the 2-core machine's alone, 19 in a process that "
                         "imported the compiler already, at the test session's -O0 builds: tests/conftest.py's "
                         "TEST_INDUCTOR_ENV)")
@pytest.mark.timeout(900)
def test_a_second_launch_loads_the_compiled_update_from_the_cache(tmp_path):
    import torch._dynamo  # noqa: F401  (imported once here for both launches, as each would)
    import torch._inductor.compile_fx  # noqa: F401

    cache = tmp_path / "cache"
    first = _launch(tmp_path / "first", cache)["compile"]
    second = _launch(tmp_path / "second", cache)["compile"]
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


def test_a_run_that_compiles_nothing_reports_no_compile_time(tmp_path):
    meter = CompileMeter()
    result = entry.train(A2CConfig(env="CartPole-v1", n_envs=4, n_steps=4, max_env_steps=32, eval_every=100,
                                   n_evaluation_envs=2, evaluation_max_steps=10, progress=False, tensorboard=False,
                                   preset="none", logdir=str(tmp_path / "run")))
    assert result.summary()["compile"] == meter.read() == {"seconds": 0.0, "graphs": 0, "fx_graph_cache_hits": 0,
                                                           "fx_graph_cache_misses": 0, "autograd_cache_hits": 0,
                                                           "autograd_cache_misses": 0}
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["compile"] == result.summary()["compile"]
