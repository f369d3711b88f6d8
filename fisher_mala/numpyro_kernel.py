"""NumPyro models in, named constrained draws out: an ``MCMCKernel`` and ``sample_numpyro``.

``numpyro.infer.MCMC(fm.FisherMALAKernel(model), num_warmup=..., num_samples=...,
num_chains=...)`` runs Algorithm 1 on any NumPyro model: ``mcmc.get_samples()`` and
``mcmc.print_summary()`` give the model's sites, constrained to their supports, with its
deterministic sites, and ``arviz.from_numpyro(mcmc)`` works. Needs NumPyro
(``pip install 'fisher_mala[numpyro]'``), which the core never imports.

The kernel follows NumPyro's ``BarkerMH`` (``numpyro/infer/barker.py``): the model is
initialized by ``numpyro.infer.util.initialize_model`` (unconstrained sites, potential
energy ``-log pi``); each ``sample`` call is one transition; adaptation happens during
the ``num_warmup`` calls and stops after them. Within the warm-up the phases of
Algorithm 1 follow the iteration count: the step-size search, ``num_mala_steps`` MALA
iterations adapting ``sigma^2``, then FisherMALA adapting ``R`` and ``sigma^2``. MALA is
the FisherMALA kernel with ``R_0 = I / sqrt(lambda)`` frozen (Eq. (7) is invariant to the
scale of ``A``). Chains run with ``chain_method="parallel"`` or ``"sequential"``.

:class:`FisherNUTSKernel` is Fisher NUTS (or HMC) as an ``MCMCKernel``;
:func:`sample_numpyro` runs any sampler of :func:`fm.sample` (Fisher NUTS included) on a
NumPyro model and maps the draws back to the model's named, constrained sites.
"""

from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

from fisher_mala import fisher, validation
from fisher_mala.adaptations.fisher import fisher_preconditioner
from fisher_mala.adaptations.step_size import (
    MALA_TARGET_ACCEPTANCE,
    STEP_SIZE_LEARNING_RATE,
    RobbinsMonroState,
    robbins_monro,
)
from fisher_mala.adaptations.step_size_search import MAX_DOUBLINGS
from fisher_mala.geometric_widening import widen_on_host
from fisher_mala.leapfrog_tuning import _step_size_phase, normalize, tuning_start
from fisher_mala.schedule import Phase, step_at
from fisher_mala.warmups import _initial_state_and_step
from fisher_mala.whitened_hmc import TRAJECTORY_LENGTH

__all__ = [
    "FisherMALAKernelState",
    "FisherMALAKernel",
    "FisherNUTSKernelState",
    "FisherNUTSKernel",
    "sample_numpyro",
    "suggested_num_warmup",
]

try:  # NumPyro is an optional extra
    from numpyro.infer.initialization import init_to_uniform
    from numpyro.infer.mcmc import MCMCKernel
    from numpyro.infer.util import initialize_model
    from numpyro.util import identity, is_prng_key
except ImportError:  # pragma: no cover - exercised only without numpyro
    MCMCKernel = object
    init_to_uniform = initialize_model = identity = is_prng_key = None


def _arguments_key(model_args, model_kwargs):
    """A key under which what was compiled for a model's arguments is kept, as NumPyro's
    ``MCMC`` keeps its compiled loop (``jit_model_args=False``): an array counts by its
    identity (the compiled code holds its values), any other argument by its value; None
    for arguments that cannot be keys. Whoever keeps something under the key also keeps
    the arguments, so that no identity is reused while it is kept."""
    leaves, structure = jax.tree.flatten((tuple(model_args or ()), dict(model_kwargs or {})))
    key = (structure, *(id(x) if isinstance(x, (np.ndarray, jax.Array)) else x for x in leaves))
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _initialize(kernel, rng_key, init_params, model_args, model_kwargs):
    """The kernel's model through ``initialize_model`` (sets its potential and
    postprocess functions); returns the unconstrained initial position and ``(log pi,
    its gradient)`` there as NumPyro found them (checked finite), or None for the user's
    ``init_params`` (then the warm-up evaluates them)."""
    if kernel._model is None:
        if init_params is None:
            raise ValueError("`init_params` is needed with `potential_fn`.")
        return _checked_init_params(kernel, init_params, init_params), None

    def initialize(keys):
        return initialize_model(
            keys,
            kernel._model,
            dynamic_args=True,
            init_strategy=kernel._init_strategy,
            model_args=model_args,
            model_kwargs=model_kwargs,
        )

    # A batch of one key: NumPyro then finds the initial point in one compiled loop (with
    # one key it runs the model op by op, each operation compiled on its own: seconds).
    # The chains of a run, and later runs with the same data, share one compiled program
    # that finds their points (see `_arguments_key`); the first chain takes the model's
    # functions from that program's trace (see `_compiled_initialization`).
    cache_key = _arguments_key(model_args, model_kwargs)
    cached = getattr(kernel, "_initializations", {}).get(cache_key)
    concrete = validation.is_concrete((rng_key, model_args, model_kwargs))
    if cached is None and concrete and cache_key is not None:  # not under NumPyro's jit
        finder, found, functions = _compiled_initialization(
            initialize, kernel._model, rng_key[None]
        )
        if functions is None:  # as NumPyro sets the model up (one more search)
            _, *functions, _ = initialize(rng_key[None])
        potential_gen, kernel._postprocess_fn = functions
        kernel._potential_fn = potential_gen(*model_args, **(model_kwargs or {}))
        kept = (model_args, model_kwargs, kernel._potential_fn, kernel._postprocess_fn)
        kernel._initializations = {cache_key: (*kept, finder)}
    elif cached is None or not concrete:
        found, potential_gen, kernel._postprocess_fn, _ = initialize(rng_key[None])
        kernel._potential_fn = potential_gen(*model_args, **(model_kwargs or {}))
    else:
        _, _, kernel._potential_fn, kernel._postprocess_fn, finder = cached
        found = finder(rng_key[None])
    if concrete:
        _check_found(found)
    z, potential_energy, z_grad = jax.tree.map(lambda x: x[0], tuple(found))
    if init_params is None:  # log pi = -potential energy: its value and gradient negated
        return z, (-potential_energy, jax.tree.map(jnp.negative, z_grad))
    return _checked_init_params(kernel, init_params, z), None


