"""Checkpoint and resume: the same draws as an uninterrupted run."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fisher_mala as fm


def test_save_and_resume_mid_run_gives_the_same_draws(tmp_path):
    target = fm.targets.get("heart")
    alg = fm.fisher_mala(target.logdensity_fn, step_size=1e-4)
    key = jax.random.key(0)

    def run(state, start, stop):
        def body(s, i):
            s, _ = alg.step(jax.random.fold_in(key, i), s)
            return s, s.position

        return jax.lax.scan(body, state, jnp.arange(start, stop))

    state0 = alg.init(jnp.zeros(target.dim))
    full_state, full_draws = run(state0, 0, 600)
    half_state, first = run(state0, 0, 300)
    path = fm.save_state(tmp_path / "checkpoint.npz", half_state)
    resumed = fm.load_state(path, like=state0)
    end_state, second = run(resumed, 300, 600)
    np.testing.assert_array_equal(np.concatenate([first, second]), full_draws)
    for a, b in zip(jax.tree.leaves(end_state), jax.tree.leaves(full_state), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_loading_into_the_wrong_structure_fails_clearly(tmp_path):
    state = fm.fisher_mala(lambda x: -jnp.sum(x**2), 0.1).init(jnp.zeros(2))
    path = fm.save_state(tmp_path / "s.npz", state)
    other = fm.mala(lambda x: -jnp.sum(x**2), 0.1).init(jnp.zeros(2))
    with pytest.raises(ValueError, match="structure"):
        fm.load_state(path, like=other)


def _fisher_state(dim, dtype=jnp.float32):
    return fm.fisher_mala(lambda x: -jnp.sum(x**2), 0.1).init(jnp.zeros(dim, dtype))


def test_a_checkpoint_of_another_run_is_refused_clearly(tmp_path, x64):
    path = fm.save_state(tmp_path / "d7.npz", _fisher_state(7))
    with pytest.raises(ValueError, match="shape"):
        fm.load_state(path, like=_fisher_state(4))  # another dimension
    path = fm.save_state(tmp_path / "f64.npz", _fisher_state(4, jnp.float64))
    with pytest.raises(ValueError, match="float64"):
        fm.load_state(path, like=_fisher_state(4, jnp.float32))  # no silent cast
    state = _fisher_state(4)
    for broken, match in [
        (state._replace(sqrt_precond=state.sqrt_precond.at[0, 0].set(jnp.nan)), "NaN"),
        (state._replace(position=state.position.at[1].set(jnp.inf)), "NaN or inf"),
        (state._replace(step_size=-state.step_size), "step size"),
    ]:
        path = fm.save_state(tmp_path / "broken.npz", broken)
        with pytest.raises(ValueError, match=match):
            fm.load_state(path, like=state)


def test_a_crafted_file_is_refused_before_it_is_read(tmp_path):
    like = _fisher_state(4)
    bomb = tmp_path / "bomb.npz"  # a few hundred kB that would expand to 400 MB
    np.savez_compressed(bomb, __paths__=np.zeros(1), leaf_0000=np.zeros(50_000_000))
    assert bomb.stat().st_size < 1_000_000
    with pytest.raises(ValueError, match="expand"):
        fm.load_state(bomb, like=like)
    garbage = tmp_path / "garbage.npz"
    garbage.write_bytes(b"not a zip file at all")
    with pytest.raises(ValueError, match="not a checkpoint"):
        fm.load_state(garbage, like=like)
    pickled = tmp_path / "pickled.npz"  # an object array needs pickle: never loaded
    paths = np.asarray(fm.checkpoint._paths(like))
    objects = {f"leaf_{i:04d}": np.array([None], object) for i in range(len(paths))}
    np.savez(pickled, __paths__=paths, **objects)
    with pytest.raises(ValueError, match="pickle"):
        fm.load_state(pickled, like=like)


_SAVER = """
import sys, jax.numpy as jnp, fisher_mala as fm
state = fm.fisher_mala(lambda x: -jnp.sum(x**2), 0.1).init(jnp.zeros(300))
print("ready", flush=True)
for i in range(10**6):
    fm.save_state(sys.argv[1], state._replace(step_size=jnp.asarray(1.0 + i, jnp.float32)))
