"""Times DictTensor / TemporalDictTensor core operations against the same work on a plain dict of tensors.

Each operation is timed three ways in the same run: rlstruct's structure, a plain ``dict[str, Tensor]``
(plus a ``lengths`` tensor for the temporal case), and tensordict's ``TensorDict`` when tensordict is
installed (it is optional). Each (operation, implementation) runs in a fresh process
(``benchmarks/_fresh.py``), ``--rounds`` times, the order rotated from round to round, so that no
implementation inherits the allocator state another left. Within a process the best of ``--repeats``
runs of about ``--run-seconds`` each (or ``--number`` calls) is kept, in microseconds per call; the table
gives the median and the range over rounds, and the ratio to the plain dict (of medians, with the range
of the same-round ratios). The target for rlstruct is a ratio of at most 1.2. Timings use the process's
CPU time by default (``--clock process``), which other jobs on a shared machine barely disturb;
``--clock wall`` measures elapsed time on a quiet machine.

Operations that cost a microsecond or two (``prepend_key``, ``truncate_key``, the no-op ``to``) only rename
keys or return ``self``: there the ratio shows the fixed cost of building one Python object.

The batch mimics a batcher's output: a CartPole-like observation, reward/done flags, an action and a
recurrent agent state, under the prefixes the batcher uses.

Usage::

    python benchmarks/structures.py              # about four minutes (135 fresh processes)
    python benchmarks/structures.py --clock wall  # on a quiet machine
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time
import timeit
from collections.abc import Callable

import torch
from _fresh import Config, add_arguments, measure_or_rounds, med_range, ratio

from rlstruct import DictTensor, TemporalDictTensor

TARGET = 1.2


def make_variables(leading: tuple[int, ...], prefix: str = "") -> dict[str, torch.Tensor]:
    """A batcher-like set of keys with leading shape ``leading`` (``(B,)`` or ``(B, T)``)."""
    g = torch.Generator().manual_seed(0)
    return {
        f"{prefix}frame": torch.randn(*leading, 4, generator=g),
        f"{prefix}reward": torch.randn(*leading, generator=g),
        f"{prefix}done": torch.zeros(*leading, dtype=torch.bool),
        f"{prefix}initial_state": torch.zeros(*leading, dtype=torch.bool),
        f"{prefix}last_action": torch.randint(0, 2, leading, generator=g),
        "action/action": torch.randint(0, 2, leading, generator=g),
        "agent_state/h": torch.randn(*leading, 32, generator=g),
        "agent_state/c": torch.randn(*leading, 32, generator=g),
    }


# ----------------------------------------------------------------------------------- plain-dict references
def dict_slice(d, a, b):
    return {k: v[a:b] for k, v in d.items()}


def dict_index(d, idx):
    return {k: v[idx] for k, v in d.items()}


def dict_cat(ds):
    return {k: torch.cat([d[k] for d in ds], dim=0) for k in ds[0]}


def dict_to(d, device):
    return {k: v.to(device) for k, v in d.items()}


def dict_copy(d, device):
    return {k: v.to(device).clone() for k, v in d.items()}


def dict_prepend(d, prefix):
    return {prefix + k: v for k, v in d.items()}


def dict_truncate(d, prefix):
    n = len(prefix)
    return {k[n:]: v for k, v in d.items() if k.startswith(prefix)}


# A temporal batch as plain data: (dict of [B, T, ...] tensors, int64 lengths [B]).
def tdict_slice(p, a, b):
    d, lengths = p
    return {k: v[a:b] for k, v in d.items()}, lengths[a:b]


def tdict_index(p, idx):
    d, lengths = p
    return {k: v[idx] for k, v in d.items()}, lengths[idx]


def tdict_temporal_slice(p, a, b):
    d, lengths = p
    return {k: v[:, a:b] for k, v in d.items()}, (lengths - a).clamp(min=0, max=b - a)


def tdict_cat(ps):
    T = max(next(iter(d.values())).shape[1] for d, _ in ps)

    def padded(x):
        if x.shape[1] == T:
            return x
        return torch.cat([x, x.new_zeros((x.shape[0], T - x.shape[1]) + x.shape[2:])], dim=1)

    keys = ps[0][0].keys()
    return (
        {k: torch.cat([padded(d[k]) for d, _ in ps], dim=0) for k in keys},
        torch.cat([lengths for _, lengths in ps]),
    )


def tdict_to(p, device):
    d, lengths = p
    return {k: v.to(device) for k, v in d.items()}, lengths.to(device)


def tdict_copy(p, device):
    d, lengths = p
    return {k: v.to(device).clone() for k, v in d.items()}, lengths.to(device).clone()


def tdict_prepend(p, prefix):
    d, lengths = p
    return {prefix + k: v for k, v in d.items()}, lengths


def tdict_truncate(p, prefix):
    d, lengths = p
    n = len(prefix)
    return {k[n:]: v for k, v in d.items() if k.startswith(prefix)}, lengths


# ------------------------------------------------------------------------------------ tensordict references
# A temporal batch for tensordict: (TensorDict of batch size [B, T], lengths [B]); key prefixes become
# nesting, which is tensordict's idiomatic equivalent of prepend_key / truncate_key.
def td_temporal_cat(ps, pad):
    T = max(td.batch_size[1] for td, _ in ps)
    tds = [td if td.batch_size[1] == T else pad(td, [0, 0, 0, T - td.batch_size[1]]) for td, _ in ps]
    return torch.cat(tds, 0), torch.cat([lengths for _, lengths in ps])


def build_cases(B: int, T: int, tensordict: bool) -> list[tuple[str, str, Callable, Callable, Callable | None]]:
    """``(structure, op, rlstruct_fn, dict_fn, tensordict_fn)`` rows; each fn takes no argument (``tensordict_fn``:
    ``None`` unless ``tensordict``, which imports it)."""
    if tensordict:
        from tensordict import TensorDict
        from tensordict import pad as td_pad

    def _opt(fn: Callable) -> Callable | None:
        return fn if tensordict else None

    cpu = "cpu"
    a, b = B // 8, B // 8 + B // 2
    idx = torch.randperm(B, generator=torch.Generator().manual_seed(1))[: B // 2]
    n_cat = 4

    # DictTensor
    dv = make_variables((B,), prefix="observation/")
    dt = DictTensor(dv)
    dts = [DictTensor(make_variables((B,), prefix="observation/")) for _ in range(n_cat)]
    dvs = [dict(d.variables) for d in dts]
    bare = {k[len("observation/"):] if k.startswith("observation/") else k: v for k, v in dv.items()}
    bare_dt = DictTensor(bare)
    td = tds = bare_td = None
    if tensordict:
        td = TensorDict(dict(dv), batch_size=[B])
        tds = [TensorDict(dict(v), batch_size=[B]) for v in dvs]
        bare_td = TensorDict(dict(bare), batch_size=[B])
        nested_td = TensorDict({"observation": bare_td}, batch_size=[B])

    rows = [
        ("DictTensor", f"slice({a}, {b})", lambda: dt.slice(a, b), lambda: dict_slice(dv, a, b),
         _opt(lambda: td[a:b])),
        ("DictTensor", f"index(LongTensor[{B // 2}])", lambda: dt.index(idx), lambda: dict_index(dv, idx),
         _opt(lambda: td[idx])),
        ("DictTensor", f"cat({n_cat})", lambda: DictTensor.cat(dts), lambda: dict_cat(dvs),
         _opt(lambda: torch.cat(tds, 0))),
        ("DictTensor", "to('cpu') (no-op)", lambda: dt.to(cpu), lambda: dict_to(dv, cpu),
         _opt(lambda: td.to(cpu))),
        ("DictTensor", "to('cpu') + clone", lambda: dt.to(cpu).clone(), lambda: dict_copy(dv, cpu),
         _opt(lambda: td.to(cpu).clone())),
        ("DictTensor", "prepend_key", lambda: bare_dt.prepend_key("observation/"),
         lambda: dict_prepend(bare, "observation/"),
         _opt(lambda: TensorDict({"observation": bare_td}, batch_size=[B]))),
        ("DictTensor", "truncate_key", lambda: dt.truncate_key("observation/"),
         lambda: dict_truncate(dv, "observation/"), _opt(lambda: nested_td["observation"])),
    ]

    # TemporalDictTensor
    g = torch.Generator().manual_seed(2)
    tv = make_variables((B, T), prefix="observation/")
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    tdt = TemporalDictTensor(tv, lengths)
    tp = (tv, lengths)
    short_T = [T, T // 2, T, T // 4]
    tdts = [
        TemporalDictTensor(make_variables((B, t), prefix="observation/"), torch.randint(1, t + 1, (B,), generator=g))
        for t in short_T
    ]
    tps = [(dict(x.variables), x.lengths) for x in tdts]
    tbare = {k[len("observation/"):] if k.startswith("observation/") else k: v for k, v in tv.items()}
    tbare_tdt = TemporalDictTensor(tbare, lengths)
    tbare_p = (tbare, lengths)
    ta, tb = T // 4, T // 4 + T // 2
    ttd = None
    if tensordict:
        ttd = (TensorDict(dict(tv), batch_size=[B, T]), lengths)
        ttds = [(TensorDict(dict(v), batch_size=[B, t]), ln) for (v, ln), t in zip(tps, short_T)]
        tbare_td = TensorDict(dict(tbare), batch_size=[B, T])
        tnested_td = TensorDict({"observation": tbare_td}, batch_size=[B, T])

    rows += [
        ("TemporalDictTensor", f"slice({a}, {b})", lambda: tdt.slice(a, b), lambda: tdict_slice(tp, a, b),
         _opt(lambda: (ttd[0][a:b], ttd[1][a:b]))),
        ("TemporalDictTensor", f"index(LongTensor[{B // 2}])", lambda: tdt.index(idx), lambda: tdict_index(tp, idx),
         _opt(lambda: (ttd[0][idx], ttd[1][idx]))),
        ("TemporalDictTensor", f"temporal_slice({ta}, {tb})", lambda: tdt.temporal_slice(ta, tb),
         lambda: tdict_temporal_slice(tp, ta, tb),
         _opt(lambda: (ttd[0][:, ta:tb], (ttd[1] - ta).clamp(min=0, max=tb - ta)))),
        ("TemporalDictTensor", f"cat({len(short_T)}, padded)", lambda: TemporalDictTensor.cat(tdts),
         lambda: tdict_cat(tps), _opt(lambda: td_temporal_cat(ttds, td_pad))),
        ("TemporalDictTensor", "to('cpu') (no-op)", lambda: tdt.to(cpu), lambda: tdict_to(tp, cpu),
         _opt(lambda: (ttd[0].to(cpu), ttd[1].to(cpu)))),
        ("TemporalDictTensor", "to('cpu') + clone", lambda: tdt.to(cpu).clone(), lambda: tdict_copy(tp, cpu),
         _opt(lambda: (ttd[0].to(cpu).clone(), ttd[1].to(cpu).clone()))),
        ("TemporalDictTensor", "prepend_key", lambda: tbare_tdt.prepend_key("observation/"),
         lambda: tdict_prepend(tbare_p, "observation/"),
         _opt(lambda: (TensorDict({"observation": tbare_td}, batch_size=[B, T]), lengths))),
        ("TemporalDictTensor", "truncate_key", lambda: tdt.truncate_key("observation/"),
         lambda: tdict_truncate(tp, "observation/"), _opt(lambda: (tnested_td["observation"], lengths))),
    ]
    return rows


CLOCKS = {"process": time.process_time, "wall": time.perf_counter}


def best_us(fn: Callable, number: int, clock: Callable[[], float]) -> float:
    return timeit.Timer(fn, timer=clock).timeit(number=number) / number * 1e6


def calls_for(fn: Callable, seconds: float, clock: Callable[[], float]) -> int:
    """How many calls of ``fn`` take about ``seconds`` (at least 10)."""
    t = timeit.Timer(fn, timer=clock).timeit(number=10) / 10
    return max(10, int(seconds / max(t, 1e-9)))


IMPLEMENTATIONS = ("rlstruct", "dict", "tensordict")


def configurations(args: argparse.Namespace) -> dict[str, Config]:
    """Every (operation, implementation), in order (the same in the parent and in each fresh process)."""
    has_td = importlib.util.find_spec("tensordict") is not None
    rows = [(structure, op) for structure, op, *_ in build_cases(args.batch, args.time, tensordict=False)
            if args.only in f"{structure}.{op}"]

    def measure(row: tuple[str, str], impl: int) -> dict:
        torch.set_num_threads(args.threads)
        clock = CLOCKS[args.clock]
        cases = build_cases(args.batch, args.time, tensordict=impl == 2)
        fn = next(c for c in cases if c[:2] == row)[2 + impl]
        fn()  # warm up
        number = args.number or calls_for(fn, args.run_seconds, clock)
        return {"us": min(best_us(fn, number, clock) for _ in range(args.repeats)), "calls": number}

    return {f"{structure}.{op} [{name}]": Config(lambda row=(structure, op), i=i: measure(row, i))
            for structure, op in rows for i, name in enumerate(IMPLEMENTATIONS) if has_td or name != "tensordict"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=10, help="timing runs per process; the best is kept")
    parser.add_argument(
        "--number", type=int, default=None, help="calls per timing run (default: as many as take --run-seconds)"
    )
    parser.add_argument(
        "--run-seconds", type=float, default=0.02, help="length of one timing run when --number is unset"
    )
    parser.add_argument("--batch", type=int, default=256, help="batch size B")
    parser.add_argument("--time", type=int, default=64, help="time steps T of the temporal structures")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--only", default="", help="time only the rows whose 'structure.op' contains this text")
    parser.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="process",
        help="process: this process's CPU time, which other load on a shared machine barely disturbs "
        "(meaningful with --threads 1); wall: elapsed time, for a quiet machine",
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    configs = configurations(args)
    results = measure_or_rounds(__file__, configs, args, argv)
    if results is None:
        return 0
    has_td = any(name.endswith("[tensordict]") for name in results)
    print(
        f"# {args.threads} thread(s), {args.clock} clock, B={args.batch}, T={args.time}, best of {args.repeats} runs "
        f"({'%d calls' % args.number if args.number else '~%g s' % args.run_seconds} each) per process; "
        f"tensordict {'installed' if has_td else 'not installed'}"
    )
    print("\n| structure | op | rlstruct (µs) | dict (µs) | tensordict (µs) | rlstruct / dict | tensordict / dict |")
    print("|:--|:--|--:|--:|--:|:--|:--|")
    misses = []
    rows = dict.fromkeys(name.rsplit(" [", 1)[0] for name in results)
    for row in rows:
        us = {impl: [r["us"] for r in results.get(f"{row} [{impl}]", [])] for impl in IMPLEMENTATIONS}
        if us["rlstruct"] and us["dict"] and statistics.median(us["rlstruct"]) / statistics.median(us["dict"]) > TARGET:
            misses.append(row)
        structure, op = row.split(".", 1)
        cells = [med_range(us[impl], "{:.1f}") for impl in IMPLEMENTATIONS]
        cells += [ratio(us["rlstruct"], us["dict"]) if us["rlstruct"] and us["dict"] else "-",
                  ratio(us["tensordict"], us["dict"]) if us["tensordict"] and us["dict"] else "-"]
        print(f"| {structure} | {op} | " + " | ".join(cells) + " |")
    verdict = "met" if not misses else "missed by " + ", ".join(misses)
    print(f"target rlstruct / dict <= {TARGET} (medians): {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
