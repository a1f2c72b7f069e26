"""The rules' vocabulary over one env (numba), and :func:`kernels`: a game's rules compiled for one env at a time.

Each operation is the twin of :mod:`._batched`'s of the same name (see there for the style of the rules): values
are one env's numbers; a grid, a row of slots or a frame is one env's row of an array, written in place and
returned; the operations over slots (``each`` ...) are loops that numba generates for each number of rows and inputs.
:func:`kernels` compiles a copy of each function of a game's ``rules`` module whose globals name these operations
instead, and the small functions that read and write one env's row of the state arrays around them (generated from
the module's ``STATE_KEYS`` and ``ROWS``): the game's functions for the compiled auto-reset step
(:mod:`._jit_driver`). Imported through :func:`rlstruct.envs._jit.jit_module` only (it imports numba).
"""

from __future__ import annotations

import types
from pathlib import Path
from types import ModuleType, SimpleNamespace

import numba
import numpy as np
from numba.core import types as nbtypes
from numba.extending import intrinsic, overload

from rlstruct.envs.minatar import _grid
from rlstruct.envs.minatar._grid import SIZE

__all__ = ["kernels", "OPERATIONS"]

# Every function here and every copy of the rules is inlined into its caller in numba's own IR, down to the loop
# of the compiled step: the rows (views) that pass between them then cost no reference counting and the loop
# compiles as one function (called apart, the same rules ran at a quarter of the speed). The copies of the rules
# are compiled into that loop (cached on disk with it), not cached apart.
_jit = numba.njit(cache=True, nogil=True, boundscheck=False, inline="always")
_rules_jit = numba.njit(nogil=True, boundscheck=False, inline="always")


@intrinsic
def _select(typingctx, c, a, b):
    """``a if c else b`` as one LLVM ``select``: no branch in numba's IR (inlined into a slot loop, a branch there
    makes numba's IR checks warn)."""
    result = nbtypes.unliteral(typingctx.unify_types(nbtypes.unliteral(a), nbtypes.unliteral(b)))
    if not isinstance(c, nbtypes.Boolean) or not isinstance(result, (nbtypes.Number, nbtypes.Boolean)):
        return None

    def codegen(context, builder, signature, args):
        cv, av, bv = args
        return builder.select(cv, context.cast(builder, av, a, result), context.cast(builder, bv, b, result))

    return result(c, a, b), codegen


@_jit
def where(c, a, b):
    return _select(c, a, b)


@_jit
def clamp(x, lo, hi):
    return min(max(x, lo), hi)


@_jit
def fill(u, value, int32=False):
    return value


@_jit
def minimum(a, b):
    return min(a, b)


@_jit
def draw(u, k):
    return u[k]


@_jit
def floor_int(x):
    return np.int64(np.floor(x))


@_jit
def to_float(x):
    return np.float64(x)


@_jit
def cell(grid, y, x):
    return grid[y, x]


@_jit
def put(grid, y, x, value):
    grid[y, x] = value
    return grid


@_jit
def any_cell(grid):
    for y in range(SIZE):
        for x in range(SIZE):
            if grid[y, x]:
                return True
    return False


@_jit
def fill_rows_if_empty(grid, y0, y1, on):
    if on and not any_cell(grid):
        for y in range(y0, y1):
            for x in range(SIZE):
                grid[y, x] = True
    return grid


@_jit
def rows_grid(storage, u, y0, y1):
    for y in range(SIZE):
        for x in range(SIZE):
            storage[y, x] = y0 <= y < y1
    return storage


@_jit
def frame(storage, like, n_channels, c, y, x):
    storage[:] = False
    storage[y, x, c] = True
    return storage


@_jit
def mark(f, c, y, x):
    f[y, x, c] = True
    return f


@_jit
def plane(f, c, grid):
    for y in range(SIZE):
        for x in range(SIZE):
            f[y, x, c] = grid[y, x]
    return f


@_jit
def to_int(x):
    return np.int64(x)