"""


@pytest.mark.parametrize("kills", [pytest.param(3), pytest.param(40, marks=pytest.mark.slow)])
def test_a_save_killed_at_any_moment_leaves_a_readable_checkpoint(tmp_path, kills):
    """SIGKILL a process that saves in a loop, at random moments: the file on disk is
    always a whole checkpoint (the previous one or the new one), never a torn one."""
    import signal
    import subprocess
    import sys
    import time

    path = tmp_path / "state.npz"
    like = _fisher_state(300)
    rng = np.random.default_rng(kills)
    steps = []
    for _ in range(kills):
        proc = subprocess.Popen(
            [sys.executable, "-c", _SAVER, str(path)], stdout=subprocess.PIPE, text=True
        )
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.0, 0.3))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if path.exists():
            steps.append(float(fm.load_state(path, like=like).step_size))
    assert steps and all(s >= 1.0 for s in steps)


def _ld(x):
    return -0.5 * jnp.sum(x**2 / jnp.arange(1.0, 4.0))


def _sample(**kwargs):
    return fm.sample(jax.random.key(5), "fisher_mala", _ld, jnp.zeros((2, 3)), num_warmup=500,
                     num_samples=600, diagnose=False, **kwargs)


class _Crash(Exception):
    pass


def _crashed_and_resumed(monkeypatch, run, at, sink=None, **kwargs):
    """``run(**kwargs)`` crashed when its sink is handed the block starting at draw ``at``
    or later, then run again with the same arguments: the resumed result."""
    sink = fm.sinks.MemorySink if sink is None else sink
    original = sink.append

    def crash(self, done, block):
        if done >= at:
            raise _Crash
        original(self, done, block)

    monkeypatch.setattr(sink, "append", crash)
    with pytest.raises(_Crash):
        run(**kwargs)
    monkeypatch.setattr(sink, "append", original)
    return run(**kwargs)


def test_a_run_resumed_from_its_checkpoint_equals_an_uninterrupted_one(tmp_path, monkeypatch):
    whole = _sample()
    path = tmp_path / "run.npz"
    resumed = _crashed_and_resumed(
        monkeypatch, _sample, 200, checkpoint=path, checkpoint_every=100
    )  # after two blocks
    np.testing.assert_array_equal(resumed.samples, whole.samples)
    for name, value in whole.sample_stats.items():
        np.testing.assert_array_equal(resumed.sample_stats[name], value, err_msg=name)
    for a, b in zip(jax.tree.leaves(resumed.final_state), jax.tree.leaves(whole.final_state),
                    strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(resumed.warmup_info.acceptance_rate,
                                  whole.warmup_info.acceptance_rate)
    with pytest.raises(ValueError, match=r"another run.*num_samples"):
        fm.sample(jax.random.key(5), "fisher_mala", _ld, jnp.zeros((2, 3)), num_warmup=500,
                  num_samples=700, diagnose=False, checkpoint=path)


def test_a_streamed_run_resumes_into_its_files(tmp_path, monkeypatch):
    whole = _sample()
    resumed = _crashed_and_resumed(
        monkeypatch, _sample, 300, fm.sinks.FileSink, checkpoint=tmp_path / "run",
        checkpoint_every=150, output=tmp_path / "draws",
    )  # fmt: skip
    np.testing.assert_array_equal(resumed.samples, whole.samples)


_RUN = """
import sys, jax, jax.numpy as jnp, numpy as np, fisher_mala as fm
ld = lambda x: -0.5 * jnp.sum(x**2 / jnp.arange(1.0, 4.0))
print("start", flush=True)
r = fm.sample(jax.random.key(5), "fisher_mala", ld, jnp.zeros((2, 3)), num_warmup=500,
              num_samples=3000, diagnose=False, checkpoint=sys.argv[1], checkpoint_every=50)
