"""benchmarks/published.py at a tiny size: a killed run is resumed from its checkpoint, a finished run is skipped, and
the table reads the finished runs through ``rlstruct compare``."""

from __future__ import annotations

import dataclasses
import json
import re
import signal
import time

import pytest

from benchmarks import learning_check, published
from tests.project.forked_runs import fork_the_runs

STEPS = 16_384  # two PPO iterations of ppo-minatar-5m (64 envs x 128 steps)


@pytest.fixture
def forked_runs(tmp_path, monkeypatch):
    """published.py's runs forked from this process instead of fresh interpreters (``tests.project.forked_runs``):
    what these tests prove is what the script does with its runs, not an interpreter's start."""
    fork_the_runs(published, tmp_path / "forked", monkeypatch)


def _wait_for(path, proc, timeout=120.0):
    deadline = time.monotonic() + timeout
    while not path.is_file():
        assert proc.poll() is None, f"the run ended before writing {path}"
        assert time.monotonic() < deadline, f"no {path} after {timeout} s"
        time.sleep(0.2)


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_a_killed_run_resumes_a_finished_one_is_skipped_and_the_table_reads_them(tmp_path, capsys, monkeypatch,
                                                                                   forked_runs):
    """One seed's run, started, killed, resumed, skipped once finished and re-evaluated. The IQM's interval over
    several seeds' scores and re-evaluations, read from their folders, is
    :func:`test_the_table_is_regenerated_from_the_rows_records_as_from_their_run_folders`'s."""
    pytest.importorskip("scipy.stats", reason="the table's IQM intervals need scipy: pip install 'rlstruct[stats]'")
    root, page = tmp_path / "runs", tmp_path / "published.md"
    killed = published.run_folder(root, "breakout", "ppo", 0)
    # a run killed outright (SIGKILL: nothing written at exit) after its first periodic checkpoint
    proc = published.start(root, "breakout", "ppo", 0, max_env_steps=1_000_000, every=1)
    try:
        _wait_for(killed / "checkpoint.pt", proc)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        proc.log.close()
    assert published.run_state(killed) == "resumable" and not (killed / "summary.json").exists()
    page.write_text(f"# Published\n\nbefore\n\n{published.TABLE_BEGIN}\nold\n{published.TABLE_END}\n\nafter\n")

    args = ["--root", str(root), "--tasks", "breakout", "--seeds", "0", "--max-env-steps", str(STEPS)]
    assert published.main([*args, "--table", str(page)]) == 0
    out = capsys.readouterr().out
    assert out.index(f"{killed}: started") < out.index(f"{killed}: resumed"), out
    summary = json.loads((killed / "summary.json").read_text())
    assert summary["env_steps"] == STEPS and summary["stop_reason"] == "budget"
    assert published.run_state(killed) == "finished"
    rows = (killed / "progress.csv").read_text().splitlines()
    assert rows[1].startswith("1,8192,"), "the resumed run's curve keeps the rows before the kill"
    assert published.training_return(killed) is not None

    finished_at = (killed / "summary.json").stat().st_mtime_ns
    assert published.main(args) == 0
    assert capsys.readouterr().out.count("finished, skipped") == 1
    assert (killed / "summary.json").stat().st_mtime_ns == finished_at

    text = page.read_text()
    assert text.startswith("# Published\n\nbefore\n\n<!-- published table: begin -->\n| env |") and "old" not in text
    assert text.endswith("<!-- published table: end -->\n\nafter\n")
    breakout = next(line for line in text.splitlines() if line.startswith("| MinAtar/Breakout-v1 | ppo"))
    assert "| 5M (at 16,384) | 1 |" in breakout
    hopper = next(line for line in text.splitlines() if line.startswith("| Hopper-v4 | ppo"))
    assert "not run yet: `python benchmarks/published.py --root runs/published --tasks hopper --algos ppo" in hopper
    assert breakout.split(" | ")[5] == "-", "no re-evaluation on MinAtar"

    # --reevaluate: each finished run's final weights over a task's episodes (here 3), once, then in the table
    monkeypatch.setitem(published.TASKS, "breakout", dataclasses.replace(published.TASKS["breakout"], reevaluation=3))
    assert published.main([*args, "--reevaluate", "--table", str(page)]) == 0
    record = json.loads(published.reevaluation_path(killed, 3).read_text())
    assert record["episodes"] == 3 and record["policy"] == "greedy" and record["env"] == "MinAtar/Breakout-v1"
    assert record["command"].endswith(f"seed-0 --episodes 3 --seed {published.REEVALUATION_SEED}")
    breakout = next(line for line in page.read_text().splitlines() if line.startswith("| MinAtar/Breakout-v1 | ppo"))
    assert breakout.split(" | ")[5] == published._fmt(record["eval_return"]), "one seed's re-evaluation"
    assert published.reevaluate(root, "breakout", "ppo") == [], "a run re-evaluated once is not again"


