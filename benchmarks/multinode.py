"""Past one machine, on one host: a two-node Ray cluster and a two-node ``torchrun`` give the run of one process.

Two halves; every configuration is a command of its own (a fresh process), the order rotated over ``--rounds``:

* **Ray.** Two Ray nodes, each the ``ray start`` a user types on a machine of a cluster: the head, and a second node
  joining it at the head's address, each with one CPU, its own ports and its own temp dir. ``rlstruct train a2c
  --ray-actors 2 --ray-address auto`` runs on them, each actor asking for one CPU, so that Ray places one on each
  node; each node's log folder then names the actor process it hosted. The same run in one process with
  ``--n-processes 2`` (the actors host the same envs, seeded alike, rows in the same order) must write the same
  ``progress.csv`` (every column but those that measure time) and end with the same parameters, bit for bit.
* **torchrun.** Two launchers ``torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint
  127.0.0.1:PORT``, what a SLURM job runs once per node (docs/scaling.md), each in a folder of its own, run
  ``rlstruct train ppo`` as 2 ranks of 4 envs; one process of 8 envs in 2 worker processes steps the same envs with
  the same draws. The all-reduce sums the ranks' gradients in another order than one process's loss does, so the
  parameters at the end are compared as tests/algos/test_distributed.py compares them (``rtol=1e-4, atol=1e-5``),
  and whether they are also equal bit for bit is reported. Each launcher's log says which rank it ran.

One host runs every node: the network between the nodes is the loopback interface, and the nodes share two cores.
A Ray cluster of two nodes listens on every interface, so the nodes and the runs use Ray's token authentication, with
a token made for this run. Each ``ray start`` runs with ``--block``: this script owns the node and ends it with a
SIGTERM (Ray drains it and stops its processes), where a user would type ``ray stop`` (which ends every Ray process of
the host, another user's included). Whatever is left of a node, a command or its process group afterwards is killed,
and the report lists what had to be (nothing, in a clean run); a node or a command also gets a SIGTERM when this
script dies (Linux's parent-death signal).

Usage::

    python benchmarks/multinode.py [--budget 640] [--rounds 1] [--parts ray,torchrun] [--json FILE]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _fresh import load_average, machine, med_range  # noqa: E402

BIN = Path(sys.executable).parent
#: env steps of one iteration of the torchrun half (2 ranks x 4 envs x 16 steps); A2C's of the Ray half is 64
ITERATION = 128
COMMON = ["--env", "CartPole-v1", "--preset", "none", "--n-steps", "16", "--eval-every", "1000",
          "--n-evaluation-envs", "1", "--evaluation-max-steps", "20", "--no-progress", "--no-tensorboard"]
A2C = ["rlstruct", "train", "a2c", *COMMON, "--n-envs", "4"]
# Advantage normalisation is per rank (as in CleanRL's multi-GPU PPO), so it is off to compare ranks with one process.
PPO = ["rlstruct", "train", "ppo", *COMMON, "--no-normalize-advantages", "--n-minibatches", "1", "--n-epochs", "3"]
NODES = ("node-a", "node-b")
RTOL, ATOL = 1e-4, 1e-5
_PR_SET_PDEATHSIG = 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def base_environment() -> dict[str, str]:
    """This interpreter's ``rlstruct``, ``ray`` and ``torchrun`` first on PATH; one torch thread per process."""
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "OMP_NUM_THREADS": "1"}


# --------------------------------------------------------------------------- processes: start, end, find again
def _stat(pid: int) -> tuple[str, int, str] | None:
    """``(state, process group, start time)`` of ``pid``, from /proc; ``None`` when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return fields[0], int(fields[2]), fields[19]


def tree(pid: int) -> dict[int, str]:
    """``pid`` and every process under it, each with its start time (so that a later process given a freed id is not
    taken for it)."""
    found: dict[int, str] = {}
    todo = [pid]
    while todo:
        p = todo.pop()
        stat = _stat(p)
        if stat is None or p in found:
            continue
        found[p] = stat[2]
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                todo.extend(int(c) for c in (task / "children").read_text().split())
            except OSError:
                continue
    return found


def alive(processes: dict[int, str]) -> list[int]:
    """The processes of ``processes`` still running (a zombie has ended)."""
    out = []
    for p, start in processes.items():
        stat = _stat(p)
        if stat is not None and stat[2] == start and stat[0] != "Z":
            out.append(p)
    return out


def in_group(pgid: int) -> dict[int, str]:
    """The running processes of process group ``pgid``, with their start times."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = _stat(int(entry.name))
            if stat is not None and stat[1] == pgid and stat[0] != "Z":
                found[int(entry.name)] = stat[2]
    return found


