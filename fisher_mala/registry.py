"""The samplers ``fm.sample`` knows by name: a registry of :class:`Sampler` entries.

Each entry declares what the driver needs (the warm-up, the frozen kernel, gradients per
step, whether a rejection leaves a chain in place, whether it integrates trajectories,
what ``pooled=True`` means), so that the driver itself names no sampler.
:func:`register_sampler` adds more; ``fm.sample`` also takes a :class:`Sampler` directly.
"""

from collections.abc import Callable
from typing import NamedTuple

from fisher_mala import fisher, hmc, mala, mmala, pooled, validation, warmups, whitened_hmc
from fisher_mala.whitened_warmup import FisherHMCWarmup

__all__ = ["Sampler", "register_sampler", "samplers", "get"]


class Sampler(NamedTuple):
    """What ``fm.sample`` needs to know of a sampler: the registry entry.

    Attributes
    ----------
    warmup
        ``(logdensity_fn, **options) -> warmup`` with ``warmup.run(key, position,
        num_steps, progress)`` returning ``(state, parameters), info`` (a
        :class:`~fisher_mala.warmups.Warmup` built from a schedule, or any object with
        that ``run``; ``warmup.batched``: ``run`` takes every chain at once;
        ``warmup.staged``: it runs in compiled parts with host choices between them,
        through ``warmup.staged_run``; ``warmup.segmented_run``: so it does with a
        checkpoint, saved after each part).
    sampling_kernel
        ``(logdensity_fn, **options) -> step`` with ``step(key, state, parameters) ->
        (state, info)``, the frozen kernel of the sampling phase.
    grad_evals_per_step
        Gradient evaluations of one sampling step (for ``num_grad_evals``): a number, a
        function ``(d, **options) -> number``, or ``None`` to count the
        ``num_integration_steps`` that each step's info reports (NUTS).
    metropolis
        Each step accepts or rejects one whole proposal (MALA, HMC), so a run of
        rejections leaves the chain at one point (the ``rejection_streak`` check of
        :func:`fm.diagnose`); ``False`` for NUTS.
    trajectory
        Each step integrates a trajectory (HMC, NUTS): the chains run one after the
        other on a CPU in small dimension (``chain_method="auto"``), and divergences are
        checked.
    pooled
        What ``pooled=True`` means: ``None``, not available; ``"option"``, passed to the
        warm-up; another registered name, the pooled variant to run instead.
    """

    warmup: Callable
    sampling_kernel: Callable
    grad_evals_per_step: int | Callable | None = 1
    metropolis: bool = True
    trajectory: bool = False
    pooled: str | None = None


_SAMPLERS: dict[str, Sampler] = {}


def register_sampler(name: str, sampler: Sampler, replace: bool = False) -> None:
    """Make ``fm.sample(key, name, ...)`` run ``sampler``.

    An existing name (the built-in ones included) is refused unless ``replace=True``: a
    registration lasts for the whole process, so replacing one by accident would change
    every later run of that name.
    """
    if not isinstance(sampler, Sampler):
        raise TypeError(f"`sampler` must be an fm.Sampler, got {type(sampler).__name__}.")
    if name in _SAMPLERS and not replace:
        raise ValueError(
            f"A sampler named {name!r} is already registered; pass replace=True to replace "
            "it for the rest of the process, or choose another name."
        )
    _SAMPLERS[name] = sampler


def samplers() -> tuple[str, ...]:
    """Names accepted by :func:`fisher_mala.sample`."""
    return tuple(_SAMPLERS)


def get(name: str) -> Sampler:
    """The registry entry of ``name`` (a clear error for an unknown one)."""
    validation.check_choice("sampler", name, samplers())
    return _SAMPLERS[name]


def _fisher_sampling_kernel(logdensity_fn, **options):
    kernel = fisher.build_kernel()

    def step(key, state, parameters):
        del parameters  # R and sigma^2 are in the state
        return kernel(key, state, logdensity_fn)

    return step


