"""MinAtar Freeway, both forms of its rules side by side: :mod:`.rules` over batched tensors (the definition, every
device) and :mod:`.kernel` over one env's row (numba, the compiled CPU step), kept equal bit for bit by
``tests/envs/test_minatar_kernels.py``: a rule change edits both files of this folder."""
