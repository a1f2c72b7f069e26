"""Compiled CPU steps of the torch simulators (numba), one call per step; imported by :mod:`._jit` only.

Each kernel is a loop over envs that repeats, env by env, the array operations of the simulator's
numpy kernels (:mod:`.classic_control`, :func:`._sim_kernels.autoreset_numpy`) in the same order on
the same IEEE doubles, without fast-math (no reassociation, no fused multiply-add). The sines and
cosines are not computed here: the caller passes torch's (libm's differ in the last bit), so the
results are bitwise those of the numpy and torch kernels. Outputs are written into arrays the caller
allocated for this step; inputs are only read.

Reset draws follow :func:`._rng.uniform_draws`: draw ``d`` of episode ``e`` of the env with key ``k`` is
``mix32(counter(k, e, salt_d)) * scale_d + offset_d``, in ``int64`` with every intermediate below ``2**63``,
where ``mix32`` and ``counter`` are :mod:`._rng`'s very functions, compiled here.
"""

from __future__ import annotations

import numba
import numpy as np

from rlstruct.envs import _rng

__all__ = ["cartpole_autoreset", "cartpole_episodic", "mix32", "counter", "jit", "autoreset_flags"]

#: How every compiled kernel of the simulators is compiled: cached on disk, without the GIL, no bounds checks.
jit = _jit = numba.njit(cache=True, nogil=True, boundscheck=False)

# The RNG's one definition, compiled (its module constants become compile-time constants). numba's cache of the
# kernels below is keyed on this file only: after an edit of _rng.py, touch this file so that they compile again
# (tests/envs/test_simulators.py compares both with the numpy kernels bit for bit).
mix32 = _jit(_rng.mix32)
counter = _jit(_rng.counter)


@_jit
def _draw(key, episode, salt, scale, offset):
    """One uniform draw: :func:`._rng.uniform_draws` for one env and one variable."""
    return np.float64(mix32(counter(np.int64(key), episode, salt))) * scale + offset


@_jit
def autoreset_flags(i, ended, cut, done, terminated, truncated, initial, done_r, terminated_r, truncated_r, initial_r):
    """Row ``i`` of an auto-reset step's flags (each ``bool [B]``) for an env whose episode ``ended`` (terminated)
    or was ``cut`` (truncated): those of the observation reached, then those of the one the env acts on next (a
    finished env restarts there). Returns whether it finished."""
    finished = ended or cut
    done[i] = finished
    terminated[i] = ended
    truncated[i] = cut
    initial[i] = False
    done_r[i] = False
    terminated_r[i] = False
    truncated_r[i] = False
    initial_r[i] = finished
    return finished


@_jit
def _cartpole(p, x, x_dot, theta, theta_dot, sintheta, costheta, action):
    """One env of :meth:`CartPole._transition`: ``(x, x_dot, theta, theta_dot, terminated)`` after the step.

    ``p`` is the tuple of the constants named by ``CartPole._jit_params``, in that order: gravity, pole mass,
    total mass, half length, pole mass x half length, force, tau, x threshold, theta threshold (a tuple of
    locals, not an array, so that the compiler keeps them in registers).
    """
    gravity, masspole, total_mass, length, polemass_length, force_mag, tau, x_threshold, theta_threshold = p
    force = force_mag if action >= 1 else -force_mag
    temp = (force + polemass_length * (theta_dot * theta_dot) * sintheta) / total_mass
    thetaacc = (gravity * sintheta - costheta * temp) / (
        length * (4.0 / 3.0 - masspole * (costheta * costheta) / total_mass)
    )
    xacc = temp - polemass_length * thetaacc * costheta / total_mass
    x_n = x + tau * x_dot
    x_dot_n = x_dot + tau * xacc
    theta_n = theta + tau * theta_dot
    theta_dot_n = theta_dot + tau * thetaacc
    terminated = abs(x_n) > x_threshold or abs(theta_n) > theta_threshold
    return x_n, x_dot_n, theta_n, theta_dot_n, terminated


@_jit
def _cartpole_constants(p):
    return p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8]


