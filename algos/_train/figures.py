"""What ``rlstruct compare`` and ``rlstruct report`` draw and print from a comparison's result
(:func:`~rlstruct.algos._train.compare.compare_groups`): the learning curves over seeds (:func:`plot_curves`, PNG or
SVG) and the table a paper pastes (:func:`render_table`, Markdown or a LaTeX booktabs body); and the learning curve
of one run, that its folder holds (:func:`learning_curve_png`).

Every word that comes from data (a group's label, an env id, a run's folder) is escaped for where it lands: LaTeX
(:func:`latex_text`), Markdown (:func:`markdown_text`), matplotlib's text (:func:`~rlstruct._plot.plain_text`); the
commands a table is made of are added around the escaped words, never kept from them."""

from __future__ import annotations

import io
import logging
import math
import re
import threading
from pathlib import Path
from typing import Any

from rlstruct._plot import PLAIN_TEXT, plain_text, pyplot
from rlstruct.errors import MissingDependencyError

__all__ = ["FRACTION_LABEL", "TABLE_FORMATS", "format_interval", "latex_text", "learning_curve_png", "markdown_text",
           "plot_curves", "render_table", "table_rows"]

log = logging.getLogger(__name__)

#: the formats of ``--table``
TABLE_FORMATS = ("markdown", "latex")
_NAMES = {"iqm": "IQM", "mean": "mean", "median": "median", "optimality_gap": "optimality gap"}
#: the x axis of curves pooled over envs of other budgets
FRACTION_LABEL = "fraction of the env-step budget"
#: LaTeX's special characters and what prints each as itself
_LATEX = {"\\": "\\textbackslash{}", "{": "\\{", "}": "\\}", "$": "\\$", "&": "\\&", "#": "\\#", "%": "\\%",
          "_": "\\_", "~": "\\textasciitilde{}", "^": "\\textasciicircum{}", "<": "\\textless{}",
          ">": "\\textgreater{}", "|": "\\textbar{}"}
#: control characters and line breaks (a newline is a paragraph in a LaTeX cell, ends a Markdown row; a reader of
#: the output splits lines at U+2028 too), which the tables print as spaces: a regex character range
_BREAKS = "\\x00-\\x1f\\x7f-\\x9f\\u2028\\u2029"
_LATEX_SPECIAL = re.compile("[" + re.escape("".join(_LATEX)) + _BREAKS + "]")
#: Markdown's inline punctuation, escaped by a backslash (CommonMark: any ASCII punctuation may be)
_MARKDOWN_SPECIAL = re.compile(r"([\\`*_\[\]|~])")


def latex_text(text: str) -> str:
    """``text`` as LaTeX prints it, character for character: its special characters escaped (:data:`_LATEX`), its
    control characters as spaces, in one pass (no escape's own backslash or brace is escaped again), so that no
    command or group can come from it.

    >>> print(latex_text("x\\\\input{/etc/hostname} 50% a_b"))
    x\\textbackslash{}input\\{/etc/hostname\\} 50\\% a\\_b
    """
    return _LATEX_SPECIAL.sub(lambda m: _LATEX.get(m.group(), " "), text)


def markdown_text(text: str) -> str:
    """``text`` as a Markdown table cell shows it: HTML's ``&``, ``<`` and ``>`` as entities, Markdown's inline
    punctuation (``|`` that would end the cell among it) escaped by a backslash, control characters and line breaks
    as spaces.

    >>> print(markdown_text("a|b <script>"))
    a\\|b &lt;script&gt;
    """
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _MARKDOWN_SPECIAL.sub(r"\\\1", re.sub(f"[{_BREAKS}]", " ", text))


