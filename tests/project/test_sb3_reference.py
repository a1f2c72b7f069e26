"""benchmarks/sb3_reference.py at a tiny budget: rl-baselines3-zoo's HalfCheetah entry (the reference beside
``ppo-halfcheetah-zoo``) trains through VecNormalize and reports its evaluation as JSON and as a run folder that
``rlstruct compare`` and ``benchmarks/published.py`` read."""

from __future__ import annotations

import csv
import dataclasses
import json

import pytest
import torch

from benchmarks import published, sb3_reference
from tests.project.forked_runs import fork_the_runs


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_zoos_halfcheetah_settings_train_and_evaluate_at_the_budget(tmp_path, monkeypatch, capsys):
    pytest.importorskip("mujoco", reason="the mujoco extra is not installed: pip install 'rlstruct[mujoco]'")
    pytest.importorskip("stable_baselines3", reason="Stable-Baselines3 is not installed (the test extra has it)")
    out, group = tmp_path / "runs.json", tmp_path / "sb3-ppo-halfcheetah-zoo"
    args = ["--algo", "ppo", "--env", "HalfCheetah-v4", "--max-env-steps", "2048", "--eval-every", "1024",
            "--eval-episodes", "1", "--seeds", "3", "--logdir", str(group)]
    # The script's main in this process (a fresh one would import torch again: 3 CPU s): it sets torch's threads,
    # which the tests after this one get back.
    monkeypatch.chdir(tmp_path)
    threads = torch.get_num_threads()
    try:
        assert sb3_reference.main([*args, "--json", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)
    (run,) = json.loads(out.read_text())
    assert run["seed"] == 3 and run["env_steps"] == 2048 and run["last_eval_env_steps"] == 2048
    assert isinstance(run["last_eval_return"], float)

    # The run folder: read by rlstruct compare as rlstruct's own, its score the JSON's last evaluation.
    from rlstruct.algos._train.compare import compare_groups, load_group

    loaded = load_group(str(group))
    assert loaded.scores == {"HalfCheetah-v4": [run["last_eval_return"]]} and not loaded.left_out
    assert compare_groups([loaded])["groups"][group.name]["iqm"]["value"] == pytest.approx(run["last_eval_return"])
    summary = json.loads((group / "seed-3" / "summary.json").read_text())
    assert summary["stop_reason"] == "budget" and summary["env_steps"] == 2048
    # its training episodes (two of 1,000 steps) as published.py reads them, and its two evaluations

    with (group / "seed-3" / "progress.csv").open() as f:
        rows = list(csv.DictReader(f))
    episodes = [r for r in rows if r["train/episode_return"] not in ("", "nan")]
    assert [r["train/episode_length"] for r in episodes] == ["1000.0", "1000.0"], rows
    assert published.training_return(group / "seed-3") == pytest.approx(sum(float(r["train/episode_return"])
                                                                  for r in episodes) / 2)
    assert [int(r["env_steps"]) for r in rows if r["eval/return"]] == [1024, 2048]

    # Its final model, evaluated again as published.py's --reevaluate does for the peer's row (2 episodes here), the
    # script's --reevaluate forked from this process (tests.project.forked_runs): a fresh one would import torch,
    # Stable-Baselines3 and MuJoCo again to evaluate the same model.
    assert {"model.zip", "vecnormalize.pkl"} <= {p.name for p in (group / "seed-3").iterdir()}
    fork_the_runs(published, tmp_path / "forked", monkeypatch)
    monkeypatch.setitem(published.TASKS, "halfcheetah-zoo",
                        dataclasses.replace(published.TASKS["halfcheetah-zoo"], reevaluation=2))
    (written,) = published.reevaluate(tmp_path, "halfcheetah-zoo", "sb3-ppo")
    record = json.loads(written.read_text())
    assert record["episodes"] == 2 and record["algo"] == "sb3-ppo" and record["env"] == "HalfCheetah-v4"
    assert record["command"].startswith("python benchmarks/sb3_reference.py --reevaluate ")
    assert record["return_min"] <= record["eval_return"] <= record["return_max"]
    row = published.row_cells(tmp_path, "halfcheetah-zoo", "sb3-ppo")
    assert row[5] == published._fmt(record["eval_return"]), "one seed's re-evaluation, no interval"

    # A folder that holds a run is refused before anything trains (in this process: the refusal needs no fresh one).
    with pytest.raises(SystemExit) as refused:
        sb3_reference.main(args)
    assert refused.value.code == 2
    err = capsys.readouterr().err
    assert "--logdir's run folders must be new" in err and str(group / "seed-3") in err
