"""The rules' vocabulary over batches of envs (torch), and :class:`RulesGame`, a game's rules as a :class:`Game`.

A game's ``rules`` module writes its reset, step and frame once, branch-free, with the operations of this module
(``where``, ``clamp``, ``cell``, ``put``, ...), which it imports: run as they are, its functions step ``B`` envs at
once over ``[B]`` tensors (on any device, under ``torch.compile`` and CUDA graphs). The compiled CPU step runs the
very same functions one env at a time: :mod:`._scalar` compiles copies of them with numba, their globals rebound
to its operations of the same names over one env's numbers and rows. So every operation here has a twin there with
the same meaning, and a rule is written in the style both can run:

* a value is a number per env (``[B]`` here, a scalar there); a row is one array per env: a grid (``bool [B, 10,
  10]`` here, one env's ``[10, 10]`` there) or slots (``[B, K]`` here, ``[K]`` there), which the operations that
  return a row (:func:`put`, :func:`each`, :func:`move_up`, ...) write in place there: the rules always rebind the
  name (``grid = put(grid, ...)``) and never read the row they passed in again;
* work on slots goes through :func:`each` (and :func:`each_if`, :func:`each_sum`, :func:`each_mark`): a function
  of the slot's index and values, which runs once over ``[B, K]`` tensors here and slot by slot there;
* no Python ``and``, ``or``, ``not`` or ``if`` on a value: ``&``, ``|``, ``~`` and :func:`where` (Python's ``abs``
  and the integer operators work on both); an ``if`` on a setting (``ramping``) is fine;
* a frame is built by :func:`frame` and :func:`mark` (:func:`mark_if`, :func:`plane`, :func:`bit_planes`,
  :func:`each_mark`) calls, then returned by the rules' ``observe``.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import torch

from rlstruct.envs.minatar._grid import SIZE

__all__ = ["where", "clamp", "fill", "draw", "floor_int", "to_float", "cell", "put", "any_cell", "fill_rows_if_empty",
           "rows_grid", "to_int", "sign", "draws", "full_row", "slot", "count", "nth", "minimum", "or_slot",
           "move_up", "move_down", "or_all",
           "shift_cells", "each_mark_if", "nearest_bit", "last_with_bit", "bit_planes", "each",
           "each_if", "each_sum", "each_min", "each_max", "set_slot_if", "frame", "mark",
           "mark_if", "each_mark", "plane", "plane_rows", "bar", "RulesGame"]

where = torch.where


def clamp(x: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    """``x`` clamped to ``[lo, hi]``."""
    return x.clamp(lo, hi)


def _dtype(value: int | bool, int32: bool) -> torch.dtype:
    return torch.bool if isinstance(value, bool) else (torch.int32 if int32 else torch.int64)


def fill(u: torch.Tensor, value: int | bool, int32: bool = False) -> torch.Tensor:
    """``value`` for every env of the draws ``u`` (``[B, D]``): ``int64 [B]`` (``int32`` if ``int32``; ``bool``
    for a bool)."""
    return torch.full((u.shape[0],), value, dtype=_dtype(value, int32), device=u.device)


def minimum(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The smaller of ``a`` and ``b``."""
    return torch.minimum(a, b)


def draw(u: torch.Tensor, k: int) -> torch.Tensor:
    """Draw ``k`` of every env: ``u[:, k]``."""
    return u[:, k]


def floor_int(x: torch.Tensor) -> torch.Tensor:
    """``floor(x)`` as ``int64``."""
    return x.floor().to(torch.int64)


def to_float(x: torch.Tensor) -> torch.Tensor:
    """A reward: ``x`` as ``float32``."""
    return x.to(torch.float32)


