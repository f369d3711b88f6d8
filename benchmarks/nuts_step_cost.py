"""Time per leapfrog step of Fisher NUTS's kernel, one chain and four batched chains.

    python -m benchmarks.nuts_step_cost                  # d = 1000 and 10 000
    python -m benchmarks.nuts_step_cost --dims 100,1000
    python -m benchmarks.nuts_step_cost --target hierarchical_logistic_10k
    python -m benchmarks.nuts_step_cost --dims 100000 --per-transition
    python -m benchmarks.nuts_step_cost --dims 100000 --profile

The kernel (``fisher_mala.whitened_hmc.build_kernel("nuts")``, with and without the U-turn
checks across subtrees) on the low-rank race's diagonal-plus-rank-8 Gaussian
(``benchmarks.low_rank_race.gaussian_lowrank``), whitened by its exact rank-8 root, float64,
step 0.2 (or another of the race's targets, ``--target``, whitened by a unit rank-8
root, started at 0.1 times normal draws): 20 transitions in one jitted ``lax.scan``,
for one chain and for four chains under ``jax.vmap`` (their trees in lockstep), the best
of three runs after compilation; and BlackJAX's own NUTS with the root's diagonal as its
diagonal metric (the low-rank race's ``nuts_diag`` peer) on the same target and starts,
and (one chain) Fisher NUTS whitened by the root's diagonal alone: the difference from the
first is what the products with the root's ``d x 8`` loadings cost. Printed:
microseconds per leapfrog step of the one chain, and per lockstep leapfrog step of the four
(the longest tree of the four at each transition). Not cached: to compare two commits, run
it in a worktree of each, alternating.

``--per-transition``: one chain of Fisher NUTS (with the checks) and of BlackJAX's diagonal
NUTS at three step sizes each, and a least-squares line through (leapfrog steps, time)
per transition: its slope is the cost of a leapfrog step, its intercept that of a
transition's own work (the momentum's draw, the doublings' selections and merges).
``--profile``: XLA's own trace (``jax.profiler``) of 20 transitions at step 0.2, one chain,
of Fisher NUTS and of BlackJAX's diagonal NUTS: the operations that take the most time
per leapfrog step, the products with ``d x k`` matrices named by their shapes. Run either
under ``taskset -c 0`` for one core, as the race's groups of chains each get one.
"""

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

CHAINS, TRANSITIONS, STEP = 4, 20, 0.2


def _root_and_start(target):
    """The race's Gaussian's covariance root ``D^(1/2) (I + U diag(sqrt(S) - 1) U^T)``, from
    the factors it carries, and starts drawn from it; for another target a unit rank-8 root
    and starts of the race's scale (0.1 times normal draws)."""
    from fisher_mala.square_roots import LowRankSqrt

    if "factors" not in target.extras:
        loadings = jnp.linalg.qr(jax.random.normal(jax.random.key(0), (target.dim, 8)))[0]
        x0 = jax.random.normal(jax.random.key(1), (CHAINS, target.dim)) * 0.1
        return LowRankSqrt(jnp.ones(target.dim), loadings, jnp.zeros(8)), x0
    diagonal, loadings, spectrum = target.extras["factors"]
    root = LowRankSqrt(
        jnp.sqrt(diagonal), jnp.asarray(loadings), jnp.asarray(np.sqrt(spectrum) - 1.0)
    )
    return root, jax.random.normal(jax.random.key(1), (CHAINS, target.dim)) * jnp.sqrt(diagonal)


