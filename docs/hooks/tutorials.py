"""MkDocs hook: each ``tutorials/NN_*.py`` script becomes the page ``tutorials/NN_*.md``.

The script's module docstring is the page's prose; each top-level block (a function, the ``__main__`` guard)
is a code block, headed by the step title the function prints (``print("== 2. Title")``). The pages are built
from the scripts at every build, so they cannot drift from the code that the tests run.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
TUTORIALS = ROOT / "tutorials"
REPO_PATH = "tutorials"

_STEP_TITLE = re.compile(r'print\(\s*f?"== ([^"]+)"')


def _rst_to_markdown(text: str) -> str:
    """The docstrings' reStructuredText literals (``x``) and roles (:class:`~a.b.C`) as Markdown code spans."""
    text = re.sub(r":\w+:`~?([^`]+)`", lambda m: "`" + m.group(1).split(".")[-1] + "`", text)
    return text.replace("``", "`")


def render(script: Path) -> str:
    """The Markdown page of one tutorial script."""
    source = script.read_text()
    tree = ast.parse(source)
    lines = source.splitlines()
    doc = ast.get_docstring(tree) or ""
    title, _, prose = doc.partition("\n")
    parts = [f"# {_rst_to_markdown(title.strip())}", "", _rst_to_markdown(prose.strip()), "",
             f"Source: `{REPO_PATH}/{script.name}`.", ""]
    body = tree.body[1:] if doc else tree.body
    if not body:
        return "\n".join(parts)
    # The imports and constants before the first function form the set-up block.
    chunks: list[tuple[str | None, str]] = []
    start = body[0].lineno
    pending: list[ast.stmt] = []
    for node in body:
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.If)):
            if pending:
                chunks.append((None, "\n".join(lines[start - 1:first - 1]).strip()))
                pending = []
            segment = "\n".join(lines[first - 1:node.end_lineno])
            # The step titles the block prints (an f-string's fields shown by name); a block may hold several steps.
            steps = [re.sub(r"\{([^}]*)\}", r"\1", t) for t in _STEP_TITLE.findall(segment)]
            heading = " / ".join(steps) if steps else ("Running it" if isinstance(node, ast.If) else None)
            chunks.append((heading, segment))
            start = node.end_lineno + 1
        else:
            if not pending:
                start = first
            pending.append(node)
    if pending:
        chunks.append((None, "\n".join(lines[start - 1:]).strip()))
    for heading, code in chunks:
        if heading:
            parts += [f"## {heading}", ""]
        parts += ["```python", code.rstrip(), "```", ""]
    return "\n".join(parts)


def on_files(files: Files, config) -> Files:
    """Adds one generated page per tutorial script."""
    for script in sorted(TUTORIALS.glob("[0-9][0-9]_*.py")):
        files.append(File.generated(config, f"tutorials/{script.stem}.md", content=render(script)))
    return files