@_jit
def _put_frame(frame, i, x, x_dot, theta, theta_dot):
    """Row ``i`` of ``frame float32 [B, 4]``: one CartPole observation."""
    frame[i, 0] = x
    frame[i, 1] = x_dot
    frame[i, 2] = theta
    frame[i, 3] = theta_dot


@_jit
def _put_state(phys, frame, i, x, x_dot, theta, theta_dot):
    """Env ``i``'s state: column ``i`` of ``phys float64 [4, B]`` and its observation, row ``i`` of ``frame``."""
    phys[0, i] = x
    phys[1, i] = x_dot
    phys[2, i] = theta
    phys[3, i] = theta_dot
    _put_frame(frame, i, x, x_dot, theta, theta_dot)


@_jit
def cartpole_autoreset(
    phys, elapsed, episode, key, action, sintheta, costheta, p, limit, salt, scale, offset,
    phys_r, elapsed_r, episode_r, frame, frame_r, reward, reward_r,
    done_n, terminated_n, truncated_n, initial_r, initial_n, done_r, terminated_r, truncated_r, last_r,
):  # fmt: skip
    """The auto-reset CartPole step of every env.

    Reads ``phys float64 [4, B]``, ``elapsed``/``episode int64 [B]``, ``key uint32 [B]``, ``action int64 [B]``
    and ``sin``/``cos`` of ``phys[2]``; writes the next state (``phys_r``, ``elapsed_r``, ``episode_r``: the
    fresh state where an episode ended), ``frame``/``reward``/``*_n`` (the observation reached) and
    ``frame_r``/``reward_r``/``*_r``/``last_r`` (the one the envs act on next): the flags are ``bool [B]``, each
    its own array (rows of one array, or a batcher's buffer).
    """
    c = _cartpole_constants(p)
    for i in range(action.shape[0]):
        a = action[i]
        x, x_dot, theta, theta_dot, terminated = _cartpole(
            c, phys[0, i], phys[1, i], phys[2, i], phys[3, i], sintheta[i], costheta[i], a
        )
        steps = elapsed[i] + 1
        _put_frame(frame, i, x, x_dot, theta, theta_dot)
        reward[i] = 1.0
        if autoreset_flags(i, terminated, steps >= limit, done_n, terminated_n, truncated_n, initial_n,
                           done_r, terminated_r, truncated_r, initial_r):
            e = episode[i] + 1
            x = _draw(key[i], e, salt[0], scale[0], offset[0])
            x_dot = _draw(key[i], e, salt[1], scale[1], offset[1])
            theta = _draw(key[i], e, salt[2], scale[2], offset[2])
            theta_dot = _draw(key[i], e, salt[3], scale[3], offset[3])
            episode_r[i] = e
            elapsed_r[i] = 0
            reward_r[i] = 0.0
            last_r[i] = 0
        else:
            episode_r[i] = episode[i]
            elapsed_r[i] = steps
            reward_r[i] = 1.0
            last_r[i] = a
        _put_state(phys_r, frame_r, i, x, x_dot, theta, theta_dot)


@_jit
def cartpole_episodic(phys, elapsed, action, sintheta, costheta, p, limit, phys_n, elapsed_n, frame, reward, flags):
    """The episodic CartPole step of the given envs: next ``phys_n``/``elapsed_n``, ``frame``, ``reward`` and
    ``flags bool [3, B]`` (done, terminated, truncated)."""
    c = _cartpole_constants(p)
    for i in range(action.shape[0]):
        x, x_dot, theta, theta_dot, terminated = _cartpole(
            c, phys[0, i], phys[1, i], phys[2, i], phys[3, i], sintheta[i], costheta[i], action[i]
        )
        steps = elapsed[i] + 1
        truncated = steps >= limit
        _put_state(phys_n, frame, i, x, x_dot, theta, theta_dot)
        elapsed_n[i] = steps
        reward[i] = 1.0
        flags[0, i] = terminated or truncated
        flags[1, i] = terminated
        flags[2, i] = truncated