def _run_and_state(target, robust: bool, batched: bool, peer: bool = False,
                   diagonal: bool = False, step: float = STEP):  # fmt: skip
    """``(run, state)``: a jitted ``run(state, key)`` of ``TRANSITIONS`` transitions (their
    leapfrog steps out), and the state it starts from (see :func:`seconds_per_step`)."""
    import blackjax

    from fisher_mala import whitened_hmc
    from fisher_mala.square_roots import DiagonalSqrt

    root, x0 = _root_and_start(target)
    if diagonal:
        root = DiagonalSqrt(root.scale)
    if peer:
        peer_kernel = blackjax.nuts.build_kernel()
        variances = root.scale**2

        def one(key, state):
            return peer_kernel(key, state, target.logdensity_fn, step, variances)

        def init(x):
            return blackjax.nuts.init(x, target.logdensity_fn)
    else:
        kernel = whitened_hmc.build_kernel("nuts", robust_uturn=robust)

        def one(key, state):
            return kernel(key, state, target.logdensity_fn, step)

        def init(x):
            return whitened_hmc.init(x, target.logdensity_fn, root)

    if batched:
        state = jax.vmap(init)(x0)

        def transition(s, key):
            s, info = jax.vmap(one)(jax.random.split(key, CHAINS), s)
            return s, info.num_integration_steps
    else:
        state = init(x0[0])

        def transition(s, key):
            s, info = one(key, s)
            return s, info.num_integration_steps

    run = jax.jit(lambda s, key: jax.lax.scan(transition, s, jax.random.split(key, TRANSITIONS)))
    state, _ = jax.block_until_ready(run(state, jax.random.key(2)))
    return run, state


def _best_run(run, state):
    """``(seconds, leapfrog steps per chain and transition)`` of the fastest of three runs."""
    best, best_steps = np.inf, None
    for r in range(3):
        start = time.perf_counter()
        _, steps = jax.block_until_ready(run(state, jax.random.key(3 + r)))
        seconds = time.perf_counter() - start
        if seconds < best:
            best, best_steps = seconds, np.asarray(steps)
    return best, best_steps


def seconds_per_step(
    target, robust: bool, batched: bool, peer: bool = False, diagonal: bool = False
) -> float:
    """Microseconds per (lockstep) leapfrog step, the best of three runs. ``peer``:
    BlackJAX's own NUTS with the diagonal metric ``D`` of the root (the low-rank race's
    ``nuts_diag``), in the target's coordinates, instead of Fisher NUTS. ``diagonal``:
    Fisher NUTS whitened by that diagonal alone (``DiagonalSqrt``), which leaves out the
    products with the root's ``d x 8`` loadings."""
    run, state = _run_and_state(target, robust, batched, peer, diagonal)
    best = np.inf
    for r in range(3):
        start = time.perf_counter()
        _, steps = jax.block_until_ready(run(state, jax.random.key(3 + r)))
        seconds = time.perf_counter() - start
        steps = np.asarray(steps)
        leapfrogs = steps.max(axis=-1).sum() if batched else steps.sum()
        best = min(best, seconds / leapfrogs * 1e6)
    return best


#: Step sizes of ``--per-transition`` on the race's Gaussian: trees of about 63, 31 and 15
#: leapfrog steps for Fisher NUTS (whitened by the exact root), 63, 28 and (at 0.1, a
#: resonance) the depth limit for BlackJAX's diagonal NUTS.
FIT_STEPS = {"fisher": (0.1, 0.2, 0.4), "blackjax": (0.05, 0.1, 0.2)}


def per_transition(target) -> dict:
    """``{sampler: (ms per leapfrog step, ms per transition)}``, one chain each: the slope
    and intercept of a least-squares line through (mean leapfrog steps, mean time) per
    transition over the step sizes of :data:`FIT_STEPS`."""
    lines = {}
    for sampler, steps in FIT_STEPS.items():
        points = []
        for step in steps:
            run, state = _run_and_state(target, True, False, peer=sampler == "blackjax",
                                        step=step)  # fmt: skip
            seconds, leapfrogs = _best_run(run, state)
            points.append((leapfrogs.mean(), seconds / TRANSITIONS * 1e3))
        slope, intercept = np.polyfit(*np.transpose(points), 1)
        lines[sampler] = (slope, intercept, points)
    return lines


