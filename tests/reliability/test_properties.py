"""Property-based tests of the square-root recursions (hypothesis), in float64.

For any sequence of signals, including zero signals and huge or tiny norms (1e-150 to
1e140), R stays finite and R R^T equals the dense inverse A = P^{-1} of the precision the
recursion inverts (Prop. 4: sum s s^T + lambda I; Appendix B: the gamma-weighted
recursion) up to ``C eps max_n tr(A_n)``: the accuracy of a Potter-type update is relative
to the largest scale R has held. (A direction squeezed by a signal 1e7 times the damping
scale keeps a relative error of about 1e-8; two such signals of 1e29 along different
directions leave A ~ 1e-58 whose relative accuracy no float64 square root can hold, while
the absolute error stays below eps * tr(A_0).) For moderate scales ``tests/test_sqrt_precond.py``
checks 1e-10 relative accuracy. P spans up to 300 orders of magnitude, so the reference
inverse is computed with 400-digit arithmetic (mpmath).
"""

import jax
import jax.numpy as jnp
import mpmath
import numpy as np
import optax
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fisher_mala.sqrt_precond import (
    fisher_coefficients,
    initial_sqrt_precond,
    rank_one_update,
    schedule_coefficients,
    whitened_product,
)

SCALES = st.sampled_from([0.0, 1e-150, 1e-30, 1e-8, 1.0, 1e8, 1e30, 1e140])


@st.composite
def signal_sequences(draw):
    d = draw(st.integers(1, 8))
    n = draw(st.integers(1, 25))
    seed = draw(st.integers(0, 2**31 - 1))
    scales = draw(st.lists(SCALES, min_size=n, max_size=n))
    base = np.random.default_rng(seed).normal(size=(n, d))
    return base * np.asarray(scales)[:, None], draw(st.sampled_from([0.1, 1.0, 10.0]))


_update = jax.jit(rank_one_update, static_argnames="exact_trace")
#: C eps with C = 1000 (n <= 25 updates in d <= 8).
TOLERANCE = 1000 * np.finfo(np.float64).eps


def _scale(r):
    return float(np.sum(np.asarray(r) ** 2))  # tr(R R^T)


def _dense_inverse_error(r, weight_i, terms):
    """||R R^T - P^{-1}||_F, P = weight_i I + sum_i w_i s_i s_i^T in exact arithmetic."""
    mpmath.mp.dps = 400
    d = r.shape[0]
    p = mpmath.eye(d) * mpmath.mpf(weight_i)
    for w, s in terms:
        col = mpmath.matrix([mpmath.mpf(float(v)) for v in s])
        p += mpmath.mpf(w) * (col * col.T)
    inverse = p**-1
    a = np.array([[float(inverse[i, j]) for j in range(d)] for i in range(d)])
    big = max(np.abs(a).max(), np.abs(r).max() ** 2)  # avoid underflow of squares
    return big * np.linalg.norm((r / np.sqrt(big)) @ (r / np.sqrt(big)).T - a / big)


@settings(max_examples=60, deadline=None)
@given(signal_sequences())
def test_proposition4_square_root_stays_finite_and_exact(case):
    signals, damping = case
    with jax.enable_x64(True):
        d = signals.shape[1]
        r, tr = initial_sqrt_precond(d, damping, jnp.float64)
        probe = np.ones(d)
        whitened = probe @ np.asarray(r)
        kappa = d / damping  # tr(A_0)
        for n, s in enumerate(signals, start=1):
            a, c = fisher_coefficients(n, jnp.float64)
            upd = _update(r, tr, jnp.asarray(s) @ r, a, c, exact_trace=True)
            whitened = whitened_product(upd, whitened)
            r, tr = upd.sqrt_precond, upd.trace_precond
            kappa = max(kappa, _scale(r))
        r = np.asarray(r)
        assert np.all(np.isfinite(r)) and np.isfinite(float(tr))
        err = _dense_inverse_error(r, damping, [(1.0, s) for s in signals])
        assert err < TOLERANCE * kappa, (err, kappa)
        # the O(d) whitened product agrees with R^T v to the same absolute accuracy
        err_w = np.max(np.abs(whitened - probe @ r))
        assert err_w < TOLERANCE * np.sqrt(kappa) * np.linalg.norm(probe), err_w


@settings(max_examples=40, deadline=None)
@given(signal_sequences(), st.sampled_from([0.5, 0.7, 1.0]))
def test_appendix_b_square_root_stays_finite_and_exact(case, power):
    signals, damping = case
    with jax.enable_x64(True):
        d = signals.shape[1]
        r, tr = initial_sqrt_precond(d, damping, jnp.float64)
        # I_n = prod-weighted: track the weights of lambda I and of each s_i s_i^T
        weight_i, terms = damping, []
        kappa = d / damping  # tr(A_0)
        for n, s in enumerate(signals, start=1):
            gamma = 1.0 / n**power if n > 1 else 1.0
            a, c = schedule_coefficients(n, gamma, jnp.float64)
            upd = _update(r, tr, jnp.asarray(s) @ r, a, c, exact_trace=True)
            r, tr = upd.sqrt_precond, upd.trace_precond
            kappa = max(kappa, _scale(r))
            if n == 1:
                terms.append((1.0, s))
            else:
                weight_i *= 1 - gamma
                terms = [(w * (1 - gamma), t) for w, t in terms] + [(gamma, s)]
        r = np.asarray(r)
        assert np.all(np.isfinite(r)) and np.isfinite(float(tr))
        err = _dense_inverse_error(r, weight_i, terms)
        assert err < TOLERANCE * kappa, (err, kappa)