def test_a_runs_wall_time_counts_every_session(tmp_path):
    """The table's wall time of a resumed run: ``run_wall_time_s``, else (a summary written before that field) the last
    row of ``progress.csv``, which counts every session; never the last session's ``wall_time_s`` alone."""
    (tmp_path / "progress.csv").write_text("iteration,env_steps,wall_time_s\n1,8,600.5\n2,16,1265.9\n")
    assert published.run_wall_time(tmp_path, {"wall_time_s": 15.8, "run_wall_time_s": 1267.3}) == 1267.3
    assert published.run_wall_time(tmp_path, {"wall_time_s": 15.8}) == 1265.9
    assert published.run_wall_time(tmp_path / "missing", {"wall_time_s": 15.8}) is None


def test_the_zoo_halfcheetah_task_runs_its_preset_and_its_row_stands_beside_the_zoos_figure(tmp_path):
    args = published.train_command(tmp_path, "halfcheetah-zoo", "ppo", 0)
    assert args[:2] == ["train", "ppo"] and args[args.index("--env") + 1] == "HalfCheetah-v4"
    assert args[args.index("--preset") + 1] == "ppo-halfcheetah-zoo"
    assert args[args.index("--checkpoint-every") + 1] == "97", "about 50k env steps of 1 env x 512 steps"
    row = published.row_cells(tmp_path, "halfcheetah-zoo", "ppo")
    assert row[:4] == ["HalfCheetah-v4", "ppo (`--preset ppo-halfcheetah-zoo`)", "1M", "0"]
    assert row[-1] == "5,819 (rl-zoo)" and "--tasks halfcheetah-zoo --algos ppo" in row[4]


def test_the_zoo_halfcheetah_task_has_stable_baselines3_beside_it_from_its_run_folders(tmp_path):
    """The peer row: the command that writes its folders while none are, ``rlstruct compare``'s IQM once they are, its
    unfinished seeds named (a peer keeps no checkpoint: they run again)."""
    rows = [a for t, a in published.ROWS if t == "halfcheetah-zoo"]
    assert rows == ["ppo", "sb3-ppo"], "the peer's row follows the task's own"
    row = published.row_cells(tmp_path, "halfcheetah-zoo", "sb3-ppo")
    assert row[1].startswith("Stable-Baselines3") and row[2:4] == ["1M", "0"]
    assert "not run yet: `python benchmarks/sb3_reference.py --algo ppo --env HalfCheetah-v4" in row[4]
    assert "--logdir runs/published/sb3-ppo-halfcheetah-zoo`" in row[4]

    group = tmp_path / "sb3-ppo-halfcheetah-zoo"
    for seed, score in ((0, 5000.0), (1, 6000.0), (2, None)):
        run = group / f"seed-{seed}"
        run.mkdir(parents=True)
        (run / "config.json").write_text(json.dumps({"algo": "sb3-ppo", "env": "HalfCheetah-v4", "seed": seed}))
        (run / "progress.csv").write_text("iteration,env_steps,wall_time_s,train/episode_return,train/episode_length,"
                                          f"eval/return\n1,1000000,1800,{4000 + seed},1000.0,\n")
        if score is not None:
            (run / "summary.json").write_text(json.dumps({"eval_return": score, "env_steps": 1_000_000,
                                                          "stop_reason": "budget", "run_wall_time_s": 1800.0}))
    row = published.row_cells(tmp_path, "halfcheetah-zoo", "sb3-ppo")
    assert row[2:5] == ["1M", "2 (+1 running)", "5,500 [5,000, 6,000]"] and row[5:8] == ["-", "4,000", "30 min"], row
    (group / "seed-1" / "progress.csv").write_text("iteration,env_steps,wall_time_s,eval/return\n1,1000000,1800,6000\n")
    assert published.row_cells(tmp_path, "halfcheetah-zoo", "sb3-ppo")[6] == "4,000 (1 of 2 seeds)"
    (group / "seed-0" / "summary.json").unlink()
    (group / "seed-1" / "summary.json").unlink()
    row = published.row_cells(tmp_path, "halfcheetah-zoo", "sb3-ppo")
    assert "not finished yet (seed-0 at 1,000,000 env steps" in row[4] and "remove their folders and run again" \
        in row[4], row


