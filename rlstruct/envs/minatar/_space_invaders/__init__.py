"""MinAtar SpaceInvaders: :mod:`.rules`, its rules written once, run as they are by the torch step
and compiled from the same functions for the compiled CPU step (:mod:`rlstruct.envs.minatar._scalar`)."""
