"""``python -m rlstruct.algos``: the ``rlstruct`` command, for an environment whose console scripts are not on the
path."""

from rlstruct.algos._train.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