#: The model evaluations that :func:`_compiled_initialization`'s program is costed at (its
#: search tries points until one is valid: the first, for most models).
_FINDER_ITERATIONS = 10


def _check_found(found) -> None:
    """What NumPyro's eager ``initialize_model`` checks (its compiled one cannot raise):
    a finite potential energy and gradient at every chain's initial point ``found``."""
    # on the host: NumPy compiles nothing (each eager jnp operation would)
    if not all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(tuple(found)[1:])):
        raise RuntimeError(
            "Cannot find valid initial parameters: the model's log density or its gradient "
            "is not finite at any point NumPyro's init strategy tried. Check the model, or "
            "start it from `init_params` inside its support."
        )


def _compiled_initialization(initialize, model, keys):
    """``(finder, found, functions)``: ``finder`` the compiled program that finds the
    initial points of a batch of keys (``found``: those of ``keys``), and the model's
    ``(potential_fn, postprocess_fn)`` as ``initialize`` (``initialize_model`` on the
    model) built them in its trace; ``functions`` is None when they hold a value of that
    trace (a support bound or a ``param`` site computed in the model: the caller then sets
    the model up eagerly, as NumPyro does).

    NumPyro's eager set-up runs the model op by op (each operation compiled on its own)
    before its search, and a later chain's compiled finder traces the model again: one
    compiled program for both costs less (``python -m benchmarks.numpyro_wall --setup``)."""
    functions = []

    def find(keys):
        info = initialize(keys)
        functions[:] = [info.potential_fn, info.postprocess_fn]
        return info.param_info

    finder = _CheaplyCompiled(find, _FINDER_ITERATIONS)
    found = finder(keys)
    return finder, found, None if _holds_tracer(functions, stop_at=model) else tuple(functions)


def _holds_tracer(root, stop_at=None, limit: int = 100_000) -> bool:
    """Whether a JAX tracer is reachable from ``root`` through containers, partials,
    closures and object attributes (not through modules, classes, or ``stop_at``, the
    user's model, which existed before any trace); True past ``limit`` objects looked at
    (unknown counts as held)."""
    import types

    seen, stack = {id(stop_at)}, [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, (type, types.ModuleType, str, bytes, np.ndarray)):
            continue
        seen.add(id(obj))
        if len(seen) > limit:
            return True
        if isinstance(obj, jax.core.Tracer):
            return True
        if isinstance(obj, jax.Array):
            continue
        if isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            stack.extend(obj)
        elif isinstance(obj, partial):
            stack.extend((obj.func, obj.args, obj.keywords))
        elif isinstance(obj, types.FunctionType):
            stack.extend(_cell_contents(obj.__closure__ or ()))
            stack.extend((obj.__defaults__ or (), obj.__kwdefaults__ or {}))
        elif isinstance(obj, types.MethodType):
            stack.extend((obj.__self__, obj.__func__))
        else:
            stack.extend(getattr(obj, "__dict__", {}).values())
            for name in getattr(type(obj), "__slots__", ()):
                stack.append(getattr(obj, name, None))
    return False


def _cell_contents(cells) -> list:
    """The values of closure ``cells``, empty cells left out."""
    out = []
    for cell in cells:
        try:
            out.append(cell.cell_contents)
        except ValueError:  # an empty cell
            pass
    return out


#: Adaptive Fisher iterations per unconstrained dimension below which the NumPyro kernels
#: warn. On the paper's GP target (d = 100) the learned preconditioner's Frobenius distance
#: to the truth falls about tenfold over the first 50 d iterations of the Fisher phase and
#: keeps falling until about 150 d (``docs/how_it_works.md``, section 6; Figure 2 of the
#: paper): with fewer, ``R`` is closer to the damped start than to the target's geometry.
MIN_FISHER_ITERATIONS_PER_DIM = 50


def suggested_num_warmup(kernel, dim: int) -> int:
    """The shortest ``num_warmup`` whose Fisher phase gives ``kernel`` (a
    :class:`FisherMALAKernel` or :class:`FisherNUTSKernel`) at least
    :data:`MIN_FISHER_ITERATIONS_PER_DIM` iterations per dimension of a ``dim``-dimensional
    model (``kernel._num_fisher(num_warmup)`` counts them)."""
    needed = MIN_FISHER_ITERATIONS_PER_DIM * int(dim)
    low, high = 1, 2 * needed + 4096
    while kernel._num_fisher(high) < needed:
        high *= 2
    while low < high:  # the Fisher phase grows with num_warmup: bisect
        middle = (low + high) // 2
        low, high = (middle + 1, high) if kernel._num_fisher(middle) < needed else (low, middle)
    return low