def _flat_index(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return (y * SIZE + x).unsqueeze(1)


def cell(grid: torch.Tensor, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The cell ``(y, x)`` (``int64 [B]`` each, in the grid) of each env's grid (``bool [B, 10, 10]``)."""
    return grid.reshape(grid.shape[0], SIZE * SIZE).gather(1, _flat_index(y, x)).squeeze(1)


def put(grid: torch.Tensor, y: torch.Tensor, x: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """The grid with cell ``(y, x)`` of each env set to ``value`` (``bool [B]``)."""
    n = grid.shape[0]
    flat = grid.reshape(n, SIZE * SIZE).scatter(1, _flat_index(y, x), value.unsqueeze(1))
    return flat.view(n, SIZE, SIZE)


def any_cell(grid: torch.Tensor) -> torch.Tensor:
    """Whether any cell of each env's grid is set: ``bool [B]``."""
    return grid.reshape(grid.shape[0], SIZE * SIZE).any(1)


def fill_rows_if_empty(grid: torch.Tensor, y0: int, y1: int, on: torch.Tensor) -> torch.Tensor:
    """The grid with rows ``y0`` to ``y1 - 1`` set in the envs where ``on`` (``bool [B]``) and the grid is empty."""
    on = on & ~any_cell(grid)
    # A mask of the rows, not a write into a slice: inductor's vector code for that slice write does not compile.
    rows = torch.arange(SIZE, device=grid.device)
    wall = ((rows >= y0) & (rows < y1)).view(1, SIZE, 1)
    return grid | (on.view(-1, 1, 1) & wall)


def rows_grid(storage: None, u: torch.Tensor, y0: int, y1: int) -> torch.Tensor:
    """A new grid per env of the draws ``u``, rows ``y0`` to ``y1 - 1`` set (``storage``: the compiled step's row
    to write into, ``None`` here)."""
    grid = torch.zeros(u.shape[0], SIZE, SIZE, dtype=torch.bool, device=u.device)
    grid[:, y0:y1] = True
    return grid


def to_int(x: torch.Tensor) -> torch.Tensor:
    """``x`` (``bool``) as ``int64``."""
    return x.to(torch.int64)


def sign(x: torch.Tensor) -> torch.Tensor:
    """The sign of ``x`` (``-1``, ``0`` or ``1``) as ``int64``."""
    return torch.sign(x).to(torch.int64)


def draws(u: torch.Tensor, start: int, n: int) -> torch.Tensor:
    """Draws ``start`` to ``start + n - 1`` of every env, one per slot: ``u[:, start:start + n]``."""
    return u[:, start:start + n]


def full_row(storage: None, u: torch.Tensor, n: int, value: int | bool, int32: bool = False) -> torch.Tensor:
    """``value`` in ``n`` slots per env of the draws ``u``: ``int64 [B, n]`` (``int32`` if ``int32``; ``bool`` for a
    bool; ``storage``: the compiled step's row to write into, ``None`` here)."""
    return torch.full((u.shape[0], n), value, dtype=_dtype(value, int32), device=u.device)


def slot(row: torch.Tensor, k: torch.Tensor | int) -> torch.Tensor:
    """Slot ``k`` (``int64 [B]``, or one slot for every env) of each env's row (``[B, K]``)."""
    if isinstance(k, int):
        return row[:, k]
    return row.gather(1, k.unsqueeze(1)).squeeze(1)


def or_slot(row: torch.Tensor, k: torch.Tensor | int, value: torch.Tensor, on: torch.Tensor | bool) -> torch.Tensor:
    """The row (``[B, K]``) with ``value`` (``[B]``) or-ed into slot ``k`` (``int64 [B]`` or an int) in the envs where
    ``on`` (``bool [B]``, or ``True``)."""
    slots = torch.arange(row.shape[1], device=row.device)
    hit = slots == (k if isinstance(k, int) else k.unsqueeze(1))
    if on is not True:
        hit = hit & on.unsqueeze(1)
    return row | torch.where(hit, value.unsqueeze(1), 0)


def shift_cells(row: torch.Tensor, dx: int) -> torch.Tensor:
    """The row of cells (``bool [B, 100]``, slot ``10 y + x`` the cell ``(y, x)``) moved ``dx`` (``1`` or ``-1``)
    columns, the cells entering clear."""
    grid = row.view(row.shape[0], SIZE, SIZE)
    blank = torch.zeros_like(grid[:, :, :1])
    moved = torch.cat([grid[:, :, 1:], blank], 2) if dx < 0 else torch.cat([blank, grid[:, :, :-1]], 2)
    return moved.reshape(row.shape[0], SIZE * SIZE)


def _entering(row: torch.Tensor, value: torch.Tensor | int) -> torch.Tensor:
    if isinstance(value, int):
        return torch.full_like(row[:, :1], value)
    return value.unsqueeze(1)


def move_up(row: torch.Tensor, entering: torch.Tensor | int, on: torch.Tensor | bool) -> torch.Tensor:
    """The row (``[B, K]``) with every slot given the next one's value and the last one ``entering``, in the envs
    where ``on`` (``bool [B]``, or ``True``)."""
    moved = torch.cat([row[:, 1:], _entering(row, entering)], 1)
    return moved if on is True else torch.where(on.unsqueeze(1), moved, row)


def move_down(row: torch.Tensor, entering: torch.Tensor | int, on: torch.Tensor | bool) -> torch.Tensor:
    """The row (``[B, K]``) with every slot given the previous one's value and the first one ``entering``, in the
    envs where ``on`` (``bool [B]``, or ``True``)."""
    moved = torch.cat([_entering(row, entering), row[:, :-1]], 1)
    return moved if on is True else torch.where(on.unsqueeze(1), moved, row)


def or_all(row: torch.Tensor) -> torch.Tensor:
    """The bitwise or of each env's slots (``[B, K]`` integers): ``[B]``."""
    out = row[:, 0]
    for k in range(1, row.shape[1]):
        out = out | row[:, k]
    return out


def nearest_bit(bits: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """The set bit of each env's 10-bit ``bits`` nearest to bit ``c`` (``[B]`` each), the lower one of a tie; ``0``
    where none is set."""
    columns = torch.arange(SIZE, device=bits.device, dtype=bits.dtype)
    occupied = (bits.unsqueeze(1) >> columns) & 1 != 0
    distance = (columns - c.unsqueeze(1)).abs() * SIZE + columns
    return torch.where(occupied, distance, 1000).argmin(1).to(bits.dtype)


def last_with_bit(row: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """The last slot of each env's row (``[B, K]`` integers) whose value has bit ``c`` (``[B]``) set; ``0`` where
    none has."""
    slots = torch.arange(row.shape[1], device=row.device, dtype=row.dtype)
    return torch.where((row >> c.unsqueeze(1)) & 1 != 0, slots, -1).argmax(1)


def count(row: torch.Tensor, value: int | bool) -> torch.Tensor:
    """How many slots of each env's row (``[B, K]``) hold ``value``: ``int64 [B]``."""
    return (row == value).sum(1)


def nth(row: torch.Tensor, value: int | bool, rank: torch.Tensor) -> torch.Tensor:
    """The slot of each env's row (``[B, K]``) that is the ``rank``-th (``int64 [B]``, from 0) to hold ``value``;
    ``K`` where there is none."""
    return ((row == value).cumsum(1) <= rank.unsqueeze(1)).sum(1)


# Constant index tensors (the slots' indices, the cells of every bit row), built once per shape on the CPU; on
# another device built at every call (one built while a CUDA graph is captured would hold what the graph's replay
# writes, not its values).
_CONSTANTS: dict[tuple, torch.Tensor] = {}


def _constant(key: tuple, device: torch.device, build: Callable[[], torch.Tensor]) -> torch.Tensor:
    if device.type != "cpu":
        return build()
    value = _CONSTANTS.get(key)
    if value is None:
        value = _CONSTANTS[key] = build()
    return value


def _slots(n: int, device: torch.device) -> torch.Tensor:
    return _constant(("slots", n), device, lambda: torch.arange(n, device=device))


def _per_slot(value):
    return value.unsqueeze(1) if isinstance(value, torch.Tensor) else value


def each(fn: Callable, rows: tuple, inputs: tuple, values: tuple) -> tuple:
    """``fn`` slot by slot: ``fn(k, *rows, *inputs, *values)`` returns the new ``rows`` of slot ``k``.

    ``rows`` (``[B, K]`` each: the state's rows, which the compiled step writes in place; ``None`` where ``fn``
    ignores them) and ``inputs`` (``[B, K]``, read only) are given slot by slot, the ``values`` (``[B]`` or
    numbers) to every slot of their env. Here ``fn`` runs once over ``[B, K]`` tensors, ``k`` the slots
    ``int64 [K]``.
    """
    like = next(r for r in (*rows, *inputs) if r is not None)
    return fn(_slots(like.shape[1], like.device), *rows, *inputs, *(_per_slot(v) for v in values))


def each_sum(fn: Callable, rows: tuple, inputs: tuple, values: tuple, n_sums: int) -> tuple[tuple, tuple]:
    """:func:`each` whose ``fn`` also returns ``n_sums`` terms after the rows: ``(rows, sums)``, each sum the
    total of its term over the slots (``int64 [B]``; a ``bool`` term counts its true slots)."""
    out = each(fn, rows, inputs, values)
    n = len(out) - n_sums
    return out[:n], tuple(t.sum(1) if t.dtype == torch.bool else t.sum(1, dtype=t.dtype) for t in out[n:])


def each_min(fn: Callable, rows: tuple, inputs: tuple, values: tuple, n_terms: int) -> tuple[tuple, tuple]:
    """:func:`each` whose ``fn`` also returns ``n_terms`` integer terms after the rows: ``(rows, mins)``, each the
    smallest of its term over the slots (``[B]``)."""
    out = each(fn, rows, inputs, values)
    n = len(out) - n_terms
    # The largest of the negated terms: on the CPU torch's amin over int64 takes 14 times amax's time.
    return out[:n], tuple(-(-t).amax(1) for t in out[n:])


def each_max(fn: Callable, rows: tuple, inputs: tuple, values: tuple, n_terms: int) -> tuple[tuple, tuple]:
    """:func:`each_min` with the largest of each term over the slots."""
    out = each(fn, rows, inputs, values)
    n = len(out) - n_terms
    return out[:n], tuple(t.amax(1) for t in out[n:])


def set_slot_if(row: torch.Tensor, k: torch.Tensor, on: torch.Tensor) -> torch.Tensor:
    """The row (``bool [B, K]``) with slot ``k`` set where ``on`` (``int64`` and ``bool``, ``[B]``, or ``[B, J]``:
    ``J`` slots per env, as :func:`each_mark` gives them)."""
    n = row.shape[1]
    k, on = (k, on) if k.dim() == 2 else (k.unsqueeze(1), on.unsqueeze(1))
    index = torch.where(on, k, n)
    hit = torch.zeros(row.shape[0], n + 1, dtype=torch.bool, device=row.device).scatter_(1, index, True)
    return row | hit[:, :n]


def each_if(on: torch.Tensor, fn: Callable, rows: tuple, inputs: tuple, values: tuple) -> tuple:
    """:func:`each` in the envs where ``on`` (``bool [B]``); the rows of the others unchanged."""
    new = each(fn, rows, inputs, values)
    return tuple(torch.where(on.unsqueeze(1), a, b) for a, b in zip(new, rows, strict=True))


class _Frame:
    """Frames being built: ``flat`` (``bool [B, 100, C]``), every write an ``index_fill_`` into it at ``base``
    (``[B, 1]``, each env's first element) plus a cell's offset; ``first`` (``[B, 1]``), the player's element, where
    a masked write goes (it is set already)."""

    def __init__(self, flat: torch.Tensor, base: torch.Tensor):
        self.flat, self.base, self.first = flat, base, base
        # (channel, bits [B, 10], on) of bit_planes, written together by finish.
        self.bit_rows: list[tuple[int, torch.Tensor, torch.Tensor | bool]] = []

    def finish(self) -> torch.Tensor:
        """The frames ``bool [B, 10, 10, C]``."""
        n, n_channels = self.flat.shape[0], self.flat.shape[2]
        grid = self.flat.view(n, SIZE, SIZE, n_channels)
        if self.bit_rows:
            # One lookup for every row of every plane: [B, row, plane] bits -> [B, row, column, plane] cells.
            planes = torch.stack([b if on is True else torch.where(on, b, 0) for _, b, on in self.bit_rows], -1)
            cells = _bit_cells(planes.device).index_select(0, planes.reshape(-1).long())
            cells = cells.view(n, SIZE, len(self.bit_rows), SIZE).permute(0, 1, 3, 2)
            channels = [c for c, _, _ in self.bit_rows]
            if channels == list(range(channels[0], channels[0] + len(channels))):
                grid[..., channels[0]:channels[0] + len(channels)] = cells  # a view: no index tensor
            else:
                grid[..., channels] = cells
        return grid


def _bit_cells(device: torch.device) -> torch.Tensor:
    """``bool [1024, 10]``: the cells of every 10-bit row."""
    return _constant(("bit cells",), device, lambda: (torch.arange(1024, device=device).unsqueeze(1)
                                                      >> torch.arange(SIZE, device=device)) & 1 != 0)


def _offset(f: _Frame, c, y, x) -> torch.Tensor:
    n = f.flat.shape[0]
    return f.base + ((y * SIZE + x) * f.flat.shape[2] + c).reshape(n, -1)


def frame(storage: None, like: torch.Tensor, n_channels: int, c: int, y: torch.Tensor, x: torch.Tensor) -> _Frame:
    """Frames of ``C = n_channels`` channels for the envs of ``like`` (``[B]``), cell ``(y, x)`` of channel ``c``
    set (the player's), the others clear (``storage``: the compiled step's frame row, ``None`` here)."""
    n = like.shape[0]
    flat = torch.zeros(n, SIZE * SIZE, n_channels, dtype=torch.bool, device=like.device)
    f = _Frame(flat, torch.arange(n, device=like.device).unsqueeze(1) * (SIZE * SIZE * n_channels))
    f.first = _offset(f, c, y, x)
    flat.view(-1).index_fill_(0, f.first.reshape(-1), True)
    return f


def mark(f: _Frame, c, y, x) -> _Frame:
    """The frames with cell ``(y, x)`` of channel ``c`` set (``int64 [B]`` or numbers; ``[B, K]``: ``K`` cells)."""
    f.flat.view(-1).index_fill_(0, _offset(f, c, y, x).reshape(-1), True)
    return f


def mark_if(f: _Frame, c, y, x, on: torch.Tensor) -> _Frame:
    """:func:`mark` where ``on`` (the shape of the cells)."""
    n = f.flat.shape[0]
    index = torch.where(on.reshape(n, -1), _offset(f, c, y, x), f.first)
    f.flat.view(-1).index_fill_(0, index.reshape(-1), True)
    return f


def bit_planes(f: _Frame, c: int, y: torch.Tensor, maps: tuple, on: tuple) -> _Frame:
    """The frames with row ``y`` of channels ``c``, ``c + 1``, ... the cells of ``maps`` (10-bit integers, bit ``x``
    the cell of column ``x``) where ``on`` (one each: ``bool``, or ``True``), clear elsewhere. Here, called from
    :func:`each_mark` over every row: ``y`` the rows in order, each map ``[B, 10]``; once a frame, after the
    frame's :func:`mark` calls on other channels."""
    f.bit_rows.extend((c + j, bits, o) for j, (bits, o) in enumerate(zip(maps, on, strict=True)))
    return f


def each_mark(f: _Frame, fn: Callable, inputs: tuple, values: tuple) -> _Frame:
    """``fn(f, k, *inputs, *values)`` slot by slot (``k`` the slot, ``inputs`` ``[B, K]`` each, ``values`` ``[B]``
    given to every slot): the frames it marks. Here ``fn`` runs once, ``k`` the slots ``int64 [K]``."""
    return fn(f, _slots(inputs[0].shape[1], inputs[0].device), *inputs, *(_per_slot(v) for v in values))


def each_mark_if(on: torch.Tensor, f, fn: Callable, inputs: tuple, values: tuple):
    """:func:`each_mark`, skipped in the envs where ``on`` (``bool [B]``) is false, where ``fn`` must mark nothing
    (the compiled step skips its loop there; here ``fn`` runs for every env)."""
    return each_mark(f, fn, inputs, values)


def plane(f: _Frame, c: int, grid: torch.Tensor) -> _Frame:
    """The frames with channel ``c`` the grid ``grid`` (``bool [B, 10, 10]``)."""
    f.flat[:, :, c] = grid.reshape(grid.shape[0], SIZE * SIZE)
    return f


def plane_rows(f: _Frame, c: int, rows: tuple) -> _Frame:
    """The frames with channel ``c`` the cells set in any of ``rows`` (``bool [B, 100]`` each, slot ``10 y + x`` the
    cell ``(y, x)``)."""
    cells = rows[0]
    for row in rows[1:]:
        cells = cells | row
    f.flat[:, :, c] = cells
    return f


def bar(f: _Frame, c: int, y: int, lo, hi) -> _Frame:
    """The frames with row ``y`` of channel ``c`` set at the columns ``lo <= x < hi`` (``int64 [B]`` or ints), clear
    at the others."""
    columns = _slots(SIZE, f.flat.device)
    f.flat[:, y * SIZE:(y + 1) * SIZE, c] = (columns >= _per_slot(lo)) & (columns < _per_slot(hi))
    return f


class RulesGame:
    """A game's ``rules`` module as a :class:`~rlstruct.envs.minatar._env.Game` over a dict of ``[B, ...]`` tensors.

    The module declares ``NAME``, ``CHANNELS``, ``N_STEP_DRAWS``, ``N_RESET_DRAWS``, ``STATE_KEYS`` (its state, in
    the order of its functions' arguments), ``ROWS`` (those of them that are a row per env: grids ``[B, 10, 10]``
    and slots ``[B, K]``, which the compiled step writes in place) and the functions

    * ``reset(u, ramping, *rows) -> state``: the state (a tuple in ``STATE_KEYS`` order) from the reset draws,
      ``rows`` the storage of the ``ROWS`` (``None`` here);
    * ``step(*state, action, u, ramping) -> (state, reward, terminated)``;
    * ``observe(*state, storage) -> frame``.

    Args:
        rules: the module.
    """

    def __init__(self, rules: ModuleType):
        self.rules = rules
        self.name: str = rules.NAME
        self.channels: tuple[str, ...] = rules.CHANNELS
        self.n_step_draws: int = rules.N_STEP_DRAWS
        self.n_reset_draws: int = rules.N_RESET_DRAWS
        self.keys: tuple[str, ...] = rules.STATE_KEYS
        self._reset: Callable = rules.reset
        self._step: Callable = rules.step
        self._observe: Callable = rules.observe
        self._no_rows = (None,) * len(rules.ROWS)
        # The keys whose initial tensor is one an earlier key returned too (Breakout's last_x is its ball_x): the
        # compiled step writes the state's tensors in place, so each key gets its own. Which keys share is the rules'
        # code, not the draws': found once here, on one env, so that reset asks no tensor its id (dynamo before torch
        # 2.13 cannot trace id() of a tensor made inside the graph).
        probe = self._reset(torch.zeros(1, self.n_reset_draws, dtype=torch.float64), False, *self._no_rows)
        self._shared: tuple[bool, ...] = tuple(any(v is w for w in probe[:i]) for i, v in enumerate(probe))

    def reset(self, u: torch.Tensor, ramping: bool) -> dict[str, torch.Tensor]:
        """The initial states of ``B`` envs from the draws ``u`` (``float64 [B, n_reset_draws]``)."""
        values = self._reset(u, ramping, *self._no_rows)
        return {k: v.clone() if shared else v for k, v, shared in zip(self.keys, values, self._shared, strict=True)}

    def step(
        self, state: dict[str, torch.Tensor], action: torch.Tensor, u: torch.Tensor, ramping: bool
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
        """One step of every env with the full-set actions ``action`` (``int64 [B]``) and the draws ``u``
        (``float64 [B, n_step_draws]``): ``(state, reward float32 [B], terminated bool [B])``."""
        values, reward, terminated = self._step(*(state[k] for k in self.keys), action, u, ramping)
        return dict(zip(self.keys, values, strict=True)), reward, terminated

    def observe(self, state: dict[str, torch.Tensor]) -> torch.Tensor:
        """The frames ``bool [B, 10, 10, C]`` (minatar's ``state()``)."""
        return self._observe(*(state[k] for k in self.keys), None).finish()