#: each MuJoCo row's published figures: its own algorithm's, CleanRL's then the zoo's
MUJOCO_REFERENCES = {
    ("hopper", "ppo"): "2,383 (CleanRL); 2,410 (rl-zoo)", ("hopper", "sac"): "2,310 (CleanRL); 2,326 (rl-zoo)",
    ("hopper", "td3"): "3,135 (CleanRL); 3,606 (rl-zoo)",
    ("halfcheetah", "ppo"): "1,443 (CleanRL); 5,819 (rl-zoo)",
    ("halfcheetah", "sac"): "9,635 (CleanRL); 9,535 (rl-zoo)",
    ("halfcheetah", "td3"): "9,583 (CleanRL); 9,656 (rl-zoo)",
    ("walker2d", "ppo"): "2,288 (CleanRL); 3,479 (rl-zoo)", ("walker2d", "sac"): "3,591 (CleanRL); 3,863 (rl-zoo)",
    ("walker2d", "td3"): "4,058 (CleanRL); 4,718 (rl-zoo)",
}


@pytest.mark.parametrize("task", ["hopper", "halfcheetah", "walker2d"])
def test_the_mujoco_tasks_have_sac_and_td3_rows_beside_their_own_algorithms_figures(tmp_path, task):
    assert [a for t, a in published.ROWS if t == task] == ["ppo", "sac", "td3"]
    for algo in ("ppo", "sac", "td3"):
        row = published.row_cells(tmp_path, task, algo)
        assert row[1:4] == [f"{algo} (`--preset {algo}-mujoco-1m`)", "1M", "0"]
        seeds = "0,1,2,3,4" if algo == "ppo" else "0,1,2"  # PPO's runs take minutes, SAC's and TD3's hours
        assert row[4] == (f"not run yet: `python benchmarks/published.py --root runs/published --tasks {task} --algos "
                          f"{algo} --seeds {seeds}`")
        assert row[-1] == MUJOCO_REFERENCES[task, algo]
        args = published.train_command(tmp_path, task, algo, 0)
        assert args[:2] == ["train", algo] and args[args.index("--preset") + 1] == f"{algo}-mujoco-1m"
        assert args[args.index("--logdir") + 1] == str(tmp_path / f"{algo}-{task}" / "seed-0")
    # one env, 8 env steps an iteration: a checkpoint every 50k env steps is 6,250 iterations
    assert published.checkpoint_every("sac-mujoco-1m") == published.checkpoint_every("td3-mujoco-1m") == 6_250