def _warn_short_fisher_phase(kernel, position) -> None:
    """A :class:`~fisher_mala.checks.SamplingWarning` (once per kernel) when the Fisher
    phase has fewer than :data:`MIN_FISHER_ITERATIONS_PER_DIM` iterations per dimension."""
    import warnings

    from fisher_mala.checks import SamplingWarning

    dim = sum(int(np.prod(jnp.shape(leaf))) for leaf in jax.tree.leaves(position))
    needed = MIN_FISHER_ITERATIONS_PER_DIM * dim
    num_fisher = kernel._num_fisher(kernel._num_warmup)
    if num_fisher >= needed or getattr(kernel, "_warned_short", False):
        return
    kernel._warned_short = True
    warnings.warn(
        f"{type(kernel).__name__}: the warm-up leaves {num_fisher} iterations to learn the "
        f"Fisher preconditioner of this {dim}-dimensional model; it needs about "
        f"{MIN_FISHER_ITERATIONS_PER_DIM} per dimension ({needed}) to get close to the "
        f"target's geometry. Pass num_warmup={suggested_num_warmup(kernel, dim)} or more to "
        "MCMC (the draws stay valid, the sampler is just less efficient than it can be).",
        SamplingWarning,
        stacklevel=4,
    )


def _checked_init_params(kernel, init_params, like):
    """The user's ``init_params`` (unconstrained, as NumPyro's NUTS takes them), checked:
    the model's sites and shapes, finite values and a finite log density there."""
    if jax.tree.structure(init_params) != jax.tree.structure(like) or any(
        jnp.shape(a) != jnp.shape(b)
        for a, b in zip(jax.tree.leaves(init_params), jax.tree.leaves(like), strict=True)
    ):
        shapes = jax.tree.map(jnp.shape, like)
        raise ValueError(
            "`init_params` must give every latent site of the model, unconstrained, with "
            f"these shapes: {shapes} (as NumPyro's NUTS takes them)."
        )
    init_params = jax.tree.map(lambda a, b: jnp.asarray(a, jnp.result_type(b)), init_params, like)
    if not all(bool(jnp.all(jnp.isfinite(a))) for a in jax.tree.leaves(init_params)):
        raise ValueError("`init_params` contains NaN or inf.")
    if not bool(jnp.isfinite(kernel._potential_fn(init_params))):
        raise ValueError(
            "The model's log density is not finite at `init_params`: start inside the support "
            "(the values are unconstrained: a scale of 1 is 0 there)."
        )
    return init_params


class FisherMALAKernelState(NamedTuple):
    """State of :class:`FisherMALAKernel` (a pytree; ``z`` is NumPyro's sample field).

    Attributes
    ----------
    i
        Transitions made (warm-up included).
    z
        The unconstrained position, in the structure of the model's sites.
    potential_energy
        ``-log pi(z)``.
    fisher_state
        The :class:`~fisher_mala.fisher.FisherMALAState` (``R``, ``sigma^2``, caches).
    accept_prob, mean_accept_prob
        The last M-H probability and its running mean (reset after the warm-up).
    rng_key
        The chain's key.
    """

    i: Array
    z: Any
    potential_energy: Array
    fisher_state: fisher.FisherMALAState
    accept_prob: Array
    mean_accept_prob: Array
    rng_key: Array


