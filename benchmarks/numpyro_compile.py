"""What Fisher NUTS compiles inside NumPyro's ``MCMC``, part by part (count model, float64).

Two programs decide ``FisherNUTSKernel``'s clock in ``benchmarks.numpyro_wall`` beside
NumPyro's NUTS: its Fisher phase, compiled once for all chains in ``init``, and the
transition NumPyro compiles anew for every chain of a sequential run (the step-size
phase and the draws). This measures the XLA compile seconds of each (min over
:data:`REPEATS`, caches cleared before each), with the variants the kernel chose between:

- the transition (in a 2000-step ``fori_loop``, as NumPyro's loop holds it) with the
  widening of the metric compiled in (``geometric_widening.widen``) or on the host
  (``widen_on_host``, the kernel's), and with no widening at all;
- the Fisher phase starting from NumPyro's value and gradient at the initial point
  (``evaluated``, the kernel's) or evaluating them itself.

    python -m benchmarks.numpyro_compile        # cached in results/numpyro_compile.json
"""

import json
import time
from functools import partial
from pathlib import Path

import jax

RESULTS = Path(__file__).resolve().parent / "results" / "numpyro_compile.json"
REPEATS = 3


def _compile_seconds(fn, *args, **kwargs) -> float:
    best = float("inf")
    for _ in range(REPEATS):
        jax.clear_caches()
        lowered = jax.jit(fn).lower(*args, **kwargs)
        start = time.perf_counter()
        lowered.compile()
        best = min(best, time.perf_counter() - start)
    return best


def measure() -> dict:
    import fisher_mala as fm
    from benchmarks.numpyro_wall import _models
    from fisher_mala import geometric_widening, numpyro_kernel

    model, args, kwargs = _models()["count"]
    kernel = fm.FisherNUTSKernel(model)
    state = kernel.init(jax.random.key(0), 1000, None, args, kwargs)
    out = {"model": "count", "repeats": REPEATS, "transition": {}, "fisher_phase": {}}
    kept = numpyro_kernel.widen_on_host
    try:
        for name, widen in (("compiled widening", geometric_widening.widen),
                            ("host widening", geometric_widening.widen_on_host),
                            ("no widening", None)):  # fmt: skip
            numpyro_kernel.widen_on_host = widen
            start = state
            if widen is None:
                start = state._replace(tuning=state.tuning._replace(moments=None))

            def loop(s):
                return jax.lax.fori_loop(0, 2000, lambda i, s: kernel.sample(s, args, kwargs), s)

            out["transition"][name] = _compile_seconds(loop, start)
    finally:
        numpyro_kernel.widen_on_host = kept
    kernel._num_warmup = 1000
    params, evaluated = numpyro_kernel._initialize(kernel, jax.random.key(0), None, args, kwargs)
    warmup = kernel._warmup(lambda z, potential=kernel._potential_fn: -potential(z))
    phase = partial(numpyro_kernel._fisher_phase, warmup, num_steps=1000)
    key = jax.random.key(1)
    out["fisher_phase"]["evaluated by NumPyro"] = _compile_seconds(
        phase, key, params, evaluated=evaluated
    )
    out["fisher_phase"]["evaluated again"] = _compile_seconds(phase, key, params)
    return out


def main() -> None:
    if RESULTS.exists():
        out = json.loads(RESULTS.read_text())
    else:
        with jax.enable_x64(True):
            out = measure()
        RESULTS.write_text(json.dumps(out, indent=1))
    for part in ("transition", "fisher_phase"):
        for name, seconds in out[part].items():
            print(f"{part:13s} {name:22s} {seconds:5.2f} s compile (min of {out['repeats']})")


if __name__ == "__main__":
    main()