def is_ray_process(pid: int) -> bool:
    """Whether ``pid`` runs and is a Ray worker (its title starts with ``ray::``)."""
    stat = _stat(pid)
    try:
        return stat is not None and stat[0] != "Z" and Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"ray::")
    except OSError:
        return False


def kill(processes: dict[int, str]) -> list[int]:
    """SIGKILLs what of ``processes`` still runs; returns their ids."""
    left = alive(processes)
    for p in left:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


def _die_with_this_process() -> None:
    # A child outlives a parent that is killed: the kernel sends it SIGTERM then (ray start drains its node, rlstruct
    # stops its run, torchrun stops its ranks). This script starts its children from its one thread.
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)


def launch(cmd: list[str], cwd: Path, env: dict[str, str], log: Path) -> subprocess.Popen:
    """``cmd`` in a session of its own (its process group ends as one), stdout and stderr into ``log``."""
    with open(log, "w") as out:
        return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=_die_with_this_process)


def end(proc: subprocess.Popen, grace: float = 15.0) -> list[int]:
    """Ends ``proc``'s process group: SIGTERM if ``proc`` still runs, SIGKILL to what is left after ``grace`` seconds.
    Returns the ids of the processes that had to be killed."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            pass
    killed = kill(in_group(proc.pid))
    proc.wait()
    return killed


def tail(log: Path, lines: int = 25) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def run_together(commands: list[tuple[list[str], Path, Path]], env: dict[str, str], timeout: float
                 ) -> tuple[float, list[int]]:
    """Runs ``(cmd, cwd, log)`` commands side by side to their end; returns the wall time until the last one ended and
    the ids of processes that had to be killed afterwards.

    Raises:
        RuntimeError: a command failed or did not end within ``timeout`` seconds (every command's group is ended
            first; the message holds the failed command's log's tail).
    """
    start = time.perf_counter()
    procs = [launch(cmd, cwd, env, log) for cmd, cwd, log in commands]
    failed = None
    try:
        deadline = start + timeout
        for proc, (cmd, _, log) in zip(procs, commands):
            try:
                code = proc.wait(max(deadline - time.perf_counter(), 0.1))
            except subprocess.TimeoutExpired:
                failed = f"{shlex.join(cmd)} did not end within {timeout:g} s\n{tail(log)}"
                break
            if code != 0:
                failed = f"{shlex.join(cmd)} exited with {code}\n{tail(log)}"
                break
        wall = time.perf_counter() - start
    finally:
        killed = [p for proc in procs for p in end(proc)]
    if failed is not None:
        raise RuntimeError(failed)
    return wall, killed


# --------------------------------------------------------------------------- the runs' records
def learning_rows(run: Path) -> list[list[str]]:
    """``progress.csv``'s rows without the columns that measure time (their names end in ``_s``)."""
    rows = [line.split(",") for line in (run / "progress.csv").read_text().splitlines()]
    keep = [i for i, name in enumerate(rows[0]) if not name.endswith("_s")]
    return [[row[i] if i < len(row) else "" for i in keep] for row in rows]


def parameters(run: Path) -> dict:
    import torch

    return torch.load(run / "checkpoint.pt", weights_only=True)["model"]


def compare_parameters(a: Path, b: Path) -> tuple[bool, bool, float]:
    """``(close, equal, largest difference)`` of two runs' final parameters: ``close`` to ``RTOL``/``ATOL``."""
    import torch

    pa, pb = parameters(a), parameters(b)
    if pa.keys() != pb.keys():
        return False, False, float("inf")
    equal = all(torch.equal(pa[k], pb[k]) for k in pa)
    close = all(torch.allclose(pa[k].double(), pb[k].double(), rtol=RTOL, atol=ATOL) for k in pa)
    largest = max(((pa[k].double() - pb[k].double()).abs().max().item() for k in pa if pa[k].numel()), default=0.0)
    return close, equal, largest


def env_steps(run: Path) -> int:
    return json.loads((run / "summary.json").read_text())["env_steps"]


def rotated(names: list[str], r: int) -> list[str]:
    return names[r % len(names):] + names[:r % len(names)]