class FisherMALAKernel(MCMCKernel):
    """Fisher adaptive MALA (Algorithm 1) for ``numpyro.infer.MCMC``.

    Parameters
    ----------
    model
        A NumPyro model (or give ``potential_fn``).
    potential_fn
        ``z -> -log pi(z)`` on an unconstrained pytree (then ``init_params`` is needed).
    step_size
        The initial ``sigma^2`` (the search starts there, as in ``fm.sample``).
    num_mala_steps
        MALA iterations before the Fisher adaptation starts (Algorithm 1: 500).
    damping
        ``lambda`` of Eq. (8).
    signal, learning_rate
        As in :func:`fm.fisher_mala`.
    target_accept_prob
        The step-size rule's target (0.574).
    find_step_size
        Bracket ``sigma^2`` first (:func:`fisher_mala.adaptations.find_reasonable_step_size`).
    init_strategy
        NumPyro's initialization strategy for the model's sites.
    """

    def __init__(
        self,
        model: Callable | None = None,
        potential_fn: Callable | None = None,
        step_size=1.0,
        num_mala_steps: int = 500,
        damping=fisher.DAMPING,
        signal: str = "rao_blackwell",
        learning_rate: Callable | float | None = None,
        target_accept_prob=MALA_TARGET_ACCEPTANCE,
        find_step_size: bool = True,
        init_strategy=None,
    ):
        if MCMCKernel is object:
            raise ImportError("FisherMALAKernel needs NumPyro: pip install 'fisher_mala[numpyro]'.")
        if (model is None) == (potential_fn is None):
            raise ValueError("Give exactly one of `model` and `potential_fn`.")
        validation.check_positive("step_size", step_size, "It is sigma^2 of Algorithm 1.")
        validation.check_positive("damping", damping, "Algorithm 1 uses lambda = 10.")
        validation.check_probability("target_accept_prob", target_accept_prob)
        if int(num_mala_steps) < 0:
            raise ValueError(f"`num_mala_steps` must be >= 0, got {num_mala_steps}.")
        self._model = model
        self._potential_fn = potential_fn
        self._step_size = step_size
        self._num_mala_steps = int(num_mala_steps)
        self._damping = damping
        self._target = target_accept_prob
        self._find_step_size = bool(find_step_size)
        self._init_strategy = init_to_uniform if init_strategy is None else init_strategy
        self._postprocess_fn = None
        self._initializations = {}  # see `_initialize`
        self._compiled_starts = {}  # see `init`
        self._num_warmup = 0
        self._signal, self._learning_rate = signal, learning_rate
        self._build_kernels()

    def _build_kernels(self):
        centered = self._signal == "centered"
        self._adaptive = fisher.adaptive_step(
            fisher_preconditioner(self._damping, self._learning_rate, centered=centered),
            robbins_monro(self._target, STEP_SIZE_LEARNING_RATE),
            self._signal,
        )
        self._frozen = fisher.build_kernel()

    @property
    def model(self):
        return self._model

    @property
    def sample_field(self):
        return "z"

    @property
    def default_fields(self):
        """Collected by ``MCMC``: ``get_extra_fields()["accept_prob"]`` per draw."""
        return ("z", "accept_prob")

    def get_diagnostics_str(self, state):
        return f"sigma^2 {state.fisher_state.step_size:.2e}. acc. prob={state.mean_accept_prob:.2f}"

    def _logdensity(self, z):
        return -self._potential_fn(z)

    def init(self, rng_key, num_warmup, init_params, model_args, model_kwargs):
        if not is_prng_key(rng_key):
            raise ValueError(
                "FisherMALAKernel runs one chain per key: use chain_method='parallel' or "
                "'sequential' (as NumPyro's BarkerMH)."
            )
        self._num_warmup = int(num_warmup)
        rng_key, key_model, key_search = jax.random.split(rng_key, 3)
        init_params, evaluated = _initialize(self, key_model, init_params, model_args, model_kwargs)
        _warn_short_fisher_phase(self, init_params)
        # the step-size search and the initial state, compiled once for the chains of a
        # run and for later runs with the same data (see `_arguments_key`)
        cache_key = _arguments_key(model_args, model_kwargs)
        if cache_key is None or cache_key not in self._compiled_starts:
            start = _CheaplyCompiled(
                partial(self._start, potential_fn=self._potential_fn), MAX_DOUBLINGS
            )
            self._compiled_starts = {cache_key: (model_args, model_kwargs, start)}
        fisher_state = self._compiled_starts[cache_key][2](key_search, init_params, evaluated)
        zero = jnp.zeros((), fisher_state.logdensity.dtype)
        return FisherMALAKernelState(
            jnp.zeros((), jnp.int32),
            init_params,
            -fisher_state.logdensity,
            fisher_state,
            zero,
            zero,
            rng_key,
        )

    def _start(self, rng_key, params, evaluated, potential_fn):
        """The chain's initial FisherMALA state at ``params``: ``sigma^2`` searched from
        the given one (``find_step_size``; it reuses the gradient at ``params``, as the
        warm-ups of ``fm.sample`` do), ``R_0 = I / sqrt(lambda)``. ``evaluated``: the log
        density and its gradient at ``params`` as NumPyro found them, or None."""
        state, found = _initial_state_and_step(
            rng_key, params, lambda z: -potential_fn(z), self._step_size,
            self._find_step_size, self._target, evaluated,
        )  # fmt: skip
        return fisher.state_from(
            state.position, state.logdensity, state.logdensity_grad, found.step_size,
            self._damping,
        )  # fmt: skip

    def postprocess_fn(self, args, kwargs):
        if self._postprocess_fn is None:
            return identity
        return self._postprocess_fn(*args, **kwargs)

    def _fisher_step(self, key, fs):
        return self._adaptive(key, fs, self._logdensity)

    def _num_fisher(self, num_warmup: int) -> int:
        """Adaptive Fisher iterations of a warm-up of ``num_warmup`` (after the MALA ones)."""
        return num_warmup - min(self._num_mala_steps, num_warmup)

    def _phases(self) -> tuple[Phase, ...]:
        """Algorithm 1 as a schedule on one FisherMALA state, stepped one transition per
        ``sample`` call: the MALA phase (``R_0`` frozen: MALA with ``sigma^2``, by the scale
        invariance of Eq. (7)), the Fisher phase, then sampling with everything frozen."""
        num_mala = min(self._num_mala_steps, self._num_warmup)
        logdensity = self._logdensity
        rule = robbins_monro(self._target, STEP_SIZE_LEARNING_RATE)

        def mala(key, fs):
            new, info = self._frozen(key, fs, logdensity)
            step = rule.update(RobbinsMonroState(fs.step_size), info.acceptance_rate)
            return new._replace(step_size=rule.final(step)), info

        return (
            Phase("mala", num_mala, mala, None),
            Phase(
                "fisher",
                self._num_warmup - num_mala,
                lambda k, fs: self._adaptive(k, fs, logdensity),
                None,
            ),
            Phase("sampling", 0, lambda k, fs: self._frozen(k, fs, logdensity), None),
        )

    def sample(self, state, model_args, model_kwargs):
        i = state.i
        rng_key, key = jax.random.split(state.rng_key)
        fisher_state, info = step_at(self._phases(), i, key, state.fisher_state)
        itr = i + 1
        n = jnp.where(i < self._num_warmup, itr, itr - self._num_warmup)
        alpha = info.acceptance_rate
        mean = state.mean_accept_prob + (alpha - state.mean_accept_prob) / n
        return FisherMALAKernelState(
            itr,
            fisher_state.position,
            -fisher_state.logdensity,
            fisher_state,
            alpha,
            mean,
            rng_key,
        )

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_adaptive"] = state["_frozen"] = None
        state["_initializations"] = {}
        state["_compiled_starts"] = {}
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._build_kernels()