@_jit
def sign(x):
    return 1 if x > 0 else (-1 if x < 0 else 0)


@_jit
def draws(u, start, n):
    return u[start:start + n]


@_jit
def full_row(storage, u, n, value, int32=False):
    storage[:] = value
    return storage


@_jit
def or_slot(row, k, value, on):
    if on:
        row[k] |= value
    return row


@_jit
def shift_cells(row, dx):
    """:func:`._batched.shift_cells` for one env."""
    for y in range(SIZE):
        if dx < 0:
            for x in range(SIZE - 1):
                row[y * SIZE + x] = row[y * SIZE + x + 1]
            row[y * SIZE + SIZE - 1] = False
        else:
            for x in range(SIZE - 1, 0, -1):
                row[y * SIZE + x] = row[y * SIZE + x - 1]
            row[y * SIZE] = False
    return row


@_jit
def move_up(row, entering, on):
    if on:
        for k in range(row.shape[0] - 1):
            row[k] = row[k + 1]
        row[row.shape[0] - 1] = entering
    return row


@_jit
def move_down(row, entering, on):
    if on:
        for k in range(row.shape[0] - 1, 0, -1):
            row[k] = row[k - 1]
        row[0] = entering
    return row


@_jit
def or_all(row):
    out = row[0]
    for k in range(1, row.shape[0]):
        out |= row[k]
    return out


@_jit
def nearest_bit(bits, c):
    column, best = 0, 1000
    for x in range(SIZE):
        if (bits >> x) & 1 != 0:
            distance = abs(x - c) * SIZE + x
            if distance < best:
                column, best = x, distance
    return column


@_jit
def last_with_bit(row, c):
    last = 0
    for k in range(row.shape[0]):
        if (row[k] >> c) & 1 != 0:
            last = k
    return last




@_jit
def slot(row, k):
    return row[k]


@_jit
def count(row, value):
    n = 0
    for k in range(row.shape[0]):
        n += row[k] == value
    return n


@_jit
def nth(row, value, rank):
    for k in range(row.shape[0]):
        if row[k] == value:
            if rank == 0:
                return k
            rank -= 1
    return row.shape[0]


@_jit
def set_slot_if(row, k, on):
    """:func:`._batched.set_slot_if` for one env (``k``, ``on``: one slot)."""
    # No branch (as mark_if): an off slot ors False into its own slot clamped into the row.
    row[min(max(k, 0), row.shape[0] - 1)] |= on
    return row


@_jit
def bar(f, c, y, lo, hi):
    """:func:`._batched.bar` for one env."""
    for x in range(SIZE):
        f[y, x, c] = (x >= lo) & (x < hi)
    return f


@_jit
def mark_if(f, c, y, x, on):
    # No branch (inlined into a slot loop, a branch costs the frame's reference counts at every slot): an off cell
    # ors False into its own cell clamped into the grid (into one cell for all, each write would wait on the last).
    f[min(max(y, 0), SIZE - 1), min(max(x, 0), SIZE - 1), c] |= on
    return f


def each(fn, rows, inputs, values):
    """:func:`._batched.each`, slot by slot (compiled by numba from :func:`_each`)."""
    raise NotImplementedError("compiled by numba only")


def each_if(on, fn, rows, inputs, values):
    """:func:`._batched.each_if`, slot by slot in the envs where ``on`` (compiled by numba from :func:`_each_if`)."""
    raise NotImplementedError("compiled by numba only")


def each_sum(fn, rows, inputs, values, n_sums):
    """:func:`._batched.each_sum`, slot by slot (compiled by numba from :func:`_each_sum`)."""
    raise NotImplementedError("compiled by numba only")


def each_min(fn, rows, inputs, values, n_terms):
    """:func:`._batched.each_min`, slot by slot (compiled by numba from :func:`_each_min`)."""
    raise NotImplementedError("compiled by numba only")