np.save(sys.argv[2], np.asarray(r.samples))
"""


@pytest.mark.parametrize("kills", [pytest.param(1), pytest.param(6, marks=pytest.mark.slow)])
def test_a_run_killed_at_random_moments_resumes_bit_identically(tmp_path, kills):
    import signal
    import subprocess
    import sys
    import time

    reference = fm.sample(jax.random.key(5), "fisher_mala", _ld, jnp.zeros((2, 3)),
                          num_warmup=500, num_samples=3000, diagnose=False)
    checkpoint, out = tmp_path / "run.npz", tmp_path / "draws.npy"
    args = [sys.executable, "-c", _RUN, str(checkpoint), str(out)]
    rng = np.random.default_rng(kills)
    for _ in range(kills):
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "start"
        time.sleep(rng.uniform(1.0, 6.0))  # compile, warm-up or sampling: any moment
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    subprocess.run(args, check=True, timeout=300)
    np.testing.assert_array_equal(np.load(out), np.asarray(reference.samples))


_SAVES = {m: getattr(fm.run_checkpoint.RunCheckpoint, m) for m in ("save_warmup", "save_staged")}


def _record_saves(monkeypatch, method: str, crash_if=None) -> list:
    """Wrap ``RunCheckpoint.<method>``: each save is written, then its arguments recorded
    (dicts copied: the warm-up updates its own in place), then ``_Crash`` raised when
    ``crash_if(saves so far)``. Returns the list the saves are recorded in."""
    original = _SAVES[method]  # the method itself, not an earlier wrapper
    saves = []

    def save(self, *args):
        original(self, *args)
        saves.append(tuple(dict(a) if isinstance(a, dict) else a for a in args))
        if crash_if is not None and crash_if(saves):
            raise _Crash

    monkeypatch.setattr(fm.run_checkpoint.RunCheckpoint, method, save)
    return saves


@pytest.mark.parametrize(
    "sampler, options",
    [("fisher_mala", {}), ("fisher_mala", {"pooled": True}), ("adamala", {}), ("mala", {}),
     ("hmc", {}), ("mmala", {}), ("fisher_mala", {"record_precond": True})],
)  # fmt: skip
def test_a_run_killed_inside_its_warmup_resumes_there(tmp_path, monkeypatch, sampler, options):
    def run(**kwargs):
        return fm.sample(jax.random.key(5), sampler, _ld, jnp.zeros((2, 3)), num_warmup=400,
                         num_samples=100, diagnose=False, **options, **kwargs)  # fmt: skip

    whole = run()
    path = tmp_path / "run.npz"
    _record_saves(monkeypatch, "save_warmup", crash_if=lambda saves: len(saves) == 3)
    with pytest.raises(_Crash):
        run(checkpoint=path, checkpoint_every=60)
    segments = _record_saves(monkeypatch, "save_warmup")
    resumed = run(checkpoint=path, checkpoint_every=60)
    assert segments[0][-2] == 4  # the resumed run starts after the three segments saved
    np.testing.assert_array_equal(resumed.samples, whole.samples)
    for field in ("acceptance_rate", "is_accepted", "num_grad_evals", "initial_step_size"):
        np.testing.assert_array_equal(
            getattr(resumed.warmup_info, field), getattr(whole.warmup_info, field), err_msg=field
        )
    for a, b in zip(jax.tree.leaves(resumed.warmup_info.trace),
                    jax.tree.leaves(whole.warmup_info.trace), strict=True):  # fmt: skip
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(resumed.parameters.step_size, whole.parameters.step_size)


def _correlated_ld(x):
    scale = jnp.array([[1.0, 0.0, 0.0], [0.9, 0.5, 0.0], [0.3, -0.4, 0.7]])
    z = jax.scipy.linalg.solve_triangular(scale, x, lower=True)
    return -0.5 * jnp.sum(z**2)


@pytest.mark.parametrize(
    "sampler, target, options, crash_at",
    [("fisher_nuts", _correlated_ld, {}, "fisher"),  # dense R, stopping rule, metric="auto"
     ("fisher_nuts", _ld, {}, "tuning"),  # metric="auto" chooses the diagonal R
     ("fisher_hmc", _correlated_ld, {"metric": "dense", "stopping_rule": False}, "tuning"),
     ("fisher_nuts", _correlated_ld, {"rank": 2}, "fisher"),
     ("fisher_nuts", _correlated_ld, {"pooled": True}, "fisher")],
)  # fmt: skip
def test_a_fisher_nuts_run_killed_inside_its_warmup_resumes_there(
    tmp_path, monkeypatch, sampler, target, options, crash_at
):
    """Fisher NUTS / HMC: the warm-up's parts (Fisher phase, host looks, step-size phase)
    are saved; a run resumed from any of them equals the uninterrupted one, bit for bit."""

    def run(**kwargs):
        return fm.sample(jax.random.key(5), sampler, target, jnp.zeros((2, 3)), num_warmup=1400,
                         num_samples=100, diagnose=False, **options, **kwargs)  # fmt: skip

    whole = run()
    path = tmp_path / "run.npz"
    def crash_if(saves):  # the third save or later, in the stage to crash in
        return saves[-1][1]["stage"] == crash_at and len(saves) >= 3

    crashed = _record_saves(monkeypatch, "save_staged", crash_if)
    with pytest.raises(_Crash):
        run(checkpoint=path, checkpoint_every=100)
    saved = [meta for _, meta, _ in crashed]
    saves = _record_saves(monkeypatch, "save_staged")
    resumed = run(checkpoint=path, checkpoint_every=100)
    resumed_at = [meta for _, meta, _ in saves]
    # the resumed run goes on from the last save: its first save is the part after it
    assert (resumed_at[0]["stage"], resumed_at[0].get("done")) != ("fisher", 1)
    if saved[-1]["stage"] == resumed_at[0]["stage"]:
        assert resumed_at[0]["done"] > saved[-1]["done"]
    np.testing.assert_array_equal(resumed.samples, whole.samples)
    for field in ("acceptance_rate", "is_accepted", "num_grad_evals", "initial_step_size"):
        np.testing.assert_array_equal(
            getattr(resumed.warmup_info, field), getattr(whole.warmup_info, field), err_msg=field
        )
    np.testing.assert_array_equal(resumed.parameters.step_size, whole.parameters.step_size)
    for a, b in zip(jax.tree.leaves(resumed.parameters.sqrt_precond),
                    jax.tree.leaves(whole.parameters.sqrt_precond), strict=True):  # fmt: skip
        np.testing.assert_array_equal(a, b)


def test_segments_of_a_warmup_cover_it_in_order_and_respect_its_blocks():
    from fisher_mala.schedule import Phase, Schedule, segments

    phases = (
        Phase("a", 130, step=None, key=None),
        Phase("b", 0, step=None, key=None),
        Phase("c", 250, step=None, key=None, block=40, grads_per_step=2),
    )
    parts = segments(Schedule(None, phases, None), every=100)
    assert [(p.phase, p.num_steps, p.enter, p.begin) for p in parts] == [
        (0, 100, True, 0), (0, 30, False, 100), (1, 0, True, 130),
        (2, 80, True, 130), (2, 80, False, 210), (2, 80, False, 290), (2, 10, False, 370),
    ]  # fmt: skip
    assert [p.grads_per_step for p in parts][-1] == 2
    with pytest.raises(ValueError, match="every"):
        segments(Schedule(None, phases, None), every=0)


def _funnel_ld(x):  # Neal's funnel in 2-d: no one R whitens it, the Fisher phase plateaus
    return -0.5 * x[0] ** 2 / 9.0 - 0.5 * x[1] ** 2 * jnp.exp(-x[0]) - 0.5 * x[0]


def test_a_run_resumed_after_a_plateau_keeps_its_step_size_target(tmp_path, monkeypatch, x64):
    """A Fisher phase ended on a plateau tunes the step towards PLATEAU_TARGET_ACCEPTANCE;
    a run resumed in its step-size phase aims at the same target (it is in the saved
    state) and equals the uninterrupted run."""
    positions = jax.random.normal(jax.random.key(0), (2, 2))

    def run(**kwargs):
        return fm.sample(jax.random.key(1), "fisher_nuts", _funnel_ld, positions,
                         num_warmup=4000, num_samples=100, diagnose=False, **kwargs)  # fmt: skip

    whole = run()
    assert whole.target_acceptance == fm.whitened_warmup.PLATEAU_TARGET_ACCEPTANCE
    path = tmp_path / "run.npz"
    crashed = _record_saves(monkeypatch, "save_staged", lambda s: s[-1][1]["stage"] == "tuning")
    with pytest.raises(_Crash):
        run(checkpoint=path, checkpoint_every=100)
    assert crashed[-1][1]["plateau"] is True
    monkeypatch.undo()
    resumed = run(checkpoint=path, checkpoint_every=100)
    assert resumed.target_acceptance == whole.target_acceptance
    np.testing.assert_array_equal(resumed.samples, whole.samples)
    np.testing.assert_array_equal(resumed.parameters.step_size, whole.parameters.step_size)


def test_a_fisher_nuts_run_after_a_plateau_resumes_its_draws_with_the_same_kernel(
    tmp_path, monkeypatch
):
    """What the warm-up chose on the host for the draws (after a plateau: BlackJAX's U-turn
    criterion, a higher target acceptance) is saved with the sampling phase's checkpoints:
    a run resumed among its draws equals the uninterrupted one, bit for bit."""
    monkeypatch.setattr(
        fm.whitened_warmup.FisherHMCWarmup, "look", lambda self, previous, state: "plateau"
    )

    def run(**kwargs):
        return fm.sample(jax.random.key(5), "fisher_nuts", _correlated_ld, jnp.zeros((2, 3)),
                         num_warmup=1000, num_samples=300, diagnose=False, **kwargs)  # fmt: skip

    whole = run()
    assert whole.target_acceptance == fm.whitened_warmup.PLATEAU_TARGET_ACCEPTANCE
    resumed = _crashed_and_resumed(
        monkeypatch, run, 100, checkpoint=tmp_path / "run.npz", checkpoint_every=100
    )  # after the first block
    np.testing.assert_array_equal(resumed.samples, whole.samples)
    assert resumed.target_acceptance == whole.target_acceptance
