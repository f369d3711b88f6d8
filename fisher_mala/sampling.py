"""One call for the paper's whole protocol: ``fm.sample`` (layer 5).

``sample`` runs every chain's warm-up (adaptation) and then its sampling phase with the
tuned parameters frozen, vmapped over chains (sharded over local devices along a
``"chain"`` mesh axis; on one CPU device, in groups run from threads, one per core:
:mod:`fisher_mala.chain_threads`), each phase one jit-compiled ``lax.scan``. Compile time is
measured apart from run time (ahead-of-time ``lower().compile()``).

Samplers are named by string (:mod:`fisher_mala.registry`; :func:`register_sampler`
adds more), or given as a :class:`~fisher_mala.registry.Sampler` (a warm-up and a
kernel). A BlackJAX-style ``SamplingAlgorithm(init, step)`` is also accepted: its
warm-up is a plain burn-in of ``num_warmup`` steps without adaptation. The driver names
no sampler: what it needs, each entry of the registry declares.
"""

import contextlib
import contextvars
import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from fisher_mala import checks, registry, run_checkpoint, sinks, square_roots, validation
from fisher_mala.base import ArrayTree, SamplingAlgorithm
from fisher_mala.chain_threads import GroupedExecutable, chain_groups
from fisher_mala.progress import ProgressBar, scan_with_progress
from fisher_mala.registry import Sampler, register_sampler, samplers
from fisher_mala.schedule import WarmupInfo, WarmupParameters
from fisher_mala.sharding import put_global, sqrt_precond_sharding

__all__ = ["Sampler", "SamplingResult", "map_over_chains", "register_sampler", "samplers", "sample"]


def _init_with_key(algorithm, position, rng_key):
    """``algorithm.init(position, rng_key)`` if it takes a key (BlackJAX's do), else without."""
    try:
        parameters = inspect.signature(algorithm.init).parameters
    except (TypeError, ValueError):  # pragma: no cover - builtins without a signature
        return algorithm.init(position)
    positional = [
        p
        for p in parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
    ]
    if len(positional) >= 2 or any(p.kind == p.VAR_POSITIONAL for p in positional):
        return algorithm.init(position, rng_key)
    return algorithm.init(position)


def _info_field(info, name, default):
    value = getattr(info, name, None)
    return default if value is None else value


class _BurnIn:
    """Warm-up of a user-supplied ``SamplingAlgorithm``: steps without adaptation."""

    def __init__(self, algorithm):
        self.algorithm = algorithm

    def run(self, rng_key, position, num_steps, progress=None):
        key_init, rng_key = jax.random.split(rng_key)
        state = _init_with_key(self.algorithm, position, key_init)

        def body(state, iteration):
            return self.algorithm.step(jax.random.fold_in(rng_key, iteration), state)

        state, info = scan_with_progress(body, state, num_steps, 0, progress)
        rates = _info_field(info, "acceptance_rate", jnp.full(num_steps, jnp.nan))
        accepted = _info_field(info, "is_accepted", jnp.ones(num_steps, bool))
        finite = _info_field(info, "proposal_is_finite", jnp.ones(num_steps, bool))
        evals = jnp.sum(_info_field(info, "num_integration_steps", jnp.ones(num_steps, int)))
        out = WarmupInfo(rates, accepted, finite, jnp.nan, evals, None)
        return (state, WarmupParameters(jnp.nan, None)), out


@dataclass
class SamplingResult:
    """What :func:`sample` returns.

    Attributes
    ----------
    sampler
        The sampler's name.
    samples
        Draws in the position's structure, each leaf ``(chains, draws, ...)``.
    sample_stats
        Per-draw ``logdensity``, ``acceptance_rate``, ``is_accepted``,
        ``proposal_is_finite``, ``is_divergent``, ``num_grad_evals`` (since the previous
        kept draw) and, for Fisher NUTS / HMC, ``energy`` and ``tree_depth`` (each
        ``(chains, draws)``).
    parameters
        The tuned per-chain :class:`~fisher_mala.schedule.WarmupParameters`.
    warmup_info
        Per-chain :class:`~fisher_mala.schedule.WarmupInfo`.
    final_state
        The per-chain state after the last step (resume from it).
    num_grad_evals
        Gradient evaluations per chain, warm-up and step-size search included.
    compile_seconds, warmup_seconds, sampling_seconds
        Wall-clock times; the run times exclude compilation.
    num_warmup, num_samples, thinning
        The protocol.
    devices
        The devices the chains ran on.
    target_acceptance
        The acceptance rate the warm-up tuned the step size towards (``None`` for a
        custom algorithm).
    rejects_whole_proposals
        Whether a rejection leaves a chain in place (Metropolis-Hastings kernels; not
        NUTS), for the ``rejection_streak`` check.
    reports_divergences
        Whether the sampler integrates trajectories and flags divergent ones (HMC,
        NUTS), for the ``divergences`` check.
    tuned
        Whether a warm-up tuned the parameters (``False`` for a custom algorithm's
        burn-in), for the checks of the tuned step size.
    nonfinite_proposals
        ``{"mean": (chains, d), "count": (chains,)}``: where the sampling phase's proposals
        with a non-finite log density or gradient were, on average (flat positions; MALA-type
        kernels), or ``None``.
    diagnosis
        :func:`fm.diagnose`'s :class:`~fisher_mala.checks.Diagnosis` of the run when
        ``diagnose=True`` (``fm.summary`` reuses it), else ``None``.
    coords, dims
        ArviZ's coordinates and each variable's dimension names, when the model declares
        them (:func:`fm.sample_pymc`); :func:`fm.to_arviz` passes them on.
    log_likelihood
        ``{observed site: (chains, draws, *shape)}``: the pointwise log-likelihood of every
        draw (:func:`fm.sample_numpyro`, :func:`fm.sample_pymc`), for ``az.loo`` and
        ``az.compare``; else ``None``.
    """

    sampler: str
    samples: ArrayTree
    sample_stats: dict[str, Any]
    parameters: WarmupParameters
    warmup_info: WarmupInfo
    final_state: Any
    num_grad_evals: np.ndarray
    compile_seconds: float
    warmup_seconds: float
    sampling_seconds: float
    num_warmup: int
    num_samples: int
    thinning: int
    devices: list[str] = field(default_factory=list)
    target_acceptance: float | None = None
    rejects_whole_proposals: bool = False
    reports_divergences: bool = False
    tuned: bool = True
    diagnosis: Any = None
    nonfinite_proposals: Any = None
    coords: dict | None = None
    dims: dict | None = None
    log_likelihood: dict | None = None

    @property
    def num_chains(self) -> int:
        return int(np.shape(self.num_grad_evals)[0])