def each_max(fn, rows, inputs, values, n_terms):
    """:func:`._batched.each_max`, slot by slot (compiled by numba from :func:`_each_max`)."""
    raise NotImplementedError("compiled by numba only")


def plane_rows(f, c, rows):
    """:func:`._batched.plane_rows` for one env (compiled by numba from :func:`_plane_rows`)."""
    raise NotImplementedError("compiled by numba only")


def each_mark_if(on, f, fn, inputs, values):
    """:func:`._batched.each_mark_if`: the loop of :func:`each_mark` when ``on`` (compiled by numba from
    :func:`_each_mark_if`)."""
    raise NotImplementedError("compiled by numba only")


def bit_planes(f, c, y, maps, on):
    """:func:`._batched.bit_planes` for row ``y`` (compiled by numba from :func:`_bit_planes`)."""
    raise NotImplementedError("compiled by numba only")


def each_mark(f, fn, inputs, values):
    """:func:`._batched.each_mark`, slot by slot (compiled by numba from :func:`_each_mark`)."""
    raise NotImplementedError("compiled by numba only")


# How _slot_loop folds a term over the slots: its start, and its update from the slot's term o.
_FOLDS = {"sum": ("0", "{t} + {o}"), "min": ("1 << 62", "_select({o} < {t}, {o}, {t})"),
          "max": ("-(1 << 62)", "_select({o} > {t}, {o}, {t})")}


def _slot_loop(fn, n_rows: int, n_inputs: int, n_values: int, *, guard: bool = False, n_sums: int | None = None,
               fold: str = "sum"):
    """The loop over the slots that calls ``fn`` (numba's type of the function passed) with slot ``k`` and slot
    ``k`` of each row and input, writes the rows (and folds the terms: their sum, or their smallest or largest):
    its text depends on the number of each (a tuple's items are read by constant indices). It calls the function
    as a global, which numba inlines (called through the argument, a row passed to it is reference-counted at every
    slot)."""
    args = ["k"] + [f"rows[{j}][k]" for j in range(n_rows)] + [f"inputs[{j}][k]" for j in range(n_inputs)]
    args += [f"values[{j}]" for j in range(n_values)]
    first = "rows[0]" if n_rows else "inputs[0]"
    body = "".join(f"        rows[{j}][k] = o[{j}]\n" for j in range(n_rows))
    head = "def impl(on, fn, rows, inputs, values):\n    if not on:\n        return rows\n" if guard else (
        f"def impl(fn, rows, inputs, values, {'n_sums' if fold == 'sum' else 'n_terms'}):\n" if n_sums is not None else
        "def impl(fn, rows, inputs, values):\n")
    result = "rows"
    if n_sums is not None:
        start, update = _FOLDS[fold]
        head += "".join(f"    t{m} = {start}\n" for m in range(n_sums))
        body += "".join(f"        t{m} = {update.format(t=f't{m}', o=f'o[{n_rows + m}]')}\n" for m in range(n_sums))
        result = f"rows, ({''.join(f't{m}, ' for m in range(n_sums))})"
    loop = f"    for k in range({first}.shape[0]):\n        o = _fn({', '.join(args)})\n"
    text = f"{head}{loop}{body}    return {result}\n"
    scope: dict = {"_fn": fn.dispatcher, "_select": _select}
    exec(compile(text, "<minatar slot loop>", "exec"), scope)  # noqa: S102 - text built above from counts
    return scope["impl"]


@overload(each, inline="always")
def _each(fn, rows, inputs, values):
    return _slot_loop(fn, len(rows), len(inputs), len(values))


@overload(each_if, inline="always")
def _each_if(on, fn, rows, inputs, values):
    return _slot_loop(fn, len(rows), len(inputs), len(values), guard=True)


@overload(each_sum, inline="always", prefer_literal=True)
def _each_sum(fn, rows, inputs, values, n_sums):
    if not isinstance(n_sums, nbtypes.IntegerLiteral):
        raise numba.core.errors.TypingError("each_sum's n_sums must be a constant int")
    return _slot_loop(fn, len(rows), len(inputs), len(values), n_sums=n_sums.literal_value)