def profile(target, peer: bool = False, top: int = 12) -> list[tuple[float, float, str]]:
    """``[(µs per leapfrog step, calls per leapfrog step, operation)]``: XLA's trace of
    Fisher NUTS's transitions (with the checks, one chain, step ``STEP``; ``peer``:
    BlackJAX's diagonal NUTS's), the ``top`` operations by their own time (a while loop's
    or branch's time holds that of the operations in it), each ``dot`` with its output's
    shape."""
    import gzip
    import json
    import re
    import tempfile
    from collections import Counter
    from pathlib import Path

    run, state = _run_and_state(target, not peer, False, peer=peer)
    with tempfile.TemporaryDirectory() as folder:
        jax.profiler.start_trace(folder)
        _, steps = jax.block_until_ready(run(state, jax.random.key(3)))
        jax.profiler.stop_trace()
        (trace,) = Path(folder).rglob("*.trace.json.gz")
        events = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    leapfrogs = int(np.asarray(steps).sum())
    hlo = run.lower(state, jax.random.key(3)).compile().as_text()
    dots = dict(re.findall(r"%(dot\.\d+) = (\S+) dot\(", hlo))
    time_of, calls = Counter(), Counter()
    for event in events:
        name = event.get("name", "")
        if event.get("ph") == "X" and re.fullmatch(r"[\w.\-]+", name) and "::" not in name:
            time_of[name] += event["dur"]
            calls[name] += 1
    rows = []
    for name, micros in time_of.most_common():
        if name.startswith(("while", "cond")):  # nested: their operations are counted apart
            continue
        label = f"{name} -> {dots[name]}" if name in dots else name
        rows.append((micros / leapfrogs, calls[name] / leapfrogs, label))
        if len(rows) == top:
            break
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dims", default="1000,10000")
    parser.add_argument("--target", help="one of the low-rank race's targets instead")
    parser.add_argument("--per-transition", action="store_true",
                        help="cost per leapfrog step and per transition, one chain")
    parser.add_argument("--profile", action="store_true",
                        help="XLA's trace of one chain's transitions")
    args = parser.parse_args(argv)
    from benchmarks import low_rank_race

    if args.target:
        targets = [low_rank_race.TARGETS[args.target]]
    else:
        targets = [lambda dim=dim: low_rank_race.gaussian_lowrank(dim)
                   for dim in map(int, args.dims.split(","))]  # fmt: skip
    with jax.enable_x64(True):
        for make in targets:
            target = make()
            if args.per_transition:
                for sampler, (slope, intercept, points) in per_transition(target).items():
                    shown = ", ".join(f"{n:.1f} steps {ms:.1f} ms" for n, ms in points)
                    print(f"{target.name}, d = {target.dim}, {sampler}: {slope:.3f} ms per "
                          f"leapfrog step + {intercept:.1f} ms per transition ({shown})",
                          flush=True)  # fmt: skip
                continue
            if args.profile:
                for peer, name in ((False, "Fisher NUTS"), (True, "BlackJAX's diagonal NUTS")):
                    print(f"{target.name}, d = {target.dim}: {name}, one chain, per step")
                    for micros, calls, label in profile(target, peer):
                        print(f"{micros:8.1f} µs {calls:5.2f} calls  {label}", flush=True)
                continue
            cells = [
                f"{seconds_per_step(target, robust, False):.0f} / "
                f"{seconds_per_step(target, robust, True):.0f}"
                for robust in (False, True)
            ]
            peer = f"{seconds_per_step(target, False, False, peer=True):.0f} / " + (
                f"{seconds_per_step(target, False, True, peer=True):.0f}"
            )
            diagonal = seconds_per_step(target, False, False, diagonal=True)
            print(
                f"{target.name}, d = {target.dim}: µs per leapfrog step, one chain / four "
                f"batched (lockstep): Fisher NUTS with BlackJAX's U-turn criterion "
                f"{cells[0]}, with the checks across subtrees {cells[1]}; whitened by the "
                f"root's diagonal alone (one chain, BlackJAX's criterion) {diagonal:.0f}; "
                f"BlackJAX's NUTS with the diagonal metric {peer}",
                flush=True,
            )


if __name__ == "__main__":
    main()