# --------------------------------------------------------------------------- Ray: two nodes
class TwoNodeRay:
    """Two ``ray start --block`` nodes on this host, the head and a node joining it, each with one CPU, its own
    ports and temp dir, token authentication on; ended on exit. ``env`` is what a driver joining it runs with
    (``RAY_ADDRESS``, so that ``--ray-address auto`` finds this cluster and no other of the host)."""

    def __init__(self, folder: Path, timeout: float):
        self.folder, self.timeout = folder, timeout
        self.port = free_port()
        token = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32), "RAY_USAGE_STATS_ENABLED": "0"}
        # Set to 0, it keeps Ray on one node: a second `ray start` refuses to join.
        nodes_env = {k: v for k, v in base_environment().items()
                     if k not in ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "RAY_ADDRESS")}
        self.nodes_env = {**nodes_env, **token}
        self.env = {**base_environment(), **token, "RAY_ADDRESS": f"127.0.0.1:{self.port}"}
        self.procs: list[subprocess.Popen] = []
        self.commands: list[list[str]] = []
        self.start_s: dict[str, float] = {}
        self.killed: list[int] = []

    def command(self, name: str) -> list[str]:
        if name == NODES[0]:
            where = ["--head", "--port", str(self.port), "--include-dashboard", "false", "--ray-client-server-port",
                     str(free_port())]
        else:
            where = ["--address", f"127.0.0.1:{self.port}", "--include-log-monitor", "false"]
        # Two nodes of one host: each listens on ports of its own (its workers' picked by the system), and sizes its
        # object store to what these runs need, not to 30% of the memory that the other node counts too.
        return ["ray", "start", "--block", *where, "--node-ip-address", "127.0.0.1", "--node-name", name,
                "--num-cpus", "1", "--temp-dir", str(self.folder / name), "--dashboard-agent-listen-port",
                str(free_port()), "--min-worker-port", "0", "--max-worker-port", "0", "--object-store-memory",
                str(100 * 2**20), "--disable-usage-stats"]

    def __enter__(self) -> TwoNodeRay:
        try:
            for name in NODES:
                cmd = self.command(name)
                log = self.folder / f"{name}.log"
                start = time.perf_counter()
                proc = launch(cmd, self.folder, self.nodes_env, log)
                self.procs.append(proc)
                self.commands.append(cmd)
                deadline = start + self.timeout
                while "Ray runtime started" not in log.read_text(errors="replace"):
                    if proc.poll() is not None or time.perf_counter() > deadline:
                        raise RuntimeError(f"{shlex.join(cmd)} did not start a node within {self.timeout:g} s "
                                           f"(exit status {proc.poll()})\n{tail(log)}")
                    time.sleep(0.2)
                self.start_s[name] = time.perf_counter() - start
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        """SIGTERM to each node's ``ray start`` (the second node first), which drains the node and ends its
        processes; then SIGKILL to whatever of them, their descendants (the actors' processes among them) and their
        process groups is left."""
        tracked: dict[int, str] = {}
        for proc in self.procs:
            tracked.update(tree(proc.pid))
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                pass
        deadline = time.monotonic() + 10
        while alive(tracked) and time.monotonic() < deadline:
            time.sleep(0.2)
        self.killed += kill(tracked)
        for proc in self.procs:
            self.killed += end(proc, grace=0)
        self.procs = []

    def actors_by_node(self) -> dict[str, dict]:
        """Each node's id and the ids of the ``BatcherActor`` processes it ran, from the node's own log folder (Ray
        writes an actor worker's output to ``worker-<id>-<job>-<pid>.out``, whose first lines name the actor)."""
        out = {}
        for name in NODES:
            logs = self.folder / name / "session_latest" / "logs"
            found = re.search(r"Setting node ID node_id=(\w+)", (logs / "raylet.out").read_text(errors="replace"))
            pids = sorted(int(f.stem.rsplit("-", 1)[1]) for f in logs.glob("worker-*.out")
                          if ":actor_name:BatcherActor" in f.read_text(errors="replace"))
            out[name] = {"node_id": found.group(1) if found else None, "actor_pids": pids}
        return out