def test_a_sac_run_in_its_folder_resumes_and_the_command_line_takes_sac_and_td3(tmp_path):
    """``ROOT/sac-hopper/seed-0`` with a checkpoint (a run of ``--preset sac-mujoco-1m`` stopped part way) resumes in
    its own folder; ``--algos sac,td3`` names the MuJoCo rows, and an algorithm of no row is refused."""
    folder = published.run_folder(tmp_path, "hopper", "sac", 0)
    assert folder == tmp_path / "sac-hopper" / "seed-0"
    folder.mkdir(parents=True)
    (folder / "checkpoint.pt").write_bytes(b"")
    args = published.train_command(tmp_path, "hopper", "sac", 0)
    assert args[:4] == ["train", "sac", "--resume", str(folder)] and "--preset" not in args
    assert published.main(["--root", str(tmp_path), "--tasks", "hopper,walker2d", "--algos", "sac,td3",
                           "--seeds", ""]) == 0
    with pytest.raises(SystemExit, match="unknown \\['a2c'\\]"):
        published.main(["--root", str(tmp_path), "--tasks", "hopper", "--algos", "a2c"])
    assert [(t, a) for t, a in published.ROWS if a in ("sac", "td3")] == [
        (t, a) for t in ("hopper", "halfcheetah", "walker2d") for a in ("sac", "td3")]


def test_the_training_return_counts_the_episodes_since_the_last_row_that_had_any(tmp_path):
    """Freeway's episodes all end together, every 2,500 frames: most iterations log no training return (nan), and the
    row that does holds every env's episode. The last 100 episodes are then that row's alone, not the rows before it
    weighed as one episode each."""
    lines = ["iteration,env_steps,train/episode_return,train/episode_length"]
    for i in range(1, 321):  # 128 envs x 32 steps an iteration; episodes end every ~78 iterations
        ended = i % 78 == 0
        ret = ("60.0" if i < 200 else "0.0") if ended else "nan"
        lines.append(f"{i},{i * 4096},{ret},{'2501.0' if ended else 'nan'}")
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "progress.csv").write_text("\n".join(lines) + "\n")
    assert published.training_return(folder) == 0.0
    per_row = 78 * 4096 / 2501  # the episodes of each row that has any: 127.8, all 128 envs'
    assert published.training_return(folder, episodes=300) == pytest.approx(60.0 * (300 - 2 * per_row) / 300)


def test_the_table_is_regenerated_from_the_rows_records_as_from_their_run_folders(tmp_path, capsys):
    """``--pack-rows`` then ``--table --from-records``: every row with runs reads the same from its records (IQM,
    re-evaluation, training return, wall time, seeds left out) as from its folders; a row without them says so."""
    pytest.importorskip("scipy.stats", reason="the table's IQM intervals need scipy: pip install 'rlstruct[stats]'")
    pytest.importorskip("matplotlib", reason="the curves need matplotlib: pip install 'rlstruct[plot]'")
    root, records, page = tmp_path / "runs", tmp_path / "records", tmp_path / "published.md"
    for algo, task in (("ppo", "halfcheetah"), ("sb3-ppo", "halfcheetah-zoo")):
        group = root / f"{algo}-{task}"
        for seed, score in ((0, 5000.0), (1, 6000.0), (2, 5500.0), (3, None)):
            run = group / f"seed-{seed}"
            run.mkdir(parents=True)
            (run / "config.json").write_text(json.dumps({"algo": algo, "env": "HalfCheetah-v4", "seed": seed,
                                                         "logdir": str(run)}))
            (run / "progress.csv").write_text(
                "iteration,env_steps,wall_time_s,train/episode_return,train/episode_length,eval/return\n"
                f"1,500000,900,{3000 + seed},1000.0,\n1,500000,900,,,{4000 + seed}\n"
                f"2,1000000,1800,{4000 + seed},1000.0,\n2,1000000,1800,,,{score or 0}\n")
            if score is not None:
                (run / "summary.json").write_text(json.dumps({"eval_return": score, "env_steps": 1_000_000,
                                                              "stop_reason": "budget",
                                                              "run_wall_time_s": 1700.0 + 60 * seed}))
                (run / "reevaluation-150.json").write_text(json.dumps({"eval_return": score - 100}))
    page.write_text("<!-- published table: begin -->\nthe numbers\n<!-- published table: end -->\n")
    with pytest.raises(SystemExit, match="2"):  # no records yet: the page keeps its table
        published.main(["--from-records", "--records", str(records), "--table", str(page)])
    assert "needs the records of a row of the table" in capsys.readouterr().err and "the numbers" in page.read_text()
    assert published.main(["--root", str(root), "--pack-rows", "--records", str(records)]) == 0
    assert sorted(p.name for p in records.iterdir()) == ["ppo-halfcheetah.json", "sb3-ppo-halfcheetah-zoo.json"]
    assert str(root) not in (records / "ppo-halfcheetah.json").read_text()
    assert published.main(["--from-records", "--records", str(records), "--table", str(page), "--curves",
                           str(tmp_path / "curves")]) == 0
    assert f"curves: {tmp_path / 'curves' / 'halfcheetah.png'}" in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "curves").iterdir()) == ["halfcheetah-zoo.png", "halfcheetah.png"]
    from_folders = published.table(root).splitlines()
    from_records = page.read_text().split("<!-- published table: begin -->\n")[1].splitlines()
    for row in ("| HalfCheetah-v4 | ppo (`--preset ppo-mujoco-1m`)", "| HalfCheetah-v4 | Stable-Baselines3"):
        [folder_row] = [r for r in from_folders if r.startswith(row)]
        [record_row] = [r for r in from_records if r.startswith(row)]
        assert record_row == folder_row
        assert "| 3 (+1 running) | 5,500 [5,000, 6,000] | 5,400 [4,900, 5,900] | 4,001 | 28-30 min |" in record_row
    [breakout] = [r for r in from_records if r.startswith("| MinAtar/Breakout-v1 | ppo")]
    assert "no records yet (`published.py --pack-rows` where its run folders are" in breakout
    assert "Regenerated from the runs' records" in page.read_text()