def _folded(fn, rows, inputs, values, n_terms, fold: str):
    if not isinstance(n_terms, nbtypes.IntegerLiteral):
        raise numba.core.errors.TypingError(f"each_{fold}'s n_terms must be a constant int")
    return _slot_loop(fn, len(rows), len(inputs), len(values), n_sums=n_terms.literal_value, fold=fold)


@overload(each_min, inline="always", prefer_literal=True)
def _each_min(fn, rows, inputs, values, n_terms):
    return _folded(fn, rows, inputs, values, n_terms, "min")


@overload(each_max, inline="always", prefer_literal=True)
def _each_max(fn, rows, inputs, values, n_terms):
    return _folded(fn, rows, inputs, values, n_terms, "max")


@overload(bit_planes, inline="always")
def _bit_planes(f, c, y, maps, on):
    # Cell by cell, every plane's channel in turn: the frame's bytes in order.
    body = "".join(f"        f[y, x, c + {j}] = on[{j}] & ((maps[{j}] >> x) & 1 != 0)\n" for j in range(len(maps)))
    text = f"def impl(f, c, y, maps, on):\n    for x in range({SIZE}):\n{body}    return f\n"
    scope: dict = {}
    exec(compile(text, "<minatar bit planes>", "exec"), scope)  # noqa: S102 - text built above from a count
    return scope["impl"]


@overload(plane_rows, inline="always")
def _plane_rows(f, c, rows):
    # The rows or-ed by constant indices (a tuple indexed by a loop variable compiles to a switch).
    cells = " | ".join(f"rows[{j}][y * {SIZE} + x]" for j in range(len(rows)))
    text = f"def impl(f, c, rows):\n    for y in range({SIZE}):\n        for x in range({SIZE}):\n" \
           f"            f[y, x, c] = {cells}\n    return f\n"
    scope: dict = {}
    exec(compile(text, "<minatar plane rows>", "exec"), scope)  # noqa: S102 - text built above from a count
    return scope["impl"]


def _mark_loop(fn, n_inputs: int, n_values: int, guard: bool):
    args = "".join(f", inputs[{j}][k]" for j in range(n_inputs))
    args += "".join(f", values[{j}]" for j in range(n_values))
    head = "def impl(on, f, fn, inputs, values):\n    if not on:\n        return f\n" if guard else (
        "def impl(f, fn, inputs, values):\n")
    # The frame is written in place: fn's result, the same array, is not bound again (a name rebound in the loop
    # of an inlined function makes numba warn).
    text = f"{head}    for k in range(inputs[0].shape[0]):\n        _fn(f, k{args})\n    return f\n"
    scope: dict = {"_fn": fn.dispatcher}
    exec(compile(text, "<minatar slot marks>", "exec"), scope)  # noqa: S102 - text built above from a count
    return scope["impl"]


@overload(each_mark, inline="always")
def _each_mark(f, fn, inputs, values):
    return _mark_loop(fn, len(inputs), len(values), False)


@overload(each_mark_if, inline="always")
def _each_mark_if(on, f, fn, inputs, values):
    return _mark_loop(fn, len(inputs), len(values), True)


#: The operations, by the names the rules call them.
OPERATIONS = {
    "where": where, "clamp": clamp, "fill": fill, "draw": draw, "floor_int": floor_int, "to_float": to_float,
    "cell": cell, "put": put, "any_cell": any_cell, "fill_rows_if_empty": fill_rows_if_empty,
    "rows_grid": rows_grid, "frame": frame, "mark": mark, "plane": plane, "to_int": to_int, "sign": sign,
    "draws": draws, "full_row": full_row, "slot": slot, "count": count, "nth": nth, "mark_if": mark_if,
    "each": each, "each_if": each_if, "each_sum": each_sum, "each_mark": each_mark, "minimum": minimum,
    "or_slot": or_slot, "shift_cells": shift_cells, "each_mark_if": each_mark_if,
    "move_up": move_up, "move_down": move_down, "or_all": or_all, "nearest_bit": nearest_bit,
    "last_with_bit": last_with_bit, "bit_planes": bit_planes, "each_min": each_min, "each_max": each_max,
    "set_slot_if": set_slot_if, "plane_rows": plane_rows, "bar": bar,
}