def _check_count(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise ValueError(f"`{name}` must be an integer >= {minimum}, got {value!r}.")
    return int(value)


#: True inside :func:`_starts_checked`: the caller found the initial positions with a
#: finite log density and gradient (NumPyro's ``initialize_model`` checks both), so
#: ``fm.sample`` does not compile a program to evaluate them again.
_STARTS_CHECKED = contextvars.ContextVar("starts_checked", default=False)


@contextlib.contextmanager
def _starts_checked():
    """Within it, :func:`sample` trusts that the log density and its gradient are finite
    at the initial positions (checked by whoever found them: ``fm.sample_numpyro``)."""
    token = _STARTS_CHECKED.set(True)
    try:
        yield
    finally:
        _STARTS_CHECKED.reset(token)


def _check_initial_positions(logdensity_fn, initial_positions, data=None) -> int:
    """The number of chains, after checking every chain's start: its shape, and its log
    density and gradient finite (``logdensity_fn(position, data)`` where ``data`` is given:
    an argument of the compiled check, never a constant in it, as the data of a run over
    several processes cannot be)."""
    validation.check_position(initial_positions)
    shapes = [jnp.shape(leaf) for leaf in jax.tree.leaves(initial_positions)]
    if any(len(s) == 0 for s in shapes):
        raise ValueError(
            "`initial_positions` needs a leading chain axis: pass shape (num_chains, ...) "
            "(e.g. `x[None]` for one chain)."
        )
    num_chains = shapes[0][0]
    if any(s[0] != num_chains for s in shapes):
        raise ValueError(
            "The leaves of `initial_positions` disagree on the number of chains "
            f"(leading axes {[s[0] for s in shapes]}); give every leaf the same first axis."
        )
    if num_chains < 1:
        raise ValueError("`initial_positions` has no chains (leading axis of size 0).")
    first = jax.tree.map(lambda x: x[0], initial_positions)
    validation.check_logdensity(_bind(logdensity_fn, data), first, evaluate=False)  # shape, dtype
    if _STARTS_CHECKED.get():
        return int(num_chains)
    # Every chain's value and gradient in one small compiled program: run op by op, a
    # model's log density compiles each of its operations on its own (seconds for a
    # NumPyro model), before the sampler's own compilation.
    evaluate = jax.vmap(
        jax.value_and_grad(lambda x, data: _bind(logdensity_fn, data)(x)), in_axes=(0, None)
    )
    values, grads = jax.jit(evaluate)(initial_positions, data)
    bad = np.flatnonzero(~np.isfinite(np.asarray(values)))
    if bad.size:
        raise ValueError(
            f"`logdensity_fn` is not finite at the initial positions of chains {bad.tolist()}; "
            "start every chain inside the support."
        )
    finite = np.ones(num_chains, bool)
    for g in jax.tree.leaves(grads):
        finite &= np.isfinite(np.asarray(g)).reshape(num_chains, -1).all(axis=1)
    if not finite.all():
        raise ValueError(
            "The gradient of `logdensity_fn` contains NaN or inf at the initial positions of "
            f"chains {np.flatnonzero(~finite).tolist()}; start every chain at a point where "
            "the log density is differentiable."
        )
    return int(num_chains)


def _chain_mesh(num_chains: int, mesh: Mesh | None) -> Mesh | None:
    """The mesh whose ``"chain"`` axis splits the chains, or ``None`` for one device."""
    if mesh is not None:
        if not isinstance(mesh, Mesh):
            raise TypeError(
                f"`mesh` must be a jax.sharding.Mesh with a 'chain' axis, got {mesh!r}; e.g. "
                "jax.make_mesh((jax.device_count(),), ('chain',)), or leave it out to split "
                "the chains over all devices."
            )
        if "chain" not in mesh.axis_names:
            raise ValueError(
                f"`mesh` needs a 'chain' axis (its axes are {mesh.axis_names}); give it size 1 "
                "to run every chain on every device of the other axes."
            )
        if num_chains % mesh.shape["chain"]:
            raise ValueError(
                f"The mesh's 'chain' axis (size {mesh.shape['chain']}) does not divide the "
                f"{num_chains} chains."
            )
        return mesh
    devices = jax.devices()  # every process's devices under jax.distributed
    if len(devices) < 2 or num_chains % len(devices):
        return None
    return Mesh(np.asarray(devices), ("chain",))


def _shard(tree, mesh: Mesh | None):
    """Place the chains (leading axis) over the mesh's ``"chain"`` axis."""
    if mesh is None:
        return tree
    return put_global(tree, NamedSharding(mesh, PartitionSpec("chain")))


def _to_host(tree):
    """Every process gets the whole of every array (chains of all processes)."""
    if jax.process_count() == 1:
        return tree
    from jax.experimental import multihost_utils

    def gather(leaf):
        if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
            if jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
                return leaf  # keys stay where they are
            return multihost_utils.process_allgather(leaf, tiled=True)
        return leaf

    return jax.tree.map(gather, tree)


#: Largest dimension at which ``chain_method="auto"`` runs trajectory samplers (NUTS, HMC)
#: one chain after the other on a CPU. Below it a batch of trees waits for its longest tree
#: and the batched products are too small to pay (``benchmarks/chain_method.py``, the
#: Fisher NUTS page).
SEQUENTIAL_MAX_DIM = 64
#: With at most ``SMALL_BATCH`` chains per device, sequential up to this dimension: at
#: d = 100 with two chains per device, batching gains 4-24% on targets with costly
#: products (Caravan's 5822-row likelihood, the GP's triangular solve) and loses 2.5x on a
#: cheap one (the diagonal Gaussian); with four chains per device batching gains 1.4-2.5x
#: on the costly ones, so the larger bound needs the small batch.
SEQUENTIAL_MAX_DIM_SMALL_BATCH = 128
SMALL_BATCH = 2
#: Above ``SEQUENTIAL_MAX_DIM_SMALL_BATCH`` coordinates, ``chain_method="auto"`` runs NUTS
#: and HMC on a CPU one chain after the other unless the log density reads at least this
#: many bytes of arrays that every chain shares (its captured constants and ``data``): a
#: batch of chains reads those once per leapfrog step, one chain at a time once per chain.
#: Below, the batch's own cost wins: its while loops select every carried vector and
#: checkpoint row of every chain at every step (Fisher NUTS with ``rank=8``: 6.7, 2.2 and
#: 1.6 times the time per gradient of one chain at a time on a diagonal-plus-low-rank
#: Gaussian at d = 1000, a hierarchical logistic regression at d = 1005 with 0.3 MB of
#: data, the Gaussian at d = 10 000; 0.42 times on a latent Gaussian process whose log
#: density multiplies by an 8 MB constant: ``benchmarks/chain_method.py --large``). The
#: bound is where reading the data three times more (four chains) costs about the batch's
#: extra 70 µs per chain and step at 25 GB/s.
SHARED_BYTES_FOR_BATCH = 2 << 20
#: ... and at least this many words (of the position's dtype) per coordinate: the batch's
#: selects copy every chain's carried vectors and checkpoint rows, so its extra cost grows
#: with ``d``. Four batched chains' lockstep leapfrog step of the same Gaussian against one
#: chain's (``benchmarks/nuts_step_cost.py``, float64): 1626 against 265 µs at d = 10 000,
#: 28.2 against 3.6 ms at d = 100 000, i.e. about 140 µs and 3.4 ms more per chain and
#: step, the time to read about 60 and 140 float64 words per coordinate three more times
#: at 25 GB/s. Up to about d = 4000 the absolute bound governs.
SHARED_WORDS_PER_COORDINATE_FOR_BATCH = 64
#: Largest dimension at which batched chains (``chain_method="vectorized"``) of one XLA:CPU
#: device run in groups from threads (:mod:`fisher_mala.chain_threads`). Up to d = 100 the
#: groups gave 1.3-1.9 times the min ESS per second of one program (Fisher NUTS,
#: FisherMALA); at d = 785 (FisherMALA on mnist56, a dense R) one program was faster, its
#: batched products already spread over the cores by XLA (``benchmarks/chain_threads.py``).
#: Chains run one after the other (``"sequential"``) are grouped at every dimension, as one
#: chain's matrix-vector products stay on one core: the groups gave 1.1-1.8 times the min
#: ESS per second of one program for Fisher NUTS at d = 1000 (dense R) and d = 10 000
#: (``rank=8``), and for FisherMALA on mnist56 run sequentially (37 MB of data, a dense R),
#: the same draws (``benchmarks/chain_threads.py --large``).
GROUPS_MAX_DIM = 128


def _dim(initial_positions) -> int:
    """Coordinates per chain (leading axis of every leaf is the chain)."""
    return sum(int(np.prod(jnp.shape(x)[1:])) for x in jax.tree.leaves(initial_positions))


def _groups(
    num_chains: int, initial_positions, mesh: Mesh | None, chain_method: str = "vectorized"
) -> int:
    """Groups of chains run at once from threads: on one XLA:CPU device (no mesh), for
    sequential chains at every dimension and for batched ones up to
    :data:`GROUPS_MAX_DIM` coordinates, else one program."""
    if mesh is not None:
        return 1
    if chain_method != "sequential" and _dim(initial_positions) > GROUPS_MAX_DIM:
        return 1
    return chain_groups(num_chains)


def _shared_bytes(logdensity_fn, initial_positions, data=None) -> int:
    """Bytes of the arrays every chain's log density reads alike: the constants its trace
    captures (data closed over) and ``data`` (one trace of one chain's log density)."""
    position = jax.tree.map(lambda x: x[0], initial_positions)
    args = (position,) if data is None else (position, data)  # data an argument, not a const
    consts = jax.make_jaxpr(logdensity_fn)(*args).consts
    arrays = [c for c in consts if hasattr(c, "dtype")] + jax.tree.leaves(data)
    return sum(int(np.size(a)) * np.dtype(a.dtype).itemsize for a in arrays)


def _auto_chain_method(
    trajectory: bool, initial_positions, mesh: Mesh | None = None, shared=lambda: 0
) -> str:
    """``"sequential"`` for NUTS / HMC (``trajectory``) on a CPU in small dimension, or
    above ``SEQUENTIAL_MAX_DIM_SMALL_BATCH`` when the chains share fewer than
    ``SHARED_BYTES_FOR_BATCH`` bytes of data or fewer than
    ``SHARED_WORDS_PER_COORDINATE_FOR_BATCH`` words per coordinate (``shared()``, called
    only then), else ``"vectorized"``. ``mesh`` is the chain placement
    (:func:`_chain_mesh`): it gives the chains per device.
    """
    dim = _dim(initial_positions)
    on_cpu = jax.default_backend() == "cpu"
    if not on_cpu or not trajectory:
        return "vectorized"
    num_chains = int(jnp.shape(jax.tree.leaves(initial_positions)[0])[0])
    per_device = num_chains // (mesh.shape["chain"] if mesh is not None else 1)
    bound = SEQUENTIAL_MAX_DIM_SMALL_BATCH if per_device <= SMALL_BATCH else SEQUENTIAL_MAX_DIM
    if dim <= bound:
        return "sequential"
    itemsize = np.dtype(jax.tree.leaves(initial_positions)[0].dtype).itemsize
    bound = max(SHARED_BYTES_FOR_BATCH, SHARED_WORDS_PER_COORDINATE_FOR_BATCH * itemsize * dim)
    if dim > SEQUENTIAL_MAX_DIM_SMALL_BATCH and shared() < bound:
        return "sequential"
    return "vectorized"


def map_over_chains(
    fn, *args, chain_method: str = "vectorized", mesh: Mesh | None = None, shared=None
):
    """Apply ``fn`` to every chain (leading axis of ``args``), on every device of ``mesh``.

    ``"vectorized"`` batches the chains (``jax.vmap``); ``"sequential"`` runs them one after
    the other (``jax.lax.map``). With a ``mesh``, each slice of its ``"chain"`` axis runs its
    own chains with ``jax.shard_map`` (manual over ``"chain"`` only) and no communication
    inside the loops; under plain ``jit`` sharding XLA would synchronize the devices at
    every iteration of every loop. The mesh's other axes stay automatic: arrays sharded
    over them (data rows, ``R``'s rows) are partitioned by XLA, which adds the reductions.
    ``shared`` (any pytree, e.g. a data set) is passed whole to every call,
    ``fn(*chain_args, shared)``, as an argument rather than a captured constant.
    """
    num_mapped = len(args)
    if shared is not None:
        args = (*args, shared)

    def local(*a):
        chain_args, common = a[:num_mapped], a[num_mapped:]
        if chain_method == "vectorized":
            return jax.vmap(lambda *c: fn(*c, *common))(*chain_args)
        return jax.lax.map(lambda c: fn(*c, *common), chain_args)

    if mesh is None:
        return local(*args)
    chains = PartitionSpec("chain")
    specs = (chains,) * num_mapped + (PartitionSpec(),) * (len(args) - num_mapped)
    return jax.shard_map(
        local,
        mesh=mesh,
        in_specs=specs,
        out_specs=chains,
        axis_names={"chain"},
        check_vma=False,
    )(*args)


def _compile(fn, *args, groups: int = 1, mapped: int = 0):
    """``(executable, seconds)``: ``fn`` compiled ahead of time for ``args``; with
    ``groups > 1``, for one group of the chains of its first ``mapped`` arguments, the
    groups run from threads (:class:`~fisher_mala.chain_threads.GroupedExecutable`)."""
    start = time.perf_counter()
    if groups > 1:
        compiled = GroupedExecutable(fn, args, groups, mapped)
    else:
        compiled = jax.jit(fn).lower(*args).compile()
    return compiled, time.perf_counter() - start


def _run(compiled, *args):
    """``(outputs, seconds)`` of a compiled call, waited for."""
    start = time.perf_counter()
    out = jax.block_until_ready(compiled(*args))
    return out, time.perf_counter() - start


def _compile_and_run(fn, *args, groups: int = 1, mapped: int = 0):
    compiled, compile_seconds = _compile(fn, *args, groups=groups, mapped=mapped)
    out, run_seconds = _run(compiled, *args)
    return out, compile_seconds, run_seconds


#: The sampling phase runs in compiled blocks whose kept draws take at most this many
#: bytes on the device (all of them in one block when they fit).
BLOCK_BYTES = 16 << 20
#: Bytes of sample statistics per draw and chain (log density, acceptance rate, three
#: flags, gradient count).
STAT_BYTES_PER_DRAW = 24


def _even_block(num_draws: int, largest: int) -> int:
    """Draws per block: ``num_draws`` if it fits, else the largest divisor of ``num_draws``
    up to ``largest`` (one executable for every block), unless that is under a quarter of
    ``largest`` (then ``largest``: a second executable for the last block)."""
    if num_draws <= largest:
        return num_draws
    candidates = np.arange(max(1, largest // 4), largest + 1)
    divisors = candidates[num_draws % candidates == 0]
    return int(divisors[-1]) if divisors.size else largest


def _check_memory(keep, positions, num_chains, num_draws, output, diagnose):
    """``(draws per block of the sampling phase, bytes of the kept draws)``, after checking
    that the kept draws fit in the free memory (an error naming the size and the ways out,
    before the warm-up)."""
    one = jax.tree.map(lambda x: x[0], positions)
    if keep is not None:
        if not callable(keep):
            raise TypeError(f"`keep` must be a function of the position, got {keep!r}.")
        try:
            one = jax.eval_shape(keep, one)
        except Exception as err:
            raise ValueError(f"`keep` failed on one chain's position: {err}") from err
    draw_bytes = sum(
        int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(one)
    )
    per_draw = num_chains * (draw_bytes + STAT_BYTES_PER_DRAW)
    block = _even_block(num_draws, max(1, BLOCK_BYTES // per_draw))
    total = sinks.estimate_bytes(num_chains, num_draws, draw_bytes, STAT_BYTES_PER_DRAW)
    host_need = per_draw * block if output is not None else total * (1.125 if diagnose else 1.0)
    host, device = sinks.available_bytes()
    device_need = 2 * per_draw * block
    short = []
    if host is not None and host_need > host:
        short.append(f"{host_need / 1e9:.2f} GB of host memory, {host / 1e9:.2f} GB free")
    if device is not None and device_need > device:
        short.append(f"{device_need / 1e9:.2f} GB of device memory, {device / 1e9:.2f} GB free")
    if short:
        checks_too = "; diagnose=True needs an eighth as much again" if host_need > total else ""
        ways = (
            "`thinning=k` keeps every k-th draw; fewer `num_samples`; `keep=lambda x: ...` "
            "keeps a function of the position (a few coordinates, a prediction); "
            "`output='run_dir'` writes the draws to files block by block (the host then "
            "holds one block); `diagnose=False`"
        )
        raise MemoryError(
            f"The kept draws need {total / 1e9:.2f} GB ({num_chains} chains x {num_draws} "
            f"draws x ({draw_bytes} bytes of position + {STAT_BYTES_PER_DRAW} of "
            f"statistics){checks_too}): {'; '.join(short)}. Ways out: {ways}."
        )
    return block, total


class _Plan(NamedTuple):
    """What one call of :func:`sample` runs, resolved from its ``sampler`` argument."""

    name: str
    spec: Sampler
    options: dict
    custom: bool = False  # a user's SamplingAlgorithm: burn-in without adaptation

    def kernels(self, logdensity, chosen=None):
        """The warm-up and the sampling step for ``logdensity``; ``chosen``: options of
        the sampling step that the warm-up chose (its ``sampling_options``), over the
        user's.

        Also called while the loops are traced (with the data bound): the options' checks
        (e.g. a schedule probed at a few iterations) then still run eagerly.
        """
        with jax.ensure_compile_time_eval():
            return (
                self.spec.warmup(logdensity, **self.options),
                self.spec.sampling_kernel(logdensity, **{**self.options, **(chosen or {})}),
            )

    def grad_evals_per_step(self, dim: int):
        per_step = self.spec.grad_evals_per_step
        return per_step(dim, **self.options) if callable(per_step) else per_step


def _custom_plan(algorithm, options, data) -> _Plan:
    if not (
        callable(getattr(algorithm, "init", None)) and callable(getattr(algorithm, "step", None))
    ):
        raise TypeError(
            "`sampler` must be a name from fm.samplers(), an fm.Sampler, or an algorithm with "
            f"`init(position)` and `step(rng_key, state)` (e.g. blackjax.nuts(...)); got "
            f"{algorithm!r}."
        )
    if data is not None:
        raise ValueError(
            "`data` needs a named sampler (the algorithm's log density is already built)."
        )
    if options:
        raise TypeError(f"Options {sorted(options)} are not used with a custom algorithm.")

    def sampling_kernel(logdensity_fn):
        return lambda key, state, parameters: algorithm.step(key, state)

    spec = Sampler(lambda logdensity_fn: _BurnIn(algorithm), sampling_kernel, None, False, True)
    return _Plan("custom", spec, {}, custom=True)


def _plan(sampler, options: dict, data, logdensity_fn) -> _Plan:
    """Resolve ``sampler`` (a name, a :class:`Sampler` or an algorithm) and its options."""
    options = dict(options)
    if isinstance(sampler, Sampler):
        name, spec = "custom_sampler", sampler
    elif isinstance(sampler, str):
        name, spec = sampler, registry.get(sampler)
    else:
        return _custom_plan(sampler, options, data)
    if "pooled" in options:
        if spec.pooled is None:
            raise ValueError(
                "`pooled` is available for sampler='fisher_mala', 'fisher_nuts' and "
                "'fisher_hmc' only."
            )
        if spec.pooled != "option":
            if options.pop("pooled"):
                name, spec = spec.pooled, registry.get(spec.pooled)
    plan = _Plan(name, spec, options)
    try:
        plan.kernels(logdensity_fn if data is None else _bind(logdensity_fn, data))
    except TypeError as err:
        raise TypeError(f"Invalid option for sampler {name!r}: {err}") from err
    return plan


def _in_positions_dtype(logdensity_fn, initial_positions, data=None):
    """``logdensity_fn``, its value cast to the positions' dtype where it returns another:
    a float32 position whose log density computes in float64 (NumPy float64 constants in
    it, with x64 enabled) would otherwise turn the kernels' acceptance probabilities and
    the adaptation's sums float64 inside loops whose state is float32. The same function
    where the dtypes agree."""
    first = jax.tree.map(lambda x: x[0], initial_positions)
    dtype = jnp.result_type(*jax.tree.leaves(first))
    out = jax.eval_shape(_bind(logdensity_fn, data), first)
    if out.dtype == dtype or not jnp.issubdtype(dtype, jnp.floating):
        return logdensity_fn
    if data is None:
        return lambda position: jnp.asarray(logdensity_fn(position), dtype)
    return lambda position, data: jnp.asarray(logdensity_fn(position, data), dtype)


def _bind(logdensity_fn, data):
    """The log density of one position (``data`` given as an argument, if any)."""
    if data is None:
        return logdensity_fn
    return lambda position: logdensity_fn(position, data)


#: Per-draw statistics kept when the kernel's info has them.
OPTIONAL_STATS = ("energy", "tree_depth")


def _draws_of(step, key, state, params, num_draws, thinning, per_step, bar, start=0, keep=None):
    """Scan ``num_draws`` times ``thinning`` steps from draw ``start``; keep every
    ``thinning``-th state (or ``keep(position)`` of it). Also sums the non-finite
    proposals of every step, where the kernel reports them (``info.proposal``)."""
    shapes = jax.eval_shape(lambda s: step(jax.random.fold_in(key, 0), s, params)[1], state)
    proposal_shape = getattr(shapes, "proposal", None)
    finite_shape = getattr(shapes, "proposal_is_finite", None)
    tracked = proposal_shape is not None and finite_shape is not None

    def inner(carry, j):
        state, failed = carry
        state, info = step(jax.random.fold_in(key, j), state, params)
        if tracked:
            bad = ~info.proposal_is_finite
            failed = (failed[0] + jnp.where(bad[..., None], info.proposal, 0.0), failed[1] + bad)
        return (state, failed), info

    def draw(carry, i):
        carry, infos = jax.lax.scan(inner, carry, i * thinning + jnp.arange(thinning))
        state = carry[0]
        last = jax.tree.map(lambda x: x[-1], infos)
        yes = jnp.ones(jnp.shape(state.logdensity), bool)
        finite = _info_field(last, "proposal_is_finite", yes)
        evals = _info_field(infos, "num_integration_steps", None)
        evals = thinning * (per_step or 1) if evals is None else jnp.sum(evals, axis=0)
        stats = {
            "logdensity": state.logdensity,
            "acceptance_rate": _info_field(last, "acceptance_rate", jnp.full(yes.shape, jnp.nan)),
            "is_accepted": _info_field(last, "is_accepted", yes),
            "proposal_is_finite": finite,
            "is_divergent": _info_field(last, "is_divergent", ~finite),
            "num_grad_evals": jnp.broadcast_to(evals, yes.shape).astype(jnp.int32),
        }
        for name in OPTIONAL_STATS:  # what only some kernels report (HMC, NUTS)
            value = _info_field(last, name, None)
            if value is not None:
                stats[name] = value
        kept = state.position if keep is None else keep(state.position)
        return carry, (kept, stats)

    failed = (jnp.zeros(()), jnp.zeros((), jnp.int32))
    if tracked:
        failed = (
            jnp.zeros(proposal_shape.shape, proposal_shape.dtype),
            jnp.zeros(finite_shape.shape, jnp.int32),
        )
    # a low-rank R's Q^T stored (k, d) for the block's products (square_roots.with_rows)
    state = square_roots.with_rows(state)
    (state, failed), out = scan_with_progress(draw, (state, failed), num_draws, start, bar)
    return square_roots.without_rows(state), out, failed


@dataclass
class _Run:
    """The compiled loops of one :func:`sample` call and how the chains are placed."""

    plan: _Plan
    logdensity_fn: Callable
    num_warmup: int
    num_draws: int
    thinning: int
    grad_evals_per_step: int | None
    chain_method: str
    mesh: Mesh | None
    bars: tuple = (None, None)
    keep: Callable | None = None
    block: int | None = None  # draws per compiled block of the sampling phase
    sink: Any = None
    checkpoint: Any = None  # a fisher_mala.run_checkpoint.RunCheckpoint
    failed: Any = None  # (sum of the non-finite proposals, their count), per chain
    used_target_acceptance: float | None = None  # what a staged warm-up aimed at
    sampling_options: dict | None = None  # the sampling step's options the warm-up chose
    groups: int = 1  # groups of independent chains run at once (fisher_mala.chain_threads)

    def warmup(self, data):
        return self.plan.kernels(_bind(self.logdensity_fn, data))[0]

    def map_chains(self, fn, *args, data=None):
        return map_over_chains(
            fn, *args, chain_method=self.chain_method, mesh=self.mesh, shared=data
        )

    def stage(self, batched: bool, method: str, *extra):
        """The runner of ``warmup.<method>(key, x, num_warmup, bar, *extra)``: on all
        chains at once (``batched``, pooled), else per chain."""
        bar = self.bars[0]

        def call(key, x, data=None):
            key = jax.random.fold_in(key, 0)
            return getattr(self.warmup(data), method)(key, x, self.num_warmup, bar, *extra)

        if batched:
            return lambda keys, xs, data: call(keys[0], xs, data)
        return lambda keys, xs, data: self.map_chains(call, keys, xs, data=data)

    def warm_up(self, keys, positions, data):
        """``((states, parameters), info)``, compile seconds and run seconds.

        A staged warm-up (Fisher NUTS / HMC: host choices between compiled parts,
        :meth:`~fisher_mala.whitened_warmup.FisherHMCWarmup.staged_run`) compiles each
        stage for all chains once per argument structure; its seconds are those of the
        compiled stages and of the host's choices.
        """
        warmup = self.warmup(data)
        batched = getattr(warmup, "batched", False)
        if not getattr(warmup, "staged", False):
            return _compile_and_run(
                self.stage(batched, "run"), keys, positions, data, groups=self.groups, mapped=2
            )
        compile_seconds, run_seconds, compiled = [], [], {}

        def call(method, argument, *extra):
            structure = jax.tree.structure(argument)
            shapes = tuple((x.shape, x.dtype) for x in jax.tree.leaves(argument))
            signature = (method, extra, structure, shapes)
            if signature not in compiled:
                runner = self.stage(batched, method, *extra)
                compiled[signature], seconds = _compile(
                    runner, keys, argument, data, groups=self.groups, mapped=2
                )
                compile_seconds.append(seconds)
            out, seconds = _run(compiled[signature], keys, argument, data)
            run_seconds.append(seconds)
            return out

        def on_host(fn, *args):
            start = time.perf_counter()
            out = fn(*args)
            run_seconds.append(time.perf_counter() - start)
            return out

        out = warmup.staged_run(call, positions, self.num_warmup, on_host)
        self.used_target_acceptance = warmup.used_target_acceptance
        self.sampling_options = getattr(warmup, "sampling_options", None)
        return out, sum(compile_seconds), sum(run_seconds)

    def sampling(self, one_state: bool, num: int):
        """The runner of ``num`` draws from draw ``start``: one state for all chains
        (pooled), or per chain."""

        def draws(key, state, params, data, start):
            step = self.plan.kernels(_bind(self.logdensity_fn, data), self.sampling_options)[1]
            return _draws_of(
                step, key, state, params, num, self.thinning, self.grad_evals_per_step,
                self.bars[1], start, self.keep,
            )  # fmt: skip

        if one_state:

            def run(keys, state, parameters, data, start):
                key = jax.random.fold_in(keys[0], 1)
                state, out, failed = draws(key, state, parameters, data, start)
                return state, jax.tree.map(lambda x: jnp.moveaxis(x, 0, 1), out), failed

            return run

        def one(key, state, params, start, data=None):
            return draws(jax.random.fold_in(key, 1), state, params, data, start)

        def run(keys, states, parameters, data, start):
            starts = jnp.broadcast_to(start, keys.shape)
            return self.map_chains(one, keys, states, parameters, starts, data=data)

        return run

    def sample_blocks(self, keys, states, parameters, data, one_state, done=0, after=None):
        """The sampling phase from draw ``done`` in compiled blocks of :attr:`block` draws,
        each handed to the sink on the host, then to ``after(states, done, seconds)``;
        ``(final states, compile seconds, run seconds)``."""
        compiled, compile_s, seconds_s = {}, 0.0, 0.0
        while done < self.num_draws:
            num = min(self.block or self.num_draws, self.num_draws - done)
            start = jnp.asarray(done, jnp.int32)
            if num not in compiled:  # at most two executables: the block and the last one
                runner = self.sampling(one_state, num)
                compiled[num], c = _compile(
                    runner, keys, states, parameters, data, start, groups=self.groups, mapped=3
                )
                compile_s += c
            (states, block, failed), r = _run(compiled[num], keys, states, parameters, data, start)
            seconds_s += r
            self.sink.append(done, _to_host(block))
            failed = jax.tree.map(np.asarray, _to_host(failed))
            self.failed = (
                failed if self.failed is None else jax.tree.map(np.add, self.failed, failed)
            )
            done += num
            if after is not None:
                after(states, done, (compile_s, seconds_s))
        return states, compile_s, seconds_s

    def __call__(self, keys, positions, data, user_mesh):
        warmup = self.warmup(data)
        batched = getattr(warmup, "batched", False)  # one state for all chains (pooled)
        per_chain = getattr(warmup, "per_chain_sampling", False)
        if batched:  # the chains share a state: one program for all of them
            self.groups = 1
        if batched and user_mesh is None and jax.process_count() == 1:
            # The pooled update needs every chain's signal at every iteration: one device
            # runs it (across XLA:CPU devices the exchange costs more than it saves); with a
            # mesh, XLA gathers the chains' signals from the devices of the "chain" axis.
            keys, positions = jax.device_put((keys, positions), jax.devices()[0])
        with sqrt_precond_sharding(self.mesh):  # R's rows over a "precond" axis, if any
            saved = self.checkpoint.load() if self.checkpoint is not None else None
            done, after = 0, None
            segmented = hasattr(warmup, "segmented_run")  # Fisher NUTS / HMC
            if saved is None or saved["stage"] == "warmup":
                if self.checkpoint is not None and segmented:
                    out = _warm_up_segmented(self, keys, positions, data, saved)
                elif self.checkpoint is not None:
                    out = _warm_up_in_parts(self, keys, positions, data, saved)
                else:
                    out = self.warm_up(keys, positions, data)
                ((states, parameters), info), compile_w, seconds_w = out
                saved = None
            else:  # resume: the warm-up's outcome and the draws done, as saved
                states, parameters, info = jax.tree.map(
                    jnp.asarray, (saved["states"], saved["parameters"], saved["info"])
                )
                if not batched:
                    states = _shard(states, self.mesh)
                compile_w, seconds_w = saved["timings"][:2]
                chosen = saved["chosen"]  # the warm-up's host choices, as it made them
                self.sampling_options = chosen.get("sampling_options")
                self.used_target_acceptance = chosen.get("target_acceptance")
                done = saved["done"]
                draws, self.failed = saved["draws"]
                self.sink.restore(done, draws)
            if self.checkpoint is not None:
                host = _to_host((parameters, info))
                chosen = {"sampling_options": self.sampling_options,
                          "target_acceptance": self.used_target_acceptance}  # fmt: skip

                def after(states, done, seconds):
                    self.checkpoint.save(
                        states, *host, done, (self.sink.saved_draws(done), self.failed),
                        (compile_w, seconds_w, *seconds), chosen,
                    )  # fmt: skip

                if saved is None:
                    after(states, 0, (0.0, 0.0))
            sampling_parameters = parameters
            if batched and per_chain:
                sampling_parameters = WarmupParameters(parameters.step_size, None)
                keys, states, sampling_parameters = _shard(
                    (keys, states, sampling_parameters), self.mesh
                )
            final, compile_s, seconds_s = self.sample_blocks(
                keys, states, sampling_parameters, data, batched and not per_chain, done, after
            )
            samples, stats = self.sink.result()
            parameters, info, final = _to_host((parameters, info, final))
            out = (parameters, info, final, samples, stats, self.failed)
        return out, (compile_w + compile_s, seconds_w, seconds_s)


def _warmup_part(run: "_Run", batched: bool, part: str, segment=None):
    """The runner of one part of a checkpointed warm-up (``"start"``, ``"advance"`` of
    ``segment``, ``"finish"``): ``(keys, positions, states, (data, offset)) -> out``."""

    def call(key, position, state, shared):
        data, offset = shared
        warmup = run.warmup(data)
        key = jax.random.fold_in(key, 0)
        if part == "start":
            return warmup.start(key, position, run.num_warmup)
        if part == "advance":
            return warmup.advance(
                key, position, state, run.num_warmup, segment, offset, run.bars[0]
            )
        return warmup.finish(position, state, run.num_warmup)

    if batched:
        return lambda keys, xs, states, shared: call(keys[0], xs, states, shared)
    return lambda keys, xs, states, shared: run.map_chains(call, keys, xs, states, data=shared)


def _join_parts(parts: list, axis_of):
    """Per-segment outputs joined on their iteration (or snapshot) axis,
    ``axis_of(part)``."""
    parts = [p for p in parts if p is not None]
    if not parts:
        return None
    axis = axis_of(parts[0])
    return jax.tree.map(lambda *xs: np.concatenate(xs, axis=axis), *parts)


def _warm_up_in_parts(run: "_Run", keys, positions, data, saved):
    """The warm-up in segments of at most ``checkpoint_every`` iterations
    (:func:`~fisher_mala.schedule.segments`), the run saved after each; resumed from
    ``saved`` (a warm-up checkpoint) when given. Returns what :meth:`_Run.warm_up` does."""
    warmup = run.warmup(data)
    batched = getattr(warmup, "batched", False)
    parts = warmup.segments(run.num_warmup, positions, run.checkpoint.every or run.num_warmup)
    compiled, seconds = {}, {"compile": 0.0, "run": 0.0}

    def call(part, states, offset=0, segment=None):
        shared = (data, jnp.asarray(offset, jnp.int32))
        if (part, segment) not in compiled:
            runner = _warmup_part(run, batched, part, segment)
            compiled[part, segment], c = _compile(
                runner, keys, positions, states, shared, groups=run.groups, mapped=3
            )
            seconds["compile"] += c
        out, r = _run(compiled[part, segment], keys, positions, states, shared)
        seconds["run"] += r
        return out

    if saved is None:
        (states, start), done, rates, trace = call("start", None), 0, None, None
    else:
        states, start = jax.tree.map(jnp.asarray, (saved["states"], saved["start"]))
        done, rates, trace = saved["done"], saved["rates"], saved["trace"]
        seconds["compile"], seconds["run"] = saved["timings"][:2]
    for index in range(done, len(parts)):
        segment = parts[index]
        states, more, snaps = call("advance", states, segment.begin, segment._replace(begin=0))
        rates = _join_parts([rates, _to_host(more)], lambda part: -1)
        snaps = None if snaps is None else _to_host(snaps)
        trace = _join_parts([trace, snaps], lambda part: part.iteration.ndim - 1)
        run.checkpoint.save_warmup(
            states, start, rates, trace, index + 1, (seconds["compile"], seconds["run"])
        )
    states, parameters = call("finish", states)
    evals = start.num_grad_evals + sum(p.num_steps * p.grads_per_step for p in parts)
    info = WarmupInfo(*rates, start.step_size, evals, trace)
    return ((states, parameters), info), seconds["compile"], seconds["run"]


def _warm_up_segmented(run: "_Run", keys, positions, data, saved):
    """A Fisher NUTS / HMC warm-up in parts of at most ``checkpoint_every`` iterations
    (:meth:`~fisher_mala.whitened_warmup.FisherHMCWarmup.segmented_run`), the run saved
    after each; resumed from ``saved`` (a warm-up checkpoint) when given. Returns what
    :meth:`_Run.warm_up` does."""
    warmup = run.warmup(data)
    batched = getattr(warmup, "batched", False)
    compiled, seconds = {}, {"compile": 0.0, "run": 0.0}

    def runner(method, extra):
        def call(key, argument, shared):
            data, offset = shared
            key = jax.random.fold_in(key, 0)
            return getattr(run.warmup(data), method)(
                key, argument, run.num_warmup, run.bars[0], offset, *extra
            )

        if batched:
            return lambda keys, argument, shared: call(keys[0], argument, shared)
        return lambda keys, argument, shared: run.map_chains(call, keys, argument, data=shared)

    def call(method, argument, offset, *extra):
        shared = (data, jnp.asarray(offset, jnp.int32))
        shapes = tuple((np.shape(x), jnp.result_type(x)) for x in jax.tree.leaves(argument))
        signature = (method, extra, jax.tree.structure(argument), shapes)
        if signature not in compiled:
            compiled[signature], c = _compile(
                runner(method, extra), keys, argument, shared, groups=run.groups, mapped=2
            )
            seconds["compile"] += c
        out, r = _run(compiled[signature], keys, argument, shared)
        seconds["run"] += r
        return out

    def on_host(fn, *args):
        start = time.perf_counter()
        out = fn(*args)
        seconds["run"] += time.perf_counter() - start
        return out

    def save(tree, meta):
        run.checkpoint.save_staged(tree, meta, (seconds["compile"], seconds["run"]))

    if saved is not None:
        seconds["compile"], seconds["run"] = saved["timings"][:2]
        saved = (jax.tree.map(jnp.asarray, saved["tree"]), saved["meta"])
    every = run.checkpoint.every
    out = warmup.segmented_run(call, positions, run.num_warmup, every, saved, save, on_host)
    run.used_target_acceptance = warmup.used_target_acceptance
    run.sampling_options = getattr(warmup, "sampling_options", None)
    return out, seconds["compile"], seconds["run"]


def _nonfinite_proposals(failed):
    """Mean position of the non-finite proposals per chain (``None`` if not tracked)."""
    if failed is None or np.ndim(failed[0]) != 2:
        return None
    total, count = (np.asarray(a) for a in failed)
    with np.errstate(invalid="ignore", divide="ignore"):
        return {"mean": total / count[:, None], "count": count}


def _sink(output, num_draws, keep, positions):
    """Where the draws go: memory, or files under ``output``."""
    if output is None:
        return sinks.MemorySink(num_draws)
    one = jax.tree.map(lambda x: x[0], positions)
    kept = one if keep is None else jax.eval_shape(keep, one)
    return sinks.FileSink(output, num_draws, jax.tree.structure(kept))


def _saver(path, every, block, total, plan, rng_key, positions, logdensity_fn, **protocol):
    """``(RunCheckpoint or None, draws per block)``: blocks no longer than ``every``."""
    if path is None:
        return None, block
    if every is not None:
        block = min(block, max(1, int(every) // protocol["thinning"]))
    identity = run_checkpoint.fingerprint(
        plan.name, plan.options, rng_key, positions, logdensity_fn, **protocol
    )
    num_chains = jax.tree.leaves(positions)[0].shape[0]
    state_bytes = num_chains * (_dim(positions) + 64) ** 2 * 8 * 4  # R, caches, infos
    return run_checkpoint.RunCheckpoint(
        path, every, identity, 2 * total + state_bytes + (64 << 20)
    ), block


def sample(
    rng_key,
    sampler: str | Sampler | SamplingAlgorithm,
    logdensity_fn: Callable,
    initial_positions: ArrayTree,
    num_warmup: int = 20_000,
    num_samples: int = 20_000,
    thinning: int = 1,
    progress_bar: bool = False,
    chain_method: str = "auto",
    diagnose: bool = True,
    data: ArrayTree | None = None,
    mesh: Mesh | None = None,
    keep: Callable | None = None,
    output=None,
    checkpoint=None,
    checkpoint_every: int | None = None,
    **options,
) -> SamplingResult:
    """Warm up and sample several chains with the paper's protocol.

    Parameters
    ----------
    rng_key
        A JAX PRNG key; chain ``c`` uses ``jax.random.split(rng_key, num_chains)[c]``.
    sampler
        A name from :func:`samplers` (``"mala"``, ``"fisher_mala"``, ...), a
        :class:`~fisher_mala.registry.Sampler` (a warm-up and a kernel: the page "Write
        your own sampler"), or a ``SamplingAlgorithm`` (burn-in without adaptation, then
        its ``step``).
    logdensity_fn
        ``position -> log pi(position)`` for one chain's position; with ``data``,
        ``(position, data) -> log pi(position)``.
    initial_positions
        Array or pytree whose leaves have a leading chain axis.
    num_warmup
        Burn-in iterations, in which adaptation happens (paper: 2 x 10^4). For
        ``"fisher_nuts"`` and ``"fisher_hmc"`` an upper bound: their warm-up ends earlier
        once the learned ``R`` has settled (``stopping_rule``, see
        :class:`~fisher_mala.whitened_warmup.FisherHMCWarmup`); ``result.warmup_info``
        covers the iterations run.
    num_samples
        Iterations of the sampling phase, parameters frozen (paper: 2 x 10^4).
    thinning
        Keep every ``thinning``-th state: ``num_samples // thinning`` draws.
    progress_bar
        Show tqdm bars for the warm-up and sampling phases.
    chain_method
        How the chains run on each device (NumPyro's option of the same name): the chains
        are split over the devices (when their number divides the number of chains),
        and each device runs its share with no communication. ``"vectorized"``: batched
        (``jax.vmap``). ``"sequential"``: one after the other in one compiled loop
        (``jax.lax.map``); faster for NUTS and HMC on a CPU in small dimension, where a
        batch of trees waits for its longest one, and in large dimension unless the
        chains share much data. ``"auto"`` (default): sequential for NUTS and HMC on a
        CPU up to ``SEQUENTIAL_MAX_DIM`` coordinates (up to
        ``SEQUENTIAL_MAX_DIM_SMALL_BATCH`` with at most ``SMALL_BATCH`` chains per
        device), and above ``SEQUENTIAL_MAX_DIM_SMALL_BATCH`` where the log density's
        captured arrays and ``data`` hold under ``SHARED_BYTES_FOR_BATCH`` bytes or under
        ``SHARED_WORDS_PER_COORDINATE_FOR_BATCH`` words per coordinate; else vectorized.
        Pooled samplers share one ``R`` and are always batched. On a single XLA:CPU
        device the chains also run in groups, one per core, each group's program started
        from its own thread (:mod:`fisher_mala.chain_threads`; batched chains up to
        ``GROUPS_MAX_DIM`` coordinates, sequential ones at every dimension); the method
        applies within each group.
    diagnose
        Run :func:`fm.diagnose` on the result and issue one
        :class:`~fisher_mala.checks.SamplingWarning` naming every failed check (R-hat,
        ESS, chains that disagree, acceptance, rejection streaks, stuck chains).
    data
        A pytree of arrays given to ``logdensity_fn`` as its second argument: passed to
        the compiled loops as an argument (a captured array would be compiled in as a
        constant), placed as the caller placed it. Arrays sharded over a mesh axis other
        than ``"chain"`` (e.g. ``jax.device_put(X, NamedSharding(mesh, P("data")))``)
        make a data-parallel log density: XLA computes each device's share and reduces
        the sums (the "Large problems" page of the documentation).
    mesh
        A ``jax.sharding.Mesh`` with a ``"chain"`` axis: each slice of that axis runs its
        share of the chains; its other axes are left to XLA (data, ``R``'s rows). Default:
        the chains split over all devices (every process's under ``jax.distributed``) when
        their number divides the number of chains.
    keep
        ``position -> pytree``: keep this function of each draw instead of the whole
        position (a few coordinates, a prediction); ``samples`` then holds its values and
        the checks run on them.
    checkpoint, checkpoint_every
        A file: the run's state is saved there atomically at most ``checkpoint_every``
        iterations apart, in the warm-up (its segments; Fisher NUTS / HMC: when it ends)
        and in the sampling phase (its blocks); calling ``fm.sample`` again with the same
        arguments resumes it and returns draws bit-identical to an uninterrupted run; a
        checkpoint of another run is refused (:mod:`fisher_mala.run_checkpoint`).
    output
        A directory: the sampling phase writes its draws there block by block
        (memory-mapped ``.npy`` files and ``progress.json``, :mod:`fisher_mala.sinks`), so
        that the host holds one block at a time; ``samples`` and ``sample_stats`` are then
        read-only memory maps of the files, and :func:`fisher_mala.sinks.read_output`
        reads the draws written so far while the run goes on. Before the warm-up starts,
        ``fm.sample`` checks that the kept draws fit in the free host and device memory
        and otherwise stops with a ``MemoryError`` that names the size and these ways out.
    **options
        Passed to the sampler's warm-up (e.g. ``damping``, ``signal``,
        ``initial_step_size``, ``num_mala_steps``, ``trace_every``; for Fisher NUTS / HMC
        also ``metric``, ``stopping_rule``, ``num_step_size_steps``).

    Returns
    -------
    SamplingResult
    """
    num_warmup = _check_count("num_warmup", num_warmup, 0)
    num_samples = _check_count("num_samples", num_samples, 1)
    thinning = _check_count("thinning", thinning, 1)
    if thinning > num_samples:
        raise ValueError(f"`thinning` ({thinning}) exceeds `num_samples` ({num_samples}).")
    if options.get("rank") is not None:  # "auto": dense or low rank by the dimension
        from fisher_mala.low_rank import resolve_rank

        flat = jax.tree.leaves(initial_positions)
        dim = sum(int(np.prod(np.shape(leaf)[1:])) for leaf in flat)
        options = {**options, "rank": resolve_rank(options["rank"], dim)}
    plan = _plan(sampler, options, data, logdensity_fn)
    validation.check_choice("chain_method", chain_method, ("auto", "vectorized", "sequential"))
    num_chains = _check_initial_positions(logdensity_fn, initial_positions, data)
    user_logdensity_fn = logdensity_fn  # the checkpoint's fingerprint reads the user's own
    logdensity_fn = _in_positions_dtype(logdensity_fn, initial_positions, data)
    warmup = plan.kernels(_bind(logdensity_fn, data))[0]
    if callable(getattr(warmup, "check", None)):  # the options at every warm-up iteration
        warmup.check(num_warmup, initial_positions)
    keys = jax.random.split(rng_key, num_chains)
    user_mesh, mesh = mesh, _chain_mesh(num_chains, mesh)
    if chain_method == "auto":
        chain_method = _auto_chain_method(
            plan.spec.trajectory, initial_positions, mesh,
            lambda: _shared_bytes(logdensity_fn, initial_positions, data),
        )  # fmt: skip
    devices = [str(d) for d in (mesh.devices.flat if mesh is not None else jax.devices()[:1])]
    keys, initial_positions = _shard((keys, initial_positions), mesh)
    num_draws = num_samples // thinning
    bars = (None, None)
    if progress_bar:
        bars = (ProgressBar(num_warmup, "warm-up"), ProgressBar(num_draws, "sampling"))
    per_step = plan.grad_evals_per_step(_dim(initial_positions))
    block, total = _check_memory(keep, initial_positions, num_chains, num_draws, output, diagnose)
    sink = _sink(output, num_draws, keep, initial_positions)
    saver, block = _saver(
        checkpoint, checkpoint_every, block, total, plan, rng_key, initial_positions,
        user_logdensity_fn, num_warmup=num_warmup, num_samples=num_samples, thinning=thinning,
        chain_method=chain_method, keep=keep, output=None if output is None else str(output),
        data=data, checkpoint_every=checkpoint_every, jax=jax.__version__,
    )  # fmt: skip
    run = _Run(
        plan, logdensity_fn, num_warmup, num_draws, thinning, per_step, chain_method, mesh, bars,
        keep, block, sink, saver, groups=_groups(num_chains, initial_positions, mesh, chain_method),
    )  # fmt: skip
    try:
        out, (compile_seconds, warmup_seconds, sampling_seconds) = run(
            keys, initial_positions, data, user_mesh
        )
    finally:
        for bar in bars:
            if bar is not None:
                bar.close()
    parameters, warmup_info, final_state, samples, stats, failed = out
    # The recorded draws' counts cover every step (thinned steps included).
    num_grad_evals = np.asarray(warmup_info.num_grad_evals) + np.asarray(
        stats["num_grad_evals"]
    ).sum(-1)
    # The target the warm-up aimed at (Fisher NUTS / HMC choose theirs as they go).
    target = run.used_target_acceptance
    target = None if plan.custom else float(target or run.warmup(data).target_acceptance)
    result = SamplingResult(
        plan.name, samples, stats, parameters, warmup_info, final_state, num_grad_evals,
        compile_seconds, warmup_seconds, sampling_seconds, num_warmup, num_samples, thinning,
        devices=devices, target_acceptance=target, rejects_whole_proposals=plan.spec.metropolis,
        reports_divergences=plan.spec.trajectory, tuned=not plan.custom,
        nonfinite_proposals=_nonfinite_proposals(failed),
    )  # fmt: skip
    if diagnose:
        result.diagnosis = checks.diagnose(result)
        checks.warn(result.diagnosis)
    return result