def test_rows_whose_runs_take_under_20_minutes_run_five_seeds_the_others_three():
    for task in ("asterix", "breakout", "freeway", "seaquest", "spaceinvaders"):
        for algo in ("ppo", "pqn"):
            assert published.shown_command(task, algo).endswith(f"--tasks {task} --algos {algo} --seeds 0,1,2,3,4")
        assert published.shown_command(task, "dqn").endswith("--seeds 0,1,2")
    for task in ("hopper", "halfcheetah", "walker2d"):
        assert published.shown_command(task, "ppo").endswith("--seeds 0,1,2,3,4")
        for algo in ("sac", "td3"):
            assert published.shown_command(task, algo).endswith("--seeds 0,1,2")
    assert published.shown_command("halfcheetah-zoo", "ppo").endswith("--seeds 0,1,2")


def test_a_measured_row_without_records_or_run_folders_keeps_its_line_and_says_so(tmp_path):
    """A table written where a row has neither run folders nor records (its runs were measured before records were
    kept, on a machine whose folders are gone) keeps the row's line as the page had it, its seeds cell saying no
    records are kept, with the current references; a row never run still says how to run it."""
    page = tmp_path / "published.md"
    label = published.row_spec("breakout", "ppo")[0]
    old = ["MinAtar/Breakout-v1", label, "5M", "3", "12.2 [6.9, 19.2]", "-", "11.3", "6-20 min", "an old reference"]
    page.write_text("intro\n<!-- published table: begin -->\n| " + " | ".join(old) + " |\n"
                    "<!-- published table: end -->\noutro\n")
    (tmp_path / "runs").mkdir()
    published.write_table(tmp_path / "runs", page)
    text = page.read_text()
    [breakout] = [r for r in text.splitlines() if r.startswith("| MinAtar/Breakout-v1 | ppo")]
    cells = [c.strip() for c in breakout.strip("|").split(" | ")]
    assert cells[:8] == [*old[:3], "3 (no records kept)", *old[4:8]]
    assert cells[8] == "; ".join(f"{fig} ({src})" for fig, src in published.TASKS["breakout"].references_of("ppo"))
    [asterix_dqn] = [r for r in text.splitlines() if r.startswith("| MinAtar/Asterix-v1 | dqn")]
    assert "| 0 | not run yet: `python benchmarks/published.py" in asterix_dqn
    assert "measured before the records of its runs were kept" in text
    assert text.startswith("intro\n") and text.endswith("outro\n")
    published.write_table(tmp_path / "runs", page)  # written again: the same line, said once
    again = page.read_text()
    assert breakout in again.splitlines() and "(no records kept) (no records kept)" not in again