def ray_half(folder: Path, budget: int, rounds: int, timeout: float) -> dict:
    """The Ray half: its commands, wall times, the comparison of every round and where the actors ran."""
    processes = "A2C, 1 process, 2 worker processes"
    actors = "A2C, Ray: 2 nodes x 1 actor"
    budget_flags = ["--max-env-steps", str(budget)]
    commands = {processes: [*A2C, *budget_flags, "--n-processes", "2"],
                actors: [*A2C, *budget_flags, "--ray-actors", "2", "--ray-address", "auto"]}
    walls: dict[str, list[float]] = {processes: [], actors: []}
    rows_same, parameters_same, killed = [], [], []
    with TwoNodeRay(folder, timeout) as cluster:
        for r in range(rounds):
            for name in rotated([processes, actors], r):
                logdir = f"{'actors' if name == actors else 'processes'}-{r}"
                wall, k = run_together([([*commands[name], "--logdir", logdir], folder, folder / f"{logdir}.log")],
                                       cluster.env if name == actors else base_environment(), timeout)
                walls[name].append(wall)
                killed += k
            rows = learning_rows(folder / f"actors-{r}")
            rows_same.append(learning_rows(folder / f"processes-{r}") == rows)
            parameters_same.append(compare_parameters(folder / f"processes-{r}", folder / f"actors-{r}")[1])
        nodes = cluster.actors_by_node()
        node_commands = [shlex.join(c).replace(str(folder), "DIR") for c in cluster.commands]
        start_s = dict(cluster.start_s)
    left = [p for node in nodes.values() for p in node["actor_pids"] if is_ray_process(p)]
    # Every run's two actors asked for a CPU each, one more than a node has: one actor per node per run.
    two_nodes = [len(node["actor_pids"]) for node in nodes.values()] == [rounds] * len(NODES)
    detail = (f"progress.csv {'identical' if all(rows_same) else 'different'} ({len(rows) - 1} rows, every column "
              f"but the _s ones), parameters {'equal bit for bit' if all(parameters_same) else 'different'}")
    return {
        "commands": [*node_commands, *(shlex.join([*c, "--logdir", "RUN"]) for c in commands.values())],
        "wall_s": walls, "cluster_start_s": start_s, "same_run": all(rows_same) and all(parameters_same),
        "detail": detail, "nodes": nodes,
        "distributed": two_nodes, "killed_after": killed + cluster.killed, "left_running": left,
        "names": [processes, actors],
    }