#: Options under which XLA compiles a program without LLVM's optimizations: in about two
#: thirds of the time, and its loops run about three times slower (``python -m
#: benchmarks.numpyro_wall --fast-compile``). A small model's Fisher phase runs in a few
#: hundredths of a second and compiles in seconds, once per run.
FAST_COMPILE_OPTIONS = {"xla_backend_optimization_level": 0}
#: A program whose loops' bodies cost at most this many flops per iteration in all
#: (XLA's cost analysis, which counts each loop's body once), times its iterations, is
#: compiled with :data:`FAST_COMPILE_OPTIONS`: its slower run then costs less than the
#: compilation saves (the two are even near 10^10).
FAST_COMPILE_MAX_FLOPS = 3e9


class _CheaplyCompiled:
    """``jax.jit(fn)``, compiled once per argument shapes with
    :data:`FAST_COMPILE_OPTIONS` where its run is cheap (:data:`FAST_COMPILE_MAX_FLOPS`:
    the loops' flops per iteration, times ``iterations``), as ``jax.jit`` otherwise and
    whenever it is called under a transformation (NumPyro's ``pmap`` or ``vmap`` of
    ``init``), where a compiled program cannot be called."""

    def __init__(self, fn: Callable, iterations: int):
        self._jitted, self._iterations = jax.jit(fn), iterations
        self._compiled = {}

    def __call__(self, *args, **kwargs):
        if not validation.is_concrete((args, kwargs)):
            return self._jitted(*args, **kwargs)
        leaves = jax.tree.leaves((args, kwargs))
        key = (
            jax.tree.structure((args, kwargs)),
            tuple((np.shape(leaf), jnp.result_type(leaf)) for leaf in leaves),
        )
        if key not in self._compiled:
            lowered = self._jitted.lower(*args, **kwargs)
            cost = lowered.cost_analysis() or {}
            flops = float(cost.get("flops", np.inf)) * self._iterations
            fast = flops <= FAST_COMPILE_MAX_FLOPS
            self._compiled[key] = lowered.compile(FAST_COMPILE_OPTIONS if fast else None)
        return self._compiled[key](*args, **kwargs)


def _fisher_phase(warmup, rng_key, params, num_steps: int, evaluated=None):
    """The Fisher phase of ``warmup`` (a :class:`~fisher_mala.whitened_warmup.
    FisherHMCWarmup` of ``num_steps`` iterations) for one chain, and the
    :class:`~fisher_mala.leapfrog_tuning.TuningCarry` its step-size phase starts from
    (``FisherHMCWarmup.run`` up to its step-size phase, which ``FisherNUTSKernel.sample``
    runs)."""

    def call(method, argument, *extra):
        if method == "fisher_stage":  # NumPyro's value and gradient at the start: reused
            return warmup.fisher_stage(rng_key, argument, num_steps, None, evaluated)
        if method == "divergence_probe_stage":  # the step-size phase runs in NumPyro's loop
            return np.zeros(()), None  # no probe: nothing to count, no second phase
        if method != "tuning_stage":
            return getattr(warmup, method)(rng_key, argument, num_steps, None, *extra)
        (fisher_state, _), fisher_info = argument
        metric, settled, plateau = extra
        num_fisher = fisher_info.acceptance_rate.shape[-1]
        num_tune = warmup.tuning_steps(num_steps, num_fisher, settled)
        if plateau or num_fisher + num_tune != num_steps:  # no look under jit ends it early
            raise AssertionError("the Fisher phase under jit runs its full length")
        widen_at = warmup.widen_at(num_tune, fisher_state, plateau)
        widen_iteration = None if widen_at is None else num_fisher + widen_at
        tuning = warmup.tuning_for(plateau)
        return tuning_start(tuning, fisher_state, metric, widen_iteration, widen_at)

    return warmup.staged_run(call, params, num_steps)


def _split_kwargs(model: Callable, options: dict, model_kwargs: dict | None):
    """``(model kwargs, sampler options)``: a keyword the model's signature names goes to
    the model (as NumPyro's ``MCMC.run(key, *args, **kwargs)``), any other to ``fm.sample``."""
    import inspect

    try:
        parameters = inspect.signature(model).parameters
    except (TypeError, ValueError):
        parameters = {}
    named = {
        name
        for name, p in parameters.items()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    }
    to_model = {k: v for k, v in options.items() if k in named}
    clash = sorted(set(to_model) & set(model_kwargs or {}))
    if clash:
        raise ValueError(f"{clash} given both as keywords and in `model_kwargs`: give each once.")
    rest = {k: v for k, v in options.items() if k not in named}
    return {**(model_kwargs or {}), **to_model}, rest


def _pointwise_log_likelihood(model, samples, model_args, model_kwargs) -> dict:
    """``{observed site: (chains, draws, *shape)}``, one draw at a time (bounded memory),
    every draw of every chain in one compiled loop (a loop per chain compiles once per
    chain)."""
    from numpyro.infer import log_likelihood

    out = log_likelihood(model, samples, *model_args, batch_ndims=2, **model_kwargs)
    return {site: np.asarray(value) for site, value in out.items()}


