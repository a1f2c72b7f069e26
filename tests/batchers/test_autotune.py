"""Auto-tuning: the search logic with fake measurements, then one real tiny sweep with RL_Batcher."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from rlstruct.algos._train.profile import autotune_batcher, batcher_measure
from rlstruct.batchers import AutotuneResult, Measurement
from rlstruct.batchers.autotune import autotune, host_rss
from rlstruct.errors import MissingDependencyError

#: whether the plot extra (matplotlib) is installed: without it, writing a PNG is a one-line error naming the extra
PLOT = importlib.util.find_spec("matplotlib") is not None

pytestmark = pytest.mark.timeout(120)

MIB = 2**20


class Fake:
    """Throughput grows with the env count up to ``knee`` envs per process, then stays flat; memory is
    ``base + per_env * n`` per process. Records every configuration it is asked to measure."""

    def __init__(self, knee=512, per_env=MIB, base=100 * MIB, fail=None):
        self.knee, self.per_env, self.base, self.fail = knee, per_env, base, fail
        self.calls = []

    def __call__(self, p, n):
        self.calls.append((p, n))
        if self.fail == (p, n):
            raise RuntimeError("CUDA out of memory (fake)")
        w = max(p, 1)
        return Measurement(1000.0 * w * min(n, self.knee), w * (self.base + self.per_env * n))


def test_sweep_doubles_and_stops_at_saturation():
    fake = Fake(knee=512, base=0)
    r = autotune(fake, process_counts=(1,), min_envs=128, max_envs=8192, host_budget=2**40)
    assert fake.calls == [(1, 128), (1, 256), (1, 512), (1, 1024)]
    assert [row.status for row in r.rows] == ["measured"] * 4
    assert r.rows[1].gain == pytest.approx(1.0)  # twice the steps/s for twice the memory
    assert r.rows[-1].gain == pytest.approx(0.0) and r.rows[-1].note.startswith("saturated: +0.0% steps/s")
    assert (r.best.n_processes, r.best.n_envs) == (1, 512)


def test_small_memory_growth_does_not_make_noise_a_gain():
    # Memory is nearly all fixed cost: doubling envs grows it ~1%, steps/s by 3% (noise level).
    def measure(p, n):
        return Measurement({128: 100.0, 256: 200.0, 512: 206.0}[n], 1000 * MIB + n * 1024)

    r = autotune(measure, process_counts=(1,), min_envs=128, max_envs=512, host_budget=2**40)
    assert r.rows[-1].gain == pytest.approx(0.03 / 0.5) and "saturated" in r.rows[-1].note
    r = autotune(measure, process_counts=(1,), min_envs=128, max_envs=512, host_budget=2**40, min_gain_per_memory=0)
    assert r.rows[-1].note == ""  # 0 disables the stop


def test_configurations_that_do_not_fit_are_skipped_without_being_built():
    fake = Fake(knee=10**9, per_env=MIB, base=10 * MIB)
    r = autotune(fake, process_counts=(1, 4), min_envs=128, max_envs=4096, host_budget=600 * MIB)
    # p=1: 128, 256, 512 envs measured (138, 266, 522 MiB); 1024 projected at 1034 MiB: skipped, never built.
    # p=4: 4 x 128 envs projected from p=1's first row (4 x 138 MiB) fits; 4 x 256 (1104 MiB) does not.
    assert fake.calls == [(1, 128), (1, 256), (1, 512), (4, 128)]
    skipped = [(row.n_processes, row.n_envs) for row in r.rows if row.status == "skipped"]
    assert skipped == [(1, 1024), (4, 256)]
    assert r.rows[3].host_bytes == 1034 * MIB and r.rows[3].steps_per_s is None
    assert r.rows[3].note == "projected host memory 1.01 GiB > budget 0.59 GiB"
    # (1, 512) and (4, 128) both reach 512,000 steps/s: the one with less memory wins.
    assert (r.best.n_processes, r.best.n_envs) == (1, 512)


def test_gpu_budget_skips_on_gpu_memory():
    def measure(p, n):
        return Measurement(float(n), host_bytes=MIB, gpu_bytes=n * MIB)

    r = autotune(measure, process_counts=(1,), min_envs=128, max_envs=4096, host_budget=2**40, gpu_budget=300 * MIB)
    assert [row.status for row in r.rows] == ["measured", "measured", "skipped"]
    assert "projected GPU memory" in r.rows[-1].note


def test_a_failed_configuration_ends_its_sweep_only():
    fake = Fake(fail=(1, 256))
    r = autotune(fake, process_counts=(1, 2), min_envs=128, max_envs=256, host_budget=2**40)
    assert [(row.n_processes, row.n_envs, row.status) for row in r.rows] == [
        (1, 128, "measured"), (1, 256, "failed"), (2, 128, "measured"), (2, 256, "measured")]
    assert r.rows[1].note == "RuntimeError: CUDA out of memory (fake)"
    assert (r.best.n_processes, r.best.n_envs) == (2, 256)


def test_best_breaks_ties_on_memory_and_renders(tmp_path):
    def measure(p, n):
        return Measurement(5.0, host_bytes=n * MIB * max(p, 1))

    r = autotune(measure, process_counts=(0, 2), min_envs=128, max_envs=256, host_budget=2**40,
                 min_gain_per_memory=0)
    assert (r.best.n_processes, r.best.n_envs) == (0, 128)
    assert r.rows[0].total_envs == 128 and r.rows[-1].total_envs == 512
    text = r.table()
    assert text.splitlines()[1].startswith("*") and "best: n_processes=0, n_envs=128" in text
    d = json.loads(json.dumps(r.to_dict()))
    assert d["best"]["n_envs"] == 128 and len(d["rows"]) == 4
    if PLOT:
        assert r.plot(tmp_path / "a.png").read_bytes()[:4] == b"\x89PNG"
    else:
        with pytest.raises(MissingDependencyError, match=r"pip install 'rlstruct\[plot\]'"):
            r.plot(tmp_path / "a.png")


def test_bad_arguments_are_named():
    fake = Fake()
    with pytest.raises(ValueError, match="min_envs must be an int >= 1, got 0"):
        autotune(fake, min_envs=0)
    with pytest.raises(ValueError, match=r"max_envs must be an int >= min_envs \(128\), got 64"):
        autotune(fake, max_envs=64)
    with pytest.raises(ValueError, match="process_counts must be a non-empty list of ints >= 0"):
        autotune(fake, process_counts=())
    with pytest.raises(ValueError, match="min_gain_per_memory must be >= 0"):
        autotune(fake, min_gain_per_memory=-1)
    with pytest.raises(ValueError, match=r"memory_fraction must be in \(0, 1\]"):
        autotune(fake, memory_fraction=0)
    with pytest.raises(ValueError, match="no configuration could be measured.*raise host_budget"):
        autotune(Fake(fail=(1, 128)), process_counts=(1,))


def test_host_rss_counts_children():
    own = host_rss()
    # The child says when its 64 MiB are written: from then on its resident size holds still.
    code = "import sys, time; x = b'x' * (64 * 2**20); print('ready', flush=True); time.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        import psutil

        assert child.stdout.readline().strip() == "ready"
        proc = psutil.Process(child.pid)
        assert host_rss() >= own + 64 * MIB
        assert host_rss(child.pid) == proc.memory_info().rss
    finally:
        child.kill()
        child.wait()
        child.stdout.close()


def test_a_real_tiny_sweep_with_rl_batcher():
    measure = batcher_measure("CartPole-v1", n_timesteps=4, iters=1)
    m = measure(0, 16)
    assert m.steps_per_s > 0 and m.host_bytes >= 0 and m.gpu_bytes is None
    r = autotune_batcher("CartPole-v1", process_counts=(0, 1), min_envs=16, max_envs=32, n_timesteps=4, iters=1,
                         min_gain_per_memory=0)
    assert isinstance(r, AutotuneResult)
    assert [(row.n_processes, row.n_envs, row.status) for row in r.rows] == [
        (0, 16, "measured"), (0, 32, "measured"), (1, 16, "measured"), (1, 32, "measured")]
    # A worker process holds its own torch: far more host memory than the in-process envs.
    assert r.rows[2].host_bytes > 50 * MIB > r.rows[0].host_bytes
    assert r.best.steps_per_s == max(row.steps_per_s for row in r.rows)
    assert r.config["env"] == "CartPole-v1"


def test_autotune_command(tmp_path, capsys):
    from rlstruct.algos._train.cli import main

    png = tmp_path / "autotune.png"
    argv = ["autotune", "--processes", "0", "--min-envs", "8", "--max-envs", "16", "--n-timesteps", "2", "--iters", "1",
            "--min-gain", "0", "--png", str(png)]
    if not PLOT:
        assert main(argv) == 2 and "pip install 'rlstruct[plot]'" in capsys.readouterr().err
        argv[-1] = ""
    assert main(argv) == 0
    out = capsys.readouterr().out.strip().splitlines()
    result = json.loads(out[-1])
    assert [row["n_envs"] for row in result["rows"]] == [8, 16]
    assert result["png"] == (str(png) if PLOT else None) and png.exists() == PLOT
    assert any(line.startswith("best: n_processes=0") for line in out)
    assert main(["autotune", "--min-envs", "0", "--png", ""]) == 2
    assert "rlstruct autotune: error: min_envs must be an int >= 1" in capsys.readouterr().err
