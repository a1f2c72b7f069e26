"""``python -m rlstruct.algos``: the ``rlstruct`` command, for an environment whose console scripts are not on the
path."""

from rlstruct.algos._train.cli import main

raise SystemExit(main())