def sample_numpyro(
    rng_key,
    model: Callable,
    *model_args,
    sampler="fisher_mala",
    num_chains: int = 4,
    num_warmup: int = 20_000,
    num_samples: int = 20_000,
    model_kwargs: dict | None = None,
    log_likelihood: bool = True,
    **options,
):
    """:func:`fm.sample` on a NumPyro model; the draws come back named and constrained.

    Called as NumPyro's ``MCMC.run``: ``fm.sample_numpyro(key, model, x, y=y)`` passes
    ``x`` and ``y`` to the model (a keyword the model's signature names goes to the model;
    ``model_kwargs`` works too); every other keyword is an option of :func:`fm.sample`
    or of the sampler.

    The model is initialized by ``numpyro.infer.util.initialize_model`` (one random
    initial point per chain, NumPyro's ``init_to_uniform``); ``fm.sample`` runs on the
    unconstrained sites (a dict, so every sampler and ``options`` apply); each draw is then
    mapped by the model's ``postprocess_fn``: every latent site on its support, and the
    deterministic sites. With ``log_likelihood=True`` the pointwise log-likelihood of
    every observed site at every draw is kept too (``az.loo``, ``az.compare``).
    ``fm.to_arviz(result)`` names the variables as the model does.

    Returns
    -------
    SamplingResult
        ``samples`` is ``{site: (chains, draws, *shape)}``, constrained; the checks and
        ESS of :func:`fm.sample` were computed on the unconstrained draws.
    """
    import dataclasses

    from fisher_mala.sampling import _starts_checked, sample

    if isinstance(num_chains, bool) or not isinstance(num_chains, int) or num_chains < 1:
        raise ValueError(f"`num_chains` must be an integer >= 1, got {num_chains!r}.")
    model_kwargs, options = _split_kwargs(model, options, model_kwargs)
    key_init, key_run = jax.random.split(rng_key)
    # One compiled program finds every chain's initial point (NumPyro's eager set-up runs
    # the model op by op first, each operation compiled on its own: seconds), and its
    # trace gives the model's functions (see `_compiled_initialization`).
    keys = jax.random.split(key_init, num_chains)

    def initialize(keys):
        return initialize_model(
            keys, model, model_args=model_args, model_kwargs=model_kwargs, dynamic_args=False
        )

    _, found, functions = _compiled_initialization(initialize, model, keys)
    if functions is None:  # as NumPyro sets the model up (one more search)
        _, *functions, _ = initialize(keys)
    _check_found(found)
    positions = found.z
    potential_fn, postprocess = functions

    def logdensity(z):
        return -potential_fn(z)

    with _starts_checked():  # NumPyro found every point with a finite value and gradient
        result = sample(
            key_run,
            sampler,
            logdensity,
            positions,
            num_warmup=num_warmup,
            num_samples=num_samples,
            **options,
        )
    # compiled: a model with deterministic sites is replayed, op by op when eager
    constrained = jax.jit(jax.vmap(jax.vmap(postprocess)))(result.samples)
    pointwise = None
    if log_likelihood:
        pointwise = _pointwise_log_likelihood(model, constrained, model_args, model_kwargs)
    return dataclasses.replace(result, samples=constrained, log_likelihood=pointwise)


class FisherNUTSKernelState(NamedTuple):
    """State of :class:`FisherNUTSKernel` (``z`` is NumPyro's sample field).

    Attributes
    ----------
    i
        ``sample`` calls made (warm-up included).
    z
        The unconstrained position, in the structure of the model's sites.
    potential_energy
        ``-log pi(z)``.
    hmc_state
        The :class:`~fisher_mala.whitened_hmc.FisherHMCState` (``R`` frozen).
    step_size
        The leapfrog step tuned by the warm-up.
    accept_prob, mean_accept_prob, diverging, num_steps
        The last transition's acceptance, its running mean over the sampling calls,
        whether it diverged and its number of leapfrog steps.
    rng_key
        The chain's key.
    energy
        The Hamiltonian of the last transition's state (in whitened coordinates: up to
        the chain's constant ``log |det R|``), for ``az.plot_energy`` and BFMI.
    tuning, tuning_key
        The step-size phase's :class:`~fisher_mala.leapfrog_tuning.TuningCarry` (without
        its kernel state: that is ``hmc_state``) and the key its iterations fold in.
    """

    i: Array
    z: Any
    potential_energy: Array
    hmc_state: Any
    step_size: Array
    accept_prob: Array
    mean_accept_prob: Array
    diverging: Array
    num_steps: Array
    rng_key: Array
    energy: Array
    tuning: Any = None
    tuning_key: Any = None