# --- every schedule the API accepts keeps R finite and well conditioned (issue: Appendix B) ---

#: the schedule of the issue: 0.5 (1 -> n^-0.7) over 10^4 steps
_POLYNOMIAL = optax.polynomial_schedule(1.0, 1.0 / 1e4**0.7, 1.0, 10_000)
SCHEDULES = {
    "constant": lambda p: lambda n: p,
    "power": lambda p: lambda n: 1.0 / n ** (0.05 + 0.95 * p),  # n^-0.05 .. n^-1
    "optax_polynomial": lambda p: lambda n: 0.5 * _POLYNOMIAL(n),
    "1/n": lambda p: None,
}


def _run_schedule(learning_rate, dim, num_steps, dtype, signal_scales, seed):
    """``num_steps`` updates of fm.fisher_preconditioner with i.i.d. signals (one scan)."""
    from fisher_mala.adaptations.fisher import fisher_preconditioner

    adaptation = fisher_preconditioner(10.0, learning_rate)
    keys = jax.random.split(jax.random.key(seed), num_steps)
    scales = jnp.asarray(signal_scales, dtype)

    def body(state, key):
        signal = scales * jax.random.normal(key, (dim,), dtype)
        state, _ = adaptation.update(state, signal @ state.sqrt_precond)
        return state, None

    state, _ = jax.jit(lambda s: jax.lax.scan(body, s, keys))(adaptation.init(dim, dtype))
    return state


@settings(max_examples=10, deadline=None)  # each example compiles its own scan
@example(
    kind="constant", p=0.5, dim=50, log_scale=0.0, spread=0.0, dtype="float32", seed=0, active=1.0
)
@example(
    kind="constant", p=0.5, dim=50, log_scale=0.0, spread=0.0, dtype="float64", seed=0, active=1.0
)
@example(
    kind="optax_polynomial",
    p=0.5,
    dim=50,
    log_scale=-3.0,
    spread=1.0,
    dtype="float32",
    seed=1,
    active=1.0,
)
@example(
    kind="constant", p=0.9, dim=5, log_scale=2.0, spread=1.0, dtype="float64", seed=2, active=1.0
)
@example(
    kind="power", p=0.3, dim=20, log_scale=0.0, spread=0.0, dtype="float64", seed=3, active=0.3
)
@given(
    kind=st.sampled_from(sorted(SCHEDULES)),
    p=st.floats(0.01, 0.99),
    dim=st.sampled_from([1, 2, 5, 20, 50]),
    log_scale=st.floats(-3.0, 3.0),
    spread=st.floats(0.0, 2.0),
    dtype=st.sampled_from(["float32", "float64"]),
    seed=st.integers(0, 2**16),
    active=st.sampled_from([1.0, 0.5, 0.1]),
)
def test_every_schedule_keeps_r_finite_and_well_conditioned(
    kind, p, dim, log_scale, spread, dtype, seed, active
):
    """10^4 updates with signals of scales 10^(log_scale +- spread) per coordinate, in
    the first ``active`` share of the coordinates only (the others get no signal, as the
    directions a stuck or confined chain never explores): R finite, R R^T positive
    definite, its trace exact, its condition number bounded by what the damping floor
    guarantees (I_n >= lambda / (e n) I against the largest signal information), with a
    margin of 10. Without the cap of gamma_n a constant 0.5 at d = 50 overflows float32;
    without the damping floor confined signals do."""
    num_steps = 10_000
    scales = 10.0 ** (log_scale + spread * np.linspace(-1.0, 1.0, dim))
    scales[max(1, int(active * dim)) :] = 0.0
    with jax.enable_x64(dtype == "float64"):
        state = _run_schedule(SCHEDULES[kind](p), dim, num_steps, jnp.dtype(dtype), scales, seed)
    r = np.asarray(state.sqrt_precond, np.float64)
    assert np.all(np.isfinite(r))
    a = r @ r.T
    eigenvalues = np.linalg.eigvalsh(a)
    rtol = 1e-10 if dtype == "float64" else 1e-4
    assert np.isclose(float(state.trace_precond), np.trace(a), rtol=rtol)
    if dtype == "float32":  # positive definite up to float32's resolution of R R^T
        assert eigenvalues.min() > -1e-5 * eigenvalues.max(), eigenvalues
        return
    assert eigenvalues.min() > 0, eigenvalues
    # the information I = A^{-1} lies between lambda / (e n) and ~ d |s|_max^2 + lambda
    # (Prop. 4's unnormalized sum: n times that), with a margin of 10
    bound = 10 * np.e * num_steps * (dim * scales.max() ** 2 * 30 + 10.0) / 10.0
    assert eigenvalues.max() / eigenvalues.min() < bound
