"""Torch-native batches of gymnasium's classic-control systems.

Each class reproduces one gymnasium 1.x environment (dynamics, reward, termination, truncation
and reset ranges), batched over ``n_envs`` copies that live on one device:

================  ===================  ========  ==========  ======================
class             gymnasium id         actions   obs_dim     max_episode_steps
================  ===================  ========  ==========  ======================
:class:`CartPole`     ``CartPole-v1``      2         4           500
:class:`CartPoleNoVel` ``CartPoleNoVel-v1`` 2        2           500
:class:`Acrobot`      ``Acrobot-v1``       3         6           500
:class:`MountainCar`  ``MountainCar-v0``   3         2           200
:class:`Pendulum`     ``Pendulum-v1``      Box [1]   3           200
================  ===================  ========  ==========  ======================

Every class takes the arguments of :class:`~rlstruct.envs.TorchVecEnv`, its ``max_episode_steps`` defaulting to
the table's. The physics runs in ``float64`` (as gymnasium's, which computes in Python or numpy doubles; ``float32`` on
request, for throughput) and the observation ``frame`` is ``float32``. The initial states follow gymnasium's
uniform ranges, drawn from the counter-based RNG of :mod:`rlstruct.envs._rng` (so the numbers differ from
gymnasium's for the same seed, but the distributions are the same).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from gymnasium import spaces

from rlstruct.envs._array_ops import NumpyOps
from rlstruct.envs._torch_env import TorchVecEnv

__all__ = ["CartPole", "CartPoleNoVel", "Acrobot", "MountainCar", "Pendulum"]


def _f32_box(low, high) -> spaces.Box:
    return spaces.Box(np.asarray(low, dtype=np.float32), np.asarray(high, dtype=np.float32), dtype=np.float32)


class CartPole(TorchVecEnv):
    """Gymnasium's ``CartPole-v1`` (Barto, Sutton and Anderson's cart-pole), ``n_envs`` at a time.

    Physics ``[x, x_dot, theta, theta_dot]`` (euler integration, ``tau = 0.02``); action ``0``
    pushes left, ``1`` pushes right; reward ``1`` every step including the terminating one;
    terminated when ``|x| > 2.4`` or ``|theta| > 12°``; initial state uniform in ``(-0.05, 0.05)``.

    Observation: ``frame`` ``float32 [B, 4]`` plus the keys of :class:`~rlstruct.envs.VecEnv`;
    ``last_action`` is ``int64 [B]``. On the CPU with numba installed (``rlstruct[fast]``) a step is one
    compiled call (``env.kernel == "jit"``), with the numpy kernels' results bit for bit.

    >>> from rlstruct import DictTensor
    >>> env = CartPole(3, seed=0)
    >>> obs, ids = env.reset()
    >>> obs["frame"].shape, ids.tolist()
    (torch.Size([3, 4]), [0, 1, 2])
    >>> (obs_next, ids), (obs, running) = env.step(DictTensor({"action": torch.ones(3, dtype=torch.long)}))
    >>> obs_next["reward"].tolist(), running.tolist()
    ([1.0, 1.0, 1.0], [0, 1, 2])
    """

    physics_names = ("x", "x_dot", "theta", "theta_dot")
    reset_low = (-0.05,) * 4
    reset_high = (0.05,) * 4
    n_actions = 2
    _jit_name = "cartpole"
    _jit_params = (
        "GRAVITY", "MASSPOLE", "TOTAL_MASS", "LENGTH", "POLEMASS_LENGTH", "FORCE_MAG", "TAU",
        "X_THRESHOLD", "THETA_THRESHOLD_RADIANS",
    )  # fmt: skip

    GRAVITY = 9.8
    MASSCART = 1.0
    MASSPOLE = 0.1
    TOTAL_MASS = MASSPOLE + MASSCART
    LENGTH = 0.5  # half the pole's length
    POLEMASS_LENGTH = MASSPOLE * LENGTH
    FORCE_MAG = 10.0
    TAU = 0.02
    THETA_THRESHOLD_RADIANS = 12 * 2 * math.pi / 360
    X_THRESHOLD = 2.4
    #: the physics rows ``[x, x_dot, theta, theta_dot]`` the frame shows, in order (a subclass may show fewer).
    OBSERVED = (0, 1, 2, 3)

    default_max_episode_steps = 500

    def _setup(self) -> None:
        bounds = (self.X_THRESHOLD * 2, np.inf, self.THETA_THRESHOLD_RADIANS * 2, np.inf)
        high = [bounds[i] for i in self.OBSERVED]
        self.action_space = spaces.Discrete(2)
        self.observation_space = _f32_box([-h for h in high], high)
        self._add_array(
            "thresholds", torch.tensor([[self.X_THRESHOLD], [self.THETA_THRESHOLD_RADIANS]], dtype=torch.float64)
        )
        self._add_array("force", torch.tensor([-self.FORCE_MAG, self.FORCE_MAG], dtype=torch.float64))

    def _initial_physics(self, xp, u):
        return u

    def _transition(self, xp, phys, action):
        x_dot, theta, theta_dot = phys[1], phys[2], phys[3]
        # -FORCE_MAG for action 0, +FORCE_MAG for 1 (the action clamped into {0, 1}).
        force = xp.lookup(self._arrays(xp).force, action)
        costheta = xp.cos(theta)
        sintheta = xp.sin(theta)
        # Same evaluation order as gymnasium's CartPoleEnv.step, so that results agree to the last bits.
        temp = (force + self.POLEMASS_LENGTH * (theta_dot * theta_dot) * sintheta) / self.TOTAL_MASS
        thetaacc = (self.GRAVITY * sintheta - costheta * temp) / (
            self.LENGTH * (4.0 / 3.0 - self.MASSPOLE * (costheta * costheta) / self.TOTAL_MASS)
        )
        xacc = temp - self.POLEMASS_LENGTH * thetaacc * costheta / self.TOTAL_MASS
        new = phys + self.TAU * xp.stack((x_dot, xacc, theta_dot, thetaacc))
        # |x| > t is exactly (x < -t) | (x > t); rows 0 and 2 are x and theta.
        beyond = xp.abs(new[0::2]) > self._arrays(xp).thresholds
        return new, xp.full_f32(theta, 1.0), beyond[0] | beyond[1]

    def _frame(self, xp, phys):
        return xp.frame(phys)

    def _jit_inputs(self, phys):
        theta = phys[2]
        return NumpyOps.sin(theta), NumpyOps.cos(theta)


class CartPoleNoVel(CartPole):
    """``CartPoleNoVel-v1``: :class:`CartPole` observed without its velocities, a partially observed task.

    The frame is ``[x, theta]`` (rl-baselines3-zoo's env of that name): the same dynamics, rewards,
    terminations and, for the same seed and actions, the same states as :class:`CartPole`, whose frame
    ``[x, x_dot, theta, theta_dot]`` it keeps columns 0 and 2 of. A policy must infer the velocities from
    the history, so a feed-forward policy cannot balance the pole for long; a recurrent one can.

    >>> full, partial = CartPole(3, seed=0), CartPoleNoVel(3, seed=0)
    >>> torch.equal(partial.reset()[0]["frame"], full.reset()[0]["frame"][:, [0, 2]])
    True
    """

    # The compiled kernels write CartPole's four-column frame: this variant steps with the numpy kernels.
    _jit_name = None
    OBSERVED = (0, 2)

    def _frame(self, xp, phys):
        return xp.frame(tuple(phys[i] for i in self.OBSERVED))


class Acrobot(TorchVecEnv):
    """Gymnasium's ``Acrobot-v1`` (two-link pendulum, "book" dynamics, rk4, no torque noise).

    Physics ``[theta1, theta2, dtheta1, dtheta2]``; actions ``0, 1, 2`` apply torque ``-1, 0, +1``
    to the joint between the links; reward ``-1`` per step and ``0`` on the terminating step;
    terminated when ``-cos(theta1) - cos(theta1 + theta2) > 1``; initial state uniform in
    ``(-0.1, 0.1)`` rounded to ``float32`` (as gymnasium's).

    Observation: ``frame`` ``float32 [B, 6]`` = ``[cos θ1, sin θ1, cos θ2, sin θ2, dθ1, dθ2]``;
    ``last_action`` is ``int64 [B]``.

    >>> from rlstruct import DictTensor
    >>> env = Acrobot(2, seed=0, autoreset=True)
    >>> obs, ids = env.reset()
    >>> (obs_next, ids), _ = env.step(DictTensor({"action": torch.tensor([0, 2])}))
    >>> obs_next["frame"].shape, obs_next["reward"].tolist()
    (torch.Size([2, 6]), [-1.0, -1.0])
    """

    physics_names = ("theta1", "theta2", "dtheta1", "dtheta2")
    reset_low = (-0.1,) * 4
    reset_high = (0.1,) * 4
    n_actions = 3

    DT = 0.2
    LINK_LENGTH_1 = 1.0
    LINK_MASS_1 = 1.0
    LINK_MASS_2 = 1.0
    LINK_COM_POS_1 = 0.5
    LINK_COM_POS_2 = 0.5
    LINK_MOI = 1.0
    MAX_VEL_1 = 4 * math.pi
    MAX_VEL_2 = 9 * math.pi
    GRAVITY = 9.8

    default_max_episode_steps = 500

    def _setup(self) -> None:
        high = [1.0, 1.0, 1.0, 1.0, self.MAX_VEL_1, self.MAX_VEL_2]
        self.action_space = spaces.Discrete(3)
        self.observation_space = _f32_box([-h for h in high], high)
        self._add_array("unit_push", torch.tensor([-1.0, 0.0, 1.0], dtype=torch.float64))
        max_vel = torch.tensor([[self.MAX_VEL_1], [self.MAX_VEL_2]], dtype=torch.float64)
        self._add_array("max_vel", max_vel)
        self._add_array("neg_max_vel", -max_vel)

    def _initial_physics(self, xp, u):
        return self._as_physics(xp, xp.float32(u))

    def _dsdt(self, xp, s, torque):
        # gymnasium's AcrobotEnv._dsdt, book_or_nips="book", with the same constant folding as Python's
        # left-to-right evaluation of its expressions.
        m1, m2, l1 = self.LINK_MASS_1, self.LINK_MASS_2, self.LINK_LENGTH_1
        lc1, lc2, i1, i2, g = self.LINK_COM_POS_1, self.LINK_COM_POS_2, self.LINK_MOI, self.LINK_MOI, self.GRAVITY
        theta1, theta2, dtheta1, dtheta2 = s[0], s[1], s[2], s[3]
        cos2 = xp.cos(theta2)
        sin2 = xp.sin(theta2)
        d1 = m1 * lc1**2 + m2 * (l1**2 + lc2**2 + 2 * l1 * lc2 * cos2) + i1 + i2
        d2 = m2 * (lc2**2 + l1 * lc2 * cos2) + i2
        phi2 = m2 * lc2 * g * xp.cos(theta1 + theta2 - math.pi / 2.0)
        phi1 = (
            -m2 * l1 * lc2 * (dtheta2 * dtheta2) * sin2
            - 2 * m2 * l1 * lc2 * dtheta2 * dtheta1 * sin2
            + (m1 * lc1 + m2 * l1) * g * xp.cos(theta1 - math.pi / 2)
            + phi2
        )
        ddtheta2 = (torque + d2 / d1 * phi1 - m2 * l1 * lc2 * (dtheta1 * dtheta1) * sin2 - phi2) / (
            m2 * lc2**2 + i2 - (d2 * d2) / d1
        )
        ddtheta1 = -(d2 * ddtheta2 + phi1) / d1
        return xp.stack((dtheta1, dtheta2, ddtheta1, ddtheta2))

    def _transition(self, xp, phys, action):
        torque = xp.lookup(self._arrays(xp).unit_push, action)
        dt = self.DT
        dt2 = dt / 2.0
        k1 = self._dsdt(xp, phys, torque)
        k2 = self._dsdt(xp, phys + dt2 * k1, torque)
        k3 = self._dsdt(xp, phys + dt2 * k2, torque)
        k4 = self._dsdt(xp, phys + dt * k3, torque)
        ns = phys + dt / 6.0 * (k1 + 2 * k2 + 2 * k3 + k4)
        angles = _wrap(xp, ns[:2], -math.pi, math.pi)
        c = self._arrays(xp)
        speeds = xp.minimum(xp.maximum(ns[2:], c.neg_max_vel), c.max_vel)
        new = xp.concat((angles, speeds))
        terminated = -xp.cos(angles[0]) - xp.cos(angles[1] + angles[0]) > 1.0
        reward = xp.float32(terminated) - 1.0
        return new, reward, terminated

    def _frame(self, xp, phys):
        c = xp.cos(phys[:2])
        s = xp.sin(phys[:2])
        return xp.frame((c[0], s[0], c[1], s[1], phys[2], phys[3]))


def _wrap(xp, x, m: float, big_m: float):
    """gymnasium's acrobot ``wrap`` (subtract or add ``big_m - m`` until ``m <= x <= big_m``), batched.

    One subtraction gives the very bits of gymnasium's loop; further turns are folded into one product.
    """
    diff = big_m - m
    over = xp.clip(xp.ceil((x - big_m) / diff), 0.0)
    under = xp.clip(xp.ceil((m - x) / diff), 0.0)
    return x - over * diff + under * diff


class MountainCar(TorchVecEnv):
    """Gymnasium's ``MountainCar-v0`` (Moore's car in a valley), ``n_envs`` at a time.

    Physics ``[position, velocity]``; actions ``0, 1, 2`` accelerate left, not at all, right;
    reward ``-1`` per step; terminated when ``position >= 0.5`` (and ``velocity >= 0``); initial
    position uniform in ``(-0.6, -0.4)``, velocity ``0``.

    Observation: ``frame`` ``float32 [B, 2]``; ``last_action`` is ``int64 [B]``.

    >>> env = MountainCar(4, seed=1)
    >>> obs, ids = env.reset()
    >>> bool(((obs["frame"][:, 0] > -0.6) & (obs["frame"][:, 0] < -0.4)).all()), obs["frame"][:, 1].tolist()
    (True, [0.0, 0.0, 0.0, 0.0])
    """

    physics_names = ("position", "velocity")
    reset_low = (-0.6,)
    reset_high = (-0.4,)
    n_actions = 3

    MIN_POSITION = -1.2
    MAX_POSITION = 0.6
    MAX_SPEED = 0.07
    GOAL_POSITION = 0.5
    GOAL_VELOCITY = 0
    FORCE = 0.001
    GRAVITY = 0.0025

    default_max_episode_steps = 200

    def _setup(self) -> None:
        self.action_space = spaces.Discrete(3)
        self.observation_space = _f32_box([self.MIN_POSITION, -self.MAX_SPEED], [self.MAX_POSITION, self.MAX_SPEED])
        self._add_array("unit_push", torch.tensor([-1.0, 0.0, 1.0], dtype=torch.float64))

    def _initial_physics(self, xp, u):
        return xp.concat((u, xp.zeros_like(u)))

    def _transition(self, xp, phys, action):
        position, velocity = phys[0], phys[1]
        push = xp.lookup(self._arrays(xp).unit_push, action)
        velocity = velocity + (push * self.FORCE + xp.cos(3 * position) * (-self.GRAVITY))
        velocity = xp.clip(velocity, -self.MAX_SPEED, self.MAX_SPEED)
        position = xp.clip(position + velocity, self.MIN_POSITION, self.MAX_POSITION)
        velocity = xp.where((position == self.MIN_POSITION) & (velocity < 0), 0.0, velocity)
        terminated = (position >= self.GOAL_POSITION) & (velocity >= self.GOAL_VELOCITY)
        return xp.stack((position, velocity)), xp.full_f32(position, -1.0), terminated

    def _frame(self, xp, phys):
        return xp.frame(phys)


class Pendulum(TorchVecEnv):
    """Gymnasium's ``Pendulum-v1`` (``g = 10``), ``n_envs`` at a time.

    Physics ``[theta, theta_dot]`` (theta is not wrapped, as in gymnasium); the action is a torque
    ``float32 [B, 1]`` clipped to ``[-2, 2]``; reward
    ``-(normalize(theta)**2 + 0.1 * theta_dot**2 + 0.001 * torque**2)``; never terminates (episodes
    end by truncation); initial ``theta`` uniform in ``(-pi, pi)``, ``theta_dot`` in ``(-1, 1)``.

    Observation: ``frame`` ``float32 [B, 3]`` = ``[cos θ, sin θ, θ']``; ``last_action`` is
    ``float32 [B, 1]`` (the action as given, before clipping).

    >>> from rlstruct import DictTensor
    >>> env = Pendulum(2, seed=0, max_episode_steps=1)
    >>> obs, ids = env.reset()
    >>> (obs_next, ids), (obs, running) = env.step(DictTensor({"action": torch.zeros(2, 1)}))
    >>> obs_next["truncated"].tolist(), running.tolist()
    ([True, True], [])
    """

    physics_names = ("theta", "theta_dot")
    reset_low = (-math.pi, -1.0)
    reset_high = (math.pi, 1.0)
    n_actions = None
    action_shape = (1,)

    MAX_SPEED = 8
    MAX_TORQUE = 2.0
    DT = 0.05
    G = 10.0
    M = 1.0
    L = 1.0

    default_max_episode_steps = 200

    def _setup(self) -> None:
        self.action_space = spaces.Box(-self.MAX_TORQUE, self.MAX_TORQUE, shape=(1,), dtype=np.float32)
        self.observation_space = _f32_box([-1.0, -1.0, -self.MAX_SPEED], [1.0, 1.0, self.MAX_SPEED])

    def _initial_physics(self, xp, u):
        return u

    def _transition(self, xp, phys, action):
        g, m, length = self.G, self.M, self.L
        th, thdot = phys[0], phys[1]
        u = xp.clip(action[:, 0], -self.MAX_TORQUE, self.MAX_TORQUE)
        # gymnasium keeps the torque in float32 (numpy's weak Python scalars), so the torque terms are
        # float32 products, promoted to float64 when added to the float64 state terms; torch's Python
        # scalars are weak too.
        normalized = xp.remainder(th + math.pi, 2 * math.pi) - math.pi
        costs = normalized * normalized + 0.1 * (thdot * thdot) + self._as_physics(xp, 0.001 * (u * u))
        torque = self._as_physics(xp, 3.0 / (m * length**2) * u)
        newthdot = thdot + (3 * g / (2 * length) * xp.sin(th) + torque) * self.DT
        newthdot = xp.clip(newthdot, -self.MAX_SPEED, self.MAX_SPEED)
        newth = th + newthdot * self.DT
        return xp.stack((newth, newthdot)), xp.float32(-costs), xp.false(th)

    def _frame(self, xp, phys):
        th = phys[0]
        return xp.frame((xp.cos(th), xp.sin(th), phys[1]))