class FisherNUTSKernel(MCMCKernel):
    """Fisher NUTS (or Fisher HMC) for ``numpyro.infer.MCMC``: NUTS in coordinates whitened
    by the ``R`` that FisherMALA learns (see ``docs/fisher_nuts.md``).

    The warm-up of ``fm.sample(..., "fisher_nuts")`` over ``num_warmup`` iterations: its
    Fisher phase (FisherMALA, a loop of its own) runs in ``init``, and the warm-up calls of
    ``sample`` that it stands for are no-ops (``collect_warmup=True`` collects that state
    repeated); the step-size phase (dual averaging of the leapfrog step, the widening of
    ``R`` where due, then the scale normalization) runs in the last warm-up calls of
    ``sample``, one NUTS transition each, as NumPyro's NUTS adapts; every later call is one
    NUTS transition with ``R`` and the step frozen. The step-size phase and the draws are
    the same compiled transition, so NUTS is compiled once (in NumPyro's loop), not once
    for the warm-up and again for the draws.

    Parameters
    ----------
    model, potential_fn, init_strategy
        As in :class:`FisherMALAKernel`.
    algorithm
        ``"nuts"`` or ``"hmc"`` (trajectory length pi/2 in whitened units by default).
    max_num_doublings, num_integration_steps
        The sampling kernel's (as in ``fm.sample``).
    **warmup_options
        Options of :class:`~fisher_mala.whitened_warmup.FisherHMCWarmup` (not ``pooled``).
        ``metric`` defaults to ``"dense"`` and ``stopping_rule`` to ``False`` here: NumPyro
        runs ``init`` under ``jit``/``pmap`` with ``chain_method="parallel"`` or
        ``"vectorized"``, where neither ``metric="auto"`` nor the stopping rule can look at
        ``R`` on the host; pass ``metric="diagonal"`` for a posterior close to independent.
    """

    def __init__(
        self,
        model: Callable | None = None,
        potential_fn: Callable | None = None,
        algorithm: str = "nuts",
        max_num_doublings: int = 10,
        num_integration_steps: int | None = None,
        init_strategy=None,
        **warmup_options,
    ):
        from fisher_mala import whitened_hmc

        if MCMCKernel is object:
            raise ImportError("FisherNUTSKernel needs NumPyro: pip install 'fisher_mala[numpyro]'.")
        if (model is None) == (potential_fn is None):
            raise ValueError("Give exactly one of `model` and `potential_fn`.")
        validation.check_choice("algorithm", algorithm, whitened_hmc.ALGORITHMS)
        if warmup_options.get("pooled"):
            raise ValueError("FisherNUTSKernel learns one R per chain (pooled=False).")
        self._model = model
        self._potential_fn = potential_fn
        self._algorithm = algorithm
        self._max_num_doublings = int(max_num_doublings)
        self._num_integration_steps = num_integration_steps
        # NumPyro runs init under jit / pmap: no choice on the host between compiled parts
        self._warmup_options = {"metric": "dense", "stopping_rule": False, **warmup_options}
        self._init_strategy = init_to_uniform if init_strategy is None else init_strategy
        self._postprocess_fn = None
        self._initializations = {}  # see `_initialize`
        self._num_warmup = 0
        self._warmup()  # BlackJAX's kernels, the options: a clear error now, not in `init`
        self._tuning = None  # see `_step_tuning`
        # the warm-up compiled once for all chains of a run (see `init`)
        self._compiled_warmups = {}

    @property
    def model(self):
        return self._model

    @property
    def sample_field(self):
        return "z"

    @property
    def default_fields(self):
        """Collected by ``MCMC`` as NUTS's are: ``print_summary`` counts divergences,
        ``get_extra_fields()`` has the per-draw statistics."""
        return ("z", "diverging", "num_steps", "accept_prob", "energy")

    def get_diagnostics_str(self, state):
        return (
            f"{state.num_steps} steps of size {state.step_size:.2e}. "
            f"acc. prob={state.mean_accept_prob:.2f}"
        )

    def _logdensity(self, z):
        return -self._potential_fn(z)

    def _warmup(self, logdensity_fn=None):
        """The :class:`~fisher_mala.whitened_warmup.FisherHMCWarmup` that ``init`` runs."""
        from fisher_mala.whitened_warmup import FisherHMCWarmup

        return FisherHMCWarmup(
            logdensity_fn or (lambda z: -jnp.sum(z**2)),
            self._algorithm,
            max_num_doublings=self._max_num_doublings,
            num_integration_steps=self._num_integration_steps,
            **self._warmup_options,
        )

    def _split(self, num_warmup: int):
        """``(Fisher iterations, step-size iterations)`` of a warm-up of ``num_warmup``,
        and the warm-up that splits it (built once: only its split is read)."""
        if getattr(self, "_split_warmup", None) is None:
            self._split_warmup = self._warmup()
        return self._split_warmup.split(num_warmup), self._split_warmup

    def _num_fisher(self, num_warmup: int) -> int:
        """Adaptive Fisher iterations of a warm-up of ``num_warmup`` (after the MALA ones)."""
        (num_fisher, _), warmup = self._split(num_warmup)
        return num_fisher - min(warmup.fisher.num_mala_steps, num_fisher)

    def init(self, rng_key, num_warmup, init_params, model_args, model_kwargs):
        if not is_prng_key(rng_key):
            raise ValueError(
                "FisherNUTSKernel runs one chain per key: use chain_method='parallel' or "
                "'sequential'."
            )
        if int(num_warmup) < 10:
            raise ValueError(f"FisherNUTSKernel needs num_warmup >= 10, got {num_warmup}.")
        self._num_warmup = int(num_warmup)
        rng_key, key_model, key_warmup = jax.random.split(rng_key, 3)
        init_params, evaluated = _initialize(self, key_model, init_params, model_args, model_kwargs)
        # compiled once for the chains of a run and for later runs with the same data (the
        # arguments are kept with it: see `_arguments_key`)
        _warn_short_fisher_phase(self, init_params)
        cache_key = (self._num_warmup, _arguments_key(model_args, model_kwargs))
        if cache_key[1] is None or cache_key not in self._compiled_warmups:
            warmup = self._warmup(lambda z, potential=self._potential_fn: -potential(z))
            num = self._num_warmup
            run = _CheaplyCompiled(partial(_fisher_phase, warmup, num_steps=num), num)
            self._compiled_warmups = {cache_key: (model_args, model_kwargs, run)}
        run = self._compiled_warmups[cache_key][2]
        carry = run(key_warmup, init_params, evaluated=evaluated)
        state = carry.state
        zero = jnp.zeros((), state.logdensity.dtype)
        return FisherNUTSKernelState(
            jnp.zeros((), jnp.int32),
            state.position,
            -state.logdensity,
            state,
            jnp.asarray(carry.initial_step, state.logdensity.dtype),
            zero,
            zero,
            jnp.zeros((), bool),
            jnp.zeros((), jnp.int32),
            rng_key,
            -state.logdensity,
            carry._replace(state=None),
            jax.random.split(key_warmup)[1],  # as the step-size phase of `fm.sample`'s
        )

    def postprocess_fn(self, args, kwargs):
        if self._postprocess_fn is None:
            return identity
        return self._postprocess_fn(*args, **kwargs)

    def _step_tuning(self):
        """The step-size phase's :class:`~fisher_mala.leapfrog_tuning.LeapfrogTuning`
        (under ``jit`` no stopping rule looks, so never the plateau's)."""
        if getattr(self, "_tuning", None) is None:
            self._tuning = self._warmup(self._logdensity).tuning_for(plateau=False)
        return self._tuning

    def sample(self, state, model_args, model_kwargs):
        num_fisher = self._split(self._num_warmup)[0][0]

        def fisher_phase_done(state):  # its iterations ran in `init`
            return state._replace(i=state.i + 1)

        return jax.lax.cond(state.i < num_fisher, fisher_phase_done, self._transition, state)

    def _transition(self, state):
        """One NUTS (HMC) transition: of the step-size phase (its last iteration also
        freezes the step and rescales ``R``) or of the draws, one kernel call for both."""
        tuning, carry, i = self._step_tuning(), state.tuning, state.i
        num_fisher, num_tune = self._split(self._num_warmup)[0]
        tune = i < self._num_warmup
        hmc_state, da, moments = state.hmc_state, carry.dual_averaging, carry.moments
        sum_sq, count = carry.sum_sq, carry.count
        if moments is not None:  # the draws' sums, and the widening where due
            # NumPyro compiles this transition anew for every chain: the widening's
            # linear algebra runs on the host, compiled nowhere
            phase = _step_size_phase(
                tuning, hmc_state, num_tune, None, widening=True, widen=widen_on_host
            )
            inner = (hmc_state, da, sum_sq, count, moments, carry.widen_iteration)
            hmc_state, da, sum_sq, count, moments, _ = phase.before_step(inner, i)
        dtype = hmc_state.whitened_grad.dtype
        # the draws' keys split the chain's key, the step-size phase's fold in its own
        rng_key, key_draw = jax.random.split(state.rng_key)
        rng_key, key = jax.tree.map(
            lambda a, b: jax.lax.select(tune, a, b),
            (state.rng_key, jax.random.fold_in(state.tuning_key, i)), (rng_key, key_draw),
        )  # fmt: skip
        step = jnp.where(tune, jnp.exp(da.log_step_size).astype(dtype), state.step_size)
        steps = self._num_integration_steps
        if steps is None and self._algorithm == "hmc":
            dim = hmc_state.whitened_grad.shape[-1]
            tuned = jnp.ceil(TRAJECTORY_LENGTH * jnp.sqrt(dim * count / sum_sq) / step)
            tuned = jnp.clip(tuned, 1, 2**self._max_num_doublings).astype(jnp.int32)
            frozen = jnp.maximum(jnp.ceil(TRAJECTORY_LENGTH / step), 1).astype(jnp.int32)
            steps = jnp.where(tune, tuned, frozen)
        hmc_state, info = tuning.kernel(
            key, hmc_state, tuning.logdensity_fn, step, steps, self._max_num_doublings
        )
        _, da_update, da_final = tuning.dual_averaging
        tuned = (da_update(da, info.acceptance_rate), sum_sq + jnp.sum(hmc_state.whitened_grad**2),
                 count + 1)  # fmt: skip
        da, sum_sq, count = jax.tree.map(
            lambda new, old: jnp.where(tune, new, old), tuned, (da, sum_sq, count)
        )
        step = jnp.where(tune, jnp.exp(da.log_step_size).astype(dtype), state.step_size)

        def freeze(parts):  # the end of the warm-up: tuning_finish's step and R
            hmc_state, _ = parts
            frozen, k = normalize(hmc_state, sum_sq / count)
            return frozen, jnp.asarray(da_final(da), dtype) / k

        hmc_state, step = jax.lax.cond(
            i == self._num_warmup - 1, freeze, lambda parts: parts, (hmc_state, step)
        )
        n = i + 1 - jnp.where(tune, num_fisher, self._num_warmup)  # in this phase
        alpha = info.acceptance_rate.astype(state.mean_accept_prob.dtype)
        mean = state.mean_accept_prob + (alpha - state.mean_accept_prob) / n
        return FisherNUTSKernelState(
            i + 1,
            hmc_state.position,
            -hmc_state.logdensity,
            hmc_state,
            step,
            alpha,
            mean,
            jnp.asarray(info.is_divergent),
            jnp.asarray(info.num_integration_steps, jnp.int32),
            rng_key,
            jnp.asarray(info.energy, state.energy.dtype),
            carry._replace(dual_averaging=da, sum_sq=sum_sq, count=count, moments=moments),
            state.tuning_key,
        )

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_tuning"] = None
        state["_compiled_warmups"] = {}
        state["_initializations"] = {}
        state["_split_warmup"] = None
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