def _mala_sampling_kernel(logdensity_fn, **options):
    kernel = mala.build_kernel()

    def step(key, state, parameters):
        return kernel(key, state, logdensity_fn, parameters.step_size)

    return step


def _mmala_sampling_kernel(logdensity_fn, metric_fn=None, **options):
    kernel = mmala.build_kernel(metric_fn)

    def step(key, state, parameters):
        return kernel(key, state, logdensity_fn, parameters.step_size)

    return step


def _hmc_sampling_kernel(
    logdensity_fn,
    num_integration_steps=hmc.NUM_INTEGRATION_STEPS,
    divergence_threshold=hmc.DIVERGENCE_THRESHOLD,
    **options,
):
    kernel = hmc.build_kernel(num_integration_steps, divergence_threshold)

    def step(key, state, parameters):
        return kernel(key, state, logdensity_fn, parameters.step_size)

    return step


def _pooled_sampling_kernel(logdensity_fn, **options):
    kernel = pooled.build_kernel()

    def step(key, state, parameters):
        del parameters  # the shared R and sigma^2 are in the state
        return kernel(key, state, logdensity_fn)

    return step


def _whitened_sampling_kernel(algorithm: str) -> Callable:
    def make(
        logdensity_fn,
        pooled=False,
        max_num_doublings=10,
        num_integration_steps=None,
        divergence_threshold=1000.0,
        robust_uturn="auto",
        **options,
    ):
        # "auto": the checks across subtrees, unless the warm-up chose otherwise (it passes
        # its choice here: `FisherHMCWarmup.sampling_options`)
        whitened_hmc.check_robust_uturn(robust_uturn)
        kernel = whitened_hmc.build_kernel(
            algorithm, divergence_threshold=divergence_threshold,
            robust_uturn=robust_uturn is not False,
        )  # fmt: skip

        def one(key, state, step_size):
            return kernel(
                key,
                state,
                logdensity_fn,
                step_size,
                num_integration_steps,
                max_num_doublings,
            )

        def step(key, state, parameters):  # R is in the state, pooled or not
            return one(key, state, parameters.step_size)

        return step

    return make


def _whitened_warmup(algorithm: str) -> Callable:
    def make(logdensity_fn, **options):
        return FisherHMCWarmup(logdensity_fn, algorithm, **options)

    return make


register_sampler("mala", Sampler(warmups.mala_warmup, _mala_sampling_kernel))
# C chains sharing one R (fisher_mala.pooled); also `fm.sample(..., "fisher_mala", pooled=True)`.
register_sampler(
    "pooled_fisher_mala", Sampler(warmups.pooled_fisher_mala_warmup, _pooled_sampling_kernel)
)
register_sampler(
    "fisher_mala",
    Sampler(warmups.fisher_mala_warmup, _fisher_sampling_kernel, pooled="pooled_fisher_mala"),
)
# AdaMALA samples with its frozen R = chol(Sigma): preconditioned MALA, i.e. frozen Fisher.
register_sampler("adamala", Sampler(warmups.adamala_warmup, _fisher_sampling_kernel))
# A Hessian by forward-over-reverse autodiff costs about d gradient evaluations.
register_sampler(
    "mmala",
    Sampler(warmups.mmala_warmup, _mmala_sampling_kernel, lambda d, **options: 1 + d),
)


def _leapfrog_steps(d, num_integration_steps=hmc.NUM_INTEGRATION_STEPS, **options):
    return int(num_integration_steps)


register_sampler(
    "hmc", Sampler(warmups.hmc_warmup, _hmc_sampling_kernel, _leapfrog_steps, trajectory=True)
)


# NUTS / HMC in the coordinates whitened by the learned R (fisher_mala.whitened_hmc).
for _name in whitened_hmc.ALGORITHMS:
    register_sampler(
        f"fisher_{_name}",
        Sampler(
            _whitened_warmup(_name),
            _whitened_sampling_kernel(_name),
            None,
            metropolis=_name == "hmc",
            trajectory=True,
            pooled="option",
        ),
    )