# --------------------------------------------------------------------------- torchrun: two nodes
def torchrun_half(folder: Path, budget: int, rounds: int, timeout: float) -> dict:
    """The torchrun half: its commands, wall times, the comparison of every round and each launcher's rank."""
    one = "PPO, 1 process of 8 envs, 2 worker processes"
    ranks = "PPO, torchrun: 2 nodes x 1 rank of 4 envs"
    budget_flags = ["--max-env-steps", str(budget)]
    single = [*PPO, *budget_flags, "--n-envs", "8", "--n-processes", "2"]
    per_rank = [*PPO, *budget_flags, "--n-envs", "4", "--n-processes", "1"]
    env = {**base_environment(), "LOGLEVEL": "INFO"}  # each launcher logs the ranks its rendezvous gave it
    walls: dict[str, list[float]] = {one: [], ranks: []}
    results, launcher_ranks, killed, shown = [], {}, [], {}
    for name in NODES:
        (folder / name).mkdir(exist_ok=True)
    for r in range(rounds):
        for name in rotated([one, ranks], r):
            if name == one:
                cmd = [*single, "--logdir", f"one-{r}"]
                wall, k = run_together([(cmd, folder, folder / f"one-{r}.log")], base_environment(), timeout)
                shown[one] = shlex.join([*single, "--logdir", "RUN"])
            else:
                launcher = ["torchrun", "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                            "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--no-python", *per_rank]
                # --log-dir in the node's folder: without one, each launcher leaves a torchelastic_* folder in the
                # temp folder
                wall, k = run_together([([*launcher[:1], "--log-dir", "torchrun-logs", *launcher[1:], "--logdir",
                                          f"../ranks-{r}"], folder / node, folder / f"ranks-{r}-{node}.log")
                                        for node in NODES], env, timeout)
                shown[ranks] = shlex.join([*launcher, "--logdir", "RUN"])
                for node in NODES:
                    text = (folder / f"ranks-{r}-{node}.log").read_text(errors="replace")
                    launcher_ranks.setdefault(node, []).extend(
                        int(x) for found in re.findall(r"global_ranks=\[([\d, ]*)\]", text)
                        for x in found.split(",") if x.strip())
            walls[name].append(wall)
            killed += k
        close, equal, largest = compare_parameters(folder / f"one-{r}", folder / f"ranks-{r}")
        steps = (env_steps(folder / f"one-{r}"), env_steps(folder / f"ranks-{r}"))
        world = json.loads((folder / f"ranks-{r}" / "summary.json").read_text())["world_size"]
        results.append({"close": close, "equal": equal, "largest": largest, "steps": steps, "world_size": world})
    largest = max(x["largest"] for x in results)
    same = all(x["close"] and x["steps"][0] == x["steps"][1] and x["world_size"] == 2 for x in results)
    # Each launcher ran one rank a round, and each round's two ranks were 0 and 1.
    two_nodes = (all(len(launcher_ranks.get(node, [])) == rounds for node in NODES)
                 and sorted(sum(launcher_ranks.values(), [])) == sorted([0, 1] * rounds))
    return {
        "commands": [shown[one], shown[ranks]], "wall_s": walls, "same_run": same,
        "bit_for_bit": all(x["equal"] for x in results), "largest_difference": largest,
        "detail": (f"parameters to rtol {RTOL:.0e}, atol {ATOL:.0e} (largest difference {largest:.1e}, "
                   f"{'equal' if all(x['equal'] for x in results) else 'not equal'} bit for bit), "
                   f"{results[-1]['steps'][1]:,} env steps each, world_size {results[-1]['world_size']}"),
        "ranks": launcher_ranks, "distributed": two_nodes, "killed_after": killed, "names": [one, ranks],
    }


# --------------------------------------------------------------------------- the report
def seconds(values: list[float]) -> str:
    """One wall time, or the median [min, max] of several rounds'."""
    return f"{values[0]:.1f}" if len(values) == 1 else med_range(values, "{:.1f}")


def report(results: dict[str, dict]) -> None:
    print("\n| configuration | wall time (s) | the same run as the row above |")
    print("|:--|--:|:--|")
    for half in results.values():
        reference, distributed = half["names"]
        print(f"| {reference} | {seconds(half['wall_s'][reference])} | |")
        verdict = "yes" if half["same_run"] else "NO"
        print(f"| {distributed} | {seconds(half['wall_s'][distributed])} | {verdict}: {half['detail']} |")
    if "ray" in results:
        ray = results["ray"]
        starts = ", ".join(f"{k} {v:.1f} s" for k, v in ray["cluster_start_s"].items())
        print(f"\n# Ray nodes started in {starts}; the actors ran on:")
        for name, node in ray["nodes"].items():
            print(f"#   {name} (node {(node['node_id'] or '?')[:12]}): BatcherActor process(es) {node['actor_pids']}")
    if "torchrun" in results:
        ranks = ", ".join(f"{k} ran rank {v}" for k, v in results["torchrun"]["ranks"].items())
        print(f"# torchrun launchers: {ranks}")
    killed = [p for half in results.values() for p in half["killed_after"]]
    left = [p for half in results.values() for p in half.get("left_running", [])]
    print(f"# processes killed after their command or node ended: {killed or 'none'}; left running: {left or 'none'}")


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=int, default=640, help=f"env steps of every run (a multiple of {ITERATION})")
    parser.add_argument("--rounds", type=int, default=1, help="rounds, the order of each half's two runs rotated")
    parser.add_argument("--parts", default="ray,torchrun", help="ray, torchrun or both, comma-separated")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds a node's start or a command may take")
    parser.add_argument("--json", default=None, help="write the results to this file too")
    parser.add_argument("--keep", default=None, help="keep the runs, the nodes' temp dirs and the logs in this folder")
    args = parser.parse_args()
    parts = args.parts.split(",")
    if args.budget <= 0 or args.budget % ITERATION or not set(parts) <= {"ray", "torchrun"} or args.rounds < 1:
        parser.error(f"--budget must be a positive multiple of {ITERATION}, got {args.budget}; --parts ray, torchrun "
                     f"or both, got {args.parts!r}; --rounds at least 1, got {args.rounds}")
    if not Path("/proc/self/task").exists():
        parser.error("this benchmark reads the process tree from /proc (Linux)")
    # A SIGTERM (a test's timeout, a scheduler) ends the nodes and commands as an error does.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    print(f"python benchmarks/multinode.py {shlex.join(sys.argv[1:])}".rstrip())
    print(f"# {machine()}, {time.strftime('%Y-%m-%d')}, load average at the start {load_average()}", flush=True)
    # Short: a Ray node's socket paths live under its temp dir and must fit in 107 bytes.
    folder = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="multinode-", dir="/tmp"))
    folder.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict] = {}
    try:
        if "ray" in parts:
            (folder / "ray").mkdir(exist_ok=True)
            results["ray"] = ray_half(folder / "ray", args.budget, args.rounds, args.timeout)
        if "torchrun" in parts:
            (folder / "torchrun").mkdir(exist_ok=True)
            results["torchrun"] = torchrun_half(folder / "torchrun", args.budget, args.rounds, args.timeout)
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
    print()
    for half in results.values():
        for cmd in half["commands"]:
            print(f"$ {cmd}")
    report(results)
    print(f"# load average at the end {load_average()}")
    if args.json:
        Path(args.json).write_text(json.dumps({"budget": args.budget, "rounds": args.rounds, **results}, indent=1))
    if not all(half["same_run"] and half["distributed"] for half in results.values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