@pytest.mark.timeout(600)
@pytest.mark.slow
def test_the_learning_check_passes_the_recorded_code_and_fails_a_row_that_learns_slower(tmp_path, capsys,
                                                                                         monkeypatch, forked_runs):
    """A tiny row (A2C on CartPole, 3 evaluations): records of seed 0 and of a seed 50 above it at every evaluation
    (the band's other end: a second seed's run would only move it), then ``--check`` of seed 0 on the same code passes
    (it gives the recorded seed's curve); records raised by 100 stand for code that learned faster, which the same run
    then falls under: exit 1. The first check runs seed 0 live, which proves that a check's run gives the recorded
    curve; the second is handed that run's evaluations (``run_prefix`` replayed): its verdict is the claim, and the
    same code's run of the same seed would give it the same curve again."""
    task = published.Task("cartpole", "CartPole-v1", {"a2c": "a2c-cartpole"}, ())
    monkeypatch.setattr(published, "TASKS", {"cartpole": task})
    monkeypatch.setattr(published, "ROWS", [("cartpole", "a2c")])
    monkeypatch.setattr(published, "ALGOS", {"a2c"})
    root, records, budget = tmp_path / "runs", tmp_path / "records", "24576"  # 3 evaluations, every 8,192 env steps
    base = ["--root", str(root), "--tasks", "cartpole", "--algos", "a2c", "--max-env-steps", budget]
    assert published.main([*base, "--seeds", "0"]) == 0
    assert published.main(["--root", str(root), "--pack-rows", "--records", str(records)]) == 0
    capsys.readouterr()
    path = records / "a2c-cartpole.json"
    data = json.loads(path.read_text())
    (run,) = data["runs"]
    above = json.loads(json.dumps(run))
    above["name"], above["config"]["seed"], above["returns"] = "seed-1", 1, [r + 50.0 for r in run["returns"]]
    data["runs"].append(above)
    path.write_text(json.dumps(data))

    ran, live = [], learning_check.run_prefix

    def run_and_keep(*args, **kwargs):
        ran.append(live(*args, **kwargs))
        return ran[-1]

    monkeypatch.setattr(learning_check, "run_prefix", run_and_keep)
    assert published.main([*base, "--seeds", "0", "--check", "--records", str(records)]) == 0
    lines = capsys.readouterr().out.splitlines()
    verdicts = [line for line in lines if line.startswith("a2c-cartpole/seed-0:")]
    assert len(verdicts) == 1 and verdicts[0].endswith(": pass"), lines
    # the same seed on the same code: the recorded seed 0's curve, so its area is one end of the band
    area, low, high = re.search(r"return ([-0-9.]+) over the first 16,384 env steps, in the band of the recorded "
                                r"seeds \[([-0-9.]+), ([-0-9.]+)\]", verdicts[0]).groups()
    assert area in (low, high), verdicts[0]
    assert lines[-1] == "1 of 1 runs at or above their rows' recorded seeds"

    data = json.loads(path.read_text())
    for run in data["runs"]:
        run["returns"] = [r + 100.0 for r in run["returns"]]
    path.write_text(json.dumps(data))
    (evaluations,) = ran
    monkeypatch.setattr(learning_check, "run_prefix", lambda *args, **kwargs: evaluations)
    assert published.main([*base, "--seeds", "0", "--check", "--records", str(records)]) == 1
    out = capsys.readouterr().out
    assert "under the band" in out and out.rstrip().endswith("0 of 1 runs at or above their rows' recorded seeds")

    # a row without records is said to be, and a check of nothing is an error
    assert published.main([*base, "--seeds", "0", "--check", "--records", str(tmp_path / "none")]) == 2
    assert "no records of finished runs" in capsys.readouterr().out
