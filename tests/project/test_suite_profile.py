"""benchmarks/suite_profile.py: a sampling profile of a whole test run, summed by kind of process and of work."""

from __future__ import annotations

from benchmarks.suite_profile import main, parse, process_kind, summarize

WORKER = 'process 10:".venv/bin/python -u -c import sys;exec(eval(sys.stdin.readline()))"'
RAW = f"""\
process 1:".venv/bin/python -m pytest -q -n 2 tests";{WORKER};test_x (tests/t.py:3);learning_curve_png (f.py:1) 6
{WORKER};test_y (tests/t.py:9);_find_and_load (<frozen importlib._bootstrap>:1);<module> (torch/__init__.py:1) 3
{WORKER};process 11:"python -c from multiprocessing.forkserver import main; main(3, 5)";main (forkserver.py:1) 2
process 12:".venv/bin/python .venv/lib/python3.11/site-packages/ray/_private/workers/default_worker.py" 4
process 13:".venv/bin/python tutorials/04_batchers.py";main (04_batchers.py:5);_find_and_load (x:1);a;_find_and_load 1
not a stack line
"""


def test_each_stack_counts_toward_its_innermost_process_and_each_kind_of_work_it_names_once(tmp_path, capsys,
                                                                                              monkeypatch):
    stacks = parse(RAW.splitlines())
    assert len(stacks) == 5
    commands, frames, count = stacks[0]
    # a command line holding ';' stays whole; the frames are what follows the innermost process
    assert commands[-1].endswith("exec(eval(sys.stdin.readline()))") and count == 6
    assert frames == ["test_x (tests/t.py:3)", "learning_curve_png (f.py:1)"]
    assert process_kind(stacks[2][0]) == "fork servers and the workers forked from them"
    total, by_process, by_work = summarize(stacks)
    assert total == 16
    assert by_process == {"pytest's workers and the children forked from them": 9,
                          "fork servers and the workers forked from them": 2, "Ray's nodes and actors": 4,
                          "other interpreters (commands, tutorials, scripts, ...)": 1}
    assert by_work == {"learning curves (matplotlib)": 6, "importing modules": 4}  # the tutorial's stack once
    (tmp_path / "suite.raw").write_text(RAW)
    monkeypatch.setattr("sys.argv", ["suite_profile.py", str(tmp_path / "suite.raw"), "--rate", "4"])
    main()
    out = capsys.readouterr().out
    assert out.startswith("16 samples: 4 CPU s sampled")
    assert "| Ray's nodes and actors | 1 | 25.0% |" in out and "| importing modules | 1 | 25.0% |" in out