# Row i of the state arrays s, read and written through s by constant indices (never bound to names: numba then
# counts no references to them). A grid's row is passed as a view, which the rules write in place. The last argument
# is passed by name: Python calls a function with more than 30 positional arguments through a list (*args), which
# numba cannot inline, and by name such a call is rewritten into a plain one.
_TEMPLATE = '''
def reset(s, i, u, ramping):
    v = _rules_reset(u, ramping, {rows})
{store}

def step(s, i, action, u, ramping):
    v, reward, terminated = _rules_step({state}, action, u, ramping=ramping)
{store}
    return reward, terminated

def observe(s, i, frame):
    _rules_observe({state}, storage=frame)
'''
_LOADED: dict[str, SimpleNamespace] = {}


def kernels(rules: ModuleType) -> SimpleNamespace:
    """The functions of the game whose ``rules`` module is given, for one env at a time (compiled once a process).

    Returns:
        ``STATE_KEYS`` (the module's) and ``reset(s, i, u, ramping)``, ``step(s, i, action, u, ramping) ->
        (reward, terminated)``, ``observe(s, i, frame)`` over row ``i`` of the state arrays ``s`` (a tuple, in
        ``STATE_KEYS`` order; written in place) and one env's frame ``frame`` (``bool [10, 10, C]``); ``sources``:
        the files whose text is compiled into them; ``functions``: the compiled copy of each function of the module,
        by name (each dispatcher's ``py_func`` runs the module function's own code).

    >>> import numpy as np, torch
    >>> from rlstruct.envs.minatar._breakout import rules
    >>> game = kernels(rules)
    >>> state = rules.GAME.reset(torch.tensor([[0.2], [0.7]], dtype=torch.float64), True)
    >>> s = tuple(state[k].numpy() for k in game.STATE_KEYS)
    >>> game.step(s, 0, 3, np.zeros(0), True), state["ball_x"].tolist(), state["pos"].tolist()
    ((0.0, False), [1, 9], [5, 4])
    >>> game.functions["step"].py_func.__code__ is rules.step.__code__
    True
    """
    loaded = _LOADED.get(rules.__name__)
    if loaded is not None:
        return loaded
    scope = dict(vars(rules))
    scope.update(OPERATIONS)
    functions = {}
    for name, value in vars(rules).items():
        if isinstance(value, types.FunctionType) and value.__module__ == rules.__name__:
            copy = types.FunctionType(value.__code__, scope, name, value.__defaults__)
            copy.__qualname__ = f"{rules.NAME}_{name}"
            scope[name] = functions[name] = _rules_jit(copy)
    keys = rules.STATE_KEYS
    state = ", ".join(f"s[{j}][i]" for j in range(len(keys)))
    store = "\n".join(f"    s[{j}][i] = v[{j}]" for j, k in enumerate(keys) if k not in rules.ROWS)
    rows = ", ".join(f"s[{keys.index(k)}][i]" for k in rules.ROWS)
    text = _TEMPLATE.format(state=state, store=store, rows=rows)
    glue = {"_rules_reset": scope["reset"], "_rules_step": scope["step"], "_rules_observe": scope["observe"]}
    exec(compile(text, f"<{rules.NAME} state rows>", "exec"), glue)  # noqa: S102 - text built above from the keys
    loaded = _LOADED[rules.__name__] = SimpleNamespace(
        STATE_KEYS=keys, sources=(Path(rules.__file__), Path(__file__), Path(_grid.__file__)), functions=functions,
        **{name: _rules_jit(glue[name]) for name in ("reset", "step", "observe")},
    )
    return loaded