def plot_curves(result: dict[str, Any], path: str | Path, *, mean: bool = False) -> Path:
    """Draws each group's curve of ``result["curves"]`` into ``path`` (PNG or SVG by its suffix): the IQM of its
    runs' evaluation returns at each env step, the interval shaded, a reference group dashed; with ``mean``, the
    mean dotted beside it. The legend says how many runs each line holds and whether they were interpolated onto
    a common grid (their evaluations at other steps). Where a group is pooled over envs of other budgets, every
    curve is drawn against the fraction of its env-step budget (:data:`FRACTION_LABEL`).

    Raises:
        ValueError: no group has a curve (a run logged no evaluation), or the suffix is not .png or .svg.
        MissingDependencyError: matplotlib is not installed.
    """
    path = Path(path)
    if path.suffix.lower() not in (".png", ".svg"):
        raise ValueError(f"--curves must name a .png or .svg file, got {str(path)!r}; pass e.g. curves.png")
    curves = result.get("curves", {})
    missing = {label: why for label, why in result.get("no_curves", {}).items() if label in result["groups"]}
    if not curves or missing:
        raise ValueError(f"--curves needs every group's runs to have evaluated over a shared range of env steps, "
                         f"got for {'; '.join(f'{k}: {v}' for k, v in missing.items())}; compare groups whose runs "
                         "evaluated (--eval-every) over one budget")
    plt = pyplot()
    pooled = any(curve.get("env_steps") is None for curve in curves.values())
    with plt.rc_context(PLAIN_TEXT):  # the figure's words as they are, whatever the user's rc says
        fig, ax = plt.subplots(figsize=(6.4, 4))
        try:
            for label, curve in curves.items():
                reference = result["groups"][label].get("reference")
                how = f"IQM of {curve['n_runs']} runs" + (", interpolated" if curve["interpolated"] else "")
                x = curve["budget_fraction"] if pooled else curve["env_steps"]
                (line,) = ax.plot(x, curve["iqm"], label=plain_text(f"{label} ({how})"),
                                  linestyle="--" if reference else "-")
                low = [float("nan") if v is None else v for v in curve["low"]]
                high = [float("nan") if v is None else v for v in curve["high"]]
                ax.fill_between(x, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
                if mean:
                    ax.plot(x, curve["mean"], color=line.get_color(), linestyle=":",
                            label=plain_text(f"{label} (mean)"))
            ax.set_xlabel(FRACTION_LABEL if pooled else "env steps")
            ax.set_ylabel("normalised score" if result.get("normalized") else "evaluation return")
            ax.set_title(f"{result['confidence']:.0%} stratified bootstrap intervals over runs")
            ax.grid(alpha=0.3)
            ax.legend(fontsize="small")
            fig.tight_layout()
            fig.savefig(path, dpi=100)
        finally:
            plt.close(fig)
    return path


def format_interval(d: dict[str, float | None] | None, *, latex: bool = False) -> str:
    """``"4.50 [3.00, 6.25]"``: an estimate and its interval (``{"value", "low", "high"}``) as the tables print them;
    the value alone where there is no interval, ``"-"`` for none; in LaTeX the interval in ``\\scriptsize``."""
    if d is None:
        return "-"
    value = f"{d['value']:.2f}"
    if d["low"] is None or d["high"] is None:
        return value
    if latex:
        return f"{value} {{\\scriptsize [{d['low']:.2f}, {d['high']:.2f}]}}"
    return f"{value} [{d['low']:.2f}, {d['high']:.2f}]"


def table_rows(result: dict[str, Any]) -> tuple[list[str], list[list[Any]], list[str], list[list[Any]]]:
    """The group table's heads and rows, then the per-env table's: cells as strings or interval dicts."""
    normalized = result.get("normalized", False)
    names = ["iqm", "mean", "median", *(["optimality_gap"] if normalized else [])]
    curves = result.get("curves", {})
    heads = ["group", "runs", *(_NAMES[n] for n in names), *(["AUC (IQM)"] if curves else [])]
    rows = [[label, str(len(g["runs"])), *(g[n] for n in names), *([curves.get(label, {}).get("auc")] if curves
                                                                    else [])]
            for label, g in result["groups"].items()]
    env_heads = ["env", "group", "runs", "IQM", "mean", "median"]
    env_rows = [[env, label, str(e["runs"]), e["iqm"], e["mean"], e["median"]]
                for label, g in result["groups"].items() for env, e in g["envs"].items()]
    env_rows.sort(key=lambda r: r[0])
    return heads, rows, env_heads, env_rows


def render_table(result: dict[str, Any], fmt: str) -> str:
    """The per-group table (its runs, the aggregates with their intervals, the AUC where there are curves), then the
    per-env table of raw returns, as Markdown (two pipe tables) or LaTeX (two booktabs ``tabular`` bodies, each
    from ``\\begin{tabular}`` to ``\\end{tabular}``; needs ``\\usepackage{booktabs}``). Every text cell (a label,
    an env id) is escaped for the format (:func:`latex_text`, :func:`markdown_text`); the intervals' numbers are
    formatted here, and their ``\\scriptsize`` added around them.

    Raises:
        ValueError: ``fmt`` is neither ``"markdown"`` nor ``"latex"``.
    """
    if fmt not in TABLE_FORMATS:
        raise ValueError(f"--table must be one of {', '.join(TABLE_FORMATS)}, got {fmt!r}")
    latex = fmt == "latex"
    level = f"{result['confidence']:.0%}"
    note = (f"{level} stratified bootstrap intervals in brackets"
            + ("; scores normalised per env: (return - random) / (reference - random)" if result.get("normalized")
               else ""))
    out = []
    for heads, rows in (table_rows(result)[:2], table_rows(result)[2:]):
        if heads[0] == "env":
            note = f"{level} stratified bootstrap intervals in brackets; returns per env, not normalised"
        escape = latex_text if latex else markdown_text
        cells = [[escape(c) if isinstance(c, str) else format_interval(c, latex=latex) for c in row] for row in rows]
        if latex:
            spec = "l" * (2 if heads[0] == "env" else 1) + "r" * (len(heads) - (2 if heads[0] == "env" else 1))
            out += [f"\\begin{{tabular}}{{{spec}}}", "\\toprule", " & ".join(map(latex_text, heads)) + " \\\\",
                    "\\midrule"]
            out += [" & ".join(row) + " \\\\" for row in cells]
            out += ["\\bottomrule", "\\end{tabular}", f"% {note}", ""]
        else:
            align = ["---" if i < (2 if heads[0] == "env" else 1) else "--:" for i in range(len(heads))]
            out += ["| " + " | ".join(map(markdown_text, heads)) + " |", "|" + "|".join(align) + "|"]
            out += ["| " + " | ".join(row) + " |" for row in cells]
            out += ["", f"_{note}._", ""]
    return "\n".join(out).rstrip() + "\n"


def learning_curve_png(history: list[dict[str, Any]], title: str) -> bytes | None:
    """The PNG of one run's evaluation and training returns (its ``history``, the rows of ``progress.csv``) against
    env steps and wall clock, or ``None`` when matplotlib is missing (a warning says so).

    The figure is drawn on one :class:`~matplotlib.figure.Figure` kept for the process (:class:`_CurveFigure`), its
    lines, legend and title replaced at each call: building the two axes and their ticks for each run costs about a
    third of the 0.2 CPU s that every run pays at its end, and the PNG is the same, pixel for pixel. It is made again
    when the user's matplotlib settings (``rcParams``) changed since it was made, so that the curve follows them as a
    new figure would."""
    try:
        pyplot()  # matplotlib, on the Agg backend
    except MissingDependencyError:
        log.warning("matplotlib is not installed (pip install 'rlstruct[plot]'); no learning-curve plot")
        return None
    train = [r for r in history if isinstance(r.get("train/episode_return"), float)
             and math.isfinite(r["train/episode_return"])]
    evals = [r for r in history if "eval/return" in r]
    with _CURVE.lock:
        return _CURVE.draw(train, evals, title)


class _CurveFigure:
    """The learning curve's figure, kept between runs of one process and drawn by one thread at a time (``lock``)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._figure: Any = None
        self._rc: dict[str, Any] | None = None

    def _axes(self, *, new: bool) -> Any:
        """The figure's two axes, made (again) when ``new``, when there is none or when the rcParams changed since."""
        import matplotlib
        from matplotlib.figure import Figure

        rc = dict(matplotlib.rcParams)
        if new or self._figure is None or rc != self._rc:
            # Margins fixed in inches (room for six-digit tick labels, the axis labels and the title) rather than a
            # layout engine: constrained layout draws the figure twice, doubling the cost every run pays at its end.
            self._figure = Figure(figsize=(11, 4))
            self._figure.subplots(1, 2)
            self._figure.subplots_adjust(left=0.9 / 11, right=1 - 0.2 / 11, bottom=0.5 / 4, top=1 - 0.45 / 4,
                                         wspace=0.22)
            self._rc = rc
        return self._figure.axes

    def draw(self, train: list[dict[str, Any]], evals: list[dict[str, Any]], title: str) -> bytes:
        """The PNG of the rows ``train`` (training episodes' returns) and ``evals`` (evaluations) under ``title``."""
        from matplotlib import rc_context

        with rc_context(PLAIN_TEXT):  # the title names the run's env, as its config gives it
            # Without a row to draw, the axes keep their new limits: a figure of its own (a run of no iteration).
            axes = self._axes(new=not train and not evals)
            for ax, x in zip(axes, ("env_steps", "wall_time_s")):
                if ax.lines:  # an earlier run's: its lines, its legend and its limits go
                    for line in list(ax.lines):
                        line.remove()
                    ax.relim()
                if ax.get_legend() is not None:
                    ax.get_legend().remove()
                if train:
                    ax.plot([r[x] for r in train], [r["train/episode_return"] for r in train], color="tab:blue",
                            alpha=0.4, lw=1, label="training episodes")
                if evals:
                    ax.plot([r[x] for r in evals], [r["eval/return"] for r in evals], "o-", color="tab:red", ms=3,
                            label="evaluation (mean)")
                ax.set_xlabel("env steps" if x == "env_steps" else "wall clock (s)")
                ax.set_ylabel("return")
                ax.grid(alpha=0.3)
            if train or evals:  # a run that ended before its first episode or evaluation has nothing to name
                axes[0].legend(loc="lower right")
            axes[0].figure.suptitle(plain_text(title))
            png = io.BytesIO()
            axes[0].figure.savefig(png, format="png", dpi=100)
        return png.getvalue()


_CURVE = _CurveFigure()
