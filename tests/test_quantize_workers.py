"""Calibration in several processes, and a stopped calibration continued: the same model, bit for bit."""

from __future__ import annotations

import pytest

import qlinear.quantize as qq
from qlinear._errors import QuantizationError
from qlinear.quantize import _calibrate
from qlinear.quantize._calibration_executors import Here, executor
from qlinear.quantize._ray import SHARD_BATCHES, OnRay
from qlinear.quantize._workers import InProcesses
from quantize_models import layernorm_attention, outlier_mlp


def _bytes(result) -> bytes:
    return result.model.SerializeToString(deterministic=True)


def test_two_workers_give_the_one_process_model():
    # int4 weights: GPTQ's Gram matrices and bias correction's sums come from the workers too.
    model, data = outlier_mlp()
    cal, ev = {"x": data["x"][:800]}, {"x": data["x"][800:]}
    one = qq.quantize_model(model, None, cal, eval=ev, weights="int4")
    two = qq.quantize_model(model, None, cal, eval=ev, weights="int4", workers=2)
    assert _bytes(one) == _bytes(two) and two.report.calibration.batches == 50
    attention, tokens = layernorm_attention()
    assert _bytes(qq.quantize_model(attention, None, tokens)) == _bytes(qq.quantize_model(attention, None, tokens, workers=2))


def test_a_stopped_calibration_continues_to_the_same_model(tmp_path, monkeypatch):
    monkeypatch.setattr(_calibrate, "SAVE_EVERY_SECONDS", 0.0)
    model, data = outlier_mlp()
    batches = [{"x": data["x"][i : i + 16]} for i in range(0, 800, 16)]
    ev = {"x": data["x"][800:]}
    settings = dict(eval=ev, weights="int4", smoothquant=False)

    def stopped_after(k):
        for i, b in enumerate(batches):
            if i == k:
                raise KeyboardInterrupt  # the user's Ctrl-C
            yield b

    state = tmp_path / "state.npz"
    with pytest.raises(KeyboardInterrupt):
        qq.quantize_model(model, None, stopped_after(17), save_stats_to=state, **settings)
    resumed = qq.quantize_model(model, None, iter(batches), resume=state, **settings)
    whole = qq.quantize_model(model, None, iter(batches), **settings)
    assert _bytes(resumed) == _bytes(whole) and resumed.report.calibration.batches == len(batches)
    # Continuing a finished calibration runs no batch (it reads past them) and gives the same model.
    done = tmp_path / "done.npz"
    qq.quantize_model(model, None, iter(batches), save_stats_to=done, **settings)
    again = qq.quantize_model(model, None, iter(batches), resume=done, **settings)
    assert _bytes(again) == _bytes(whole)


def test_an_interrupted_calibration_in_workers_ends_them_and_leaves_no_folder(tmp_path, monkeypatch):
    import multiprocessing as mp
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the workers' copy of the model is written
    model, data = outlier_mlp()
    batches = [{"x": data["x"][i : i + 16]} for i in range(0, 800, 16)]
    started, before = [], set(mp.active_children())

    def stopped_after(k):
        for i, b in enumerate(batches):
            if i == k:
                started.extend(set(mp.active_children()) - before)
                raise KeyboardInterrupt  # the user's Ctrl-C, while the workers hold batches
            yield b

    with pytest.raises(KeyboardInterrupt):
        qq.quantize_model(model, None, stopped_after(9), eval={"x": data["x"][800:]}, workers=2)
    assert len(started) == 2 and not any(p.is_alive() for p in started) and set(mp.active_children()) <= before
    assert list(tmp_path.iterdir()) == []


def test_workers_and_resume_are_checked():
    model, data = outlier_mlp()
    with pytest.raises(QuantizationError, match="workers must be an int >= 1"):
        qq.quantize_model(model, None, data, workers=0)
    with pytest.raises(QuantizationError, match="not both"):
        qq.quantize_model(model, None, data, stats="a.npz", resume="b.npz")


def test_calibration_on_ray_gives_the_one_process_model():
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'qlinear[ray]')")
    model, data = outlier_mlp()
    cal, ev = {"x": data["x"][:800]}, {"x": data["x"][800:]}
    one = qq.quantize_model(model, None, cal, eval=ev, weights="int4")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        on_ray = qq.quantize_model(model, None, cal, eval=ev, weights="int4", ray="auto")
        # A stopped run cancels the tasks it left in flight: they end with it.
        cancelled = []
        cancel = ray.cancel
        ray.cancel = lambda ref, **kw: cancelled.append(ref) or cancel(ref, **kw)
        batches = [{"x": data["x"][i : i + 16]} for i in range(0, 800, 16)]

        def stopped_after(k):
            for i, b in enumerate(batches):
                if i == k:
                    raise KeyboardInterrupt
                yield b

        try:
            with pytest.raises(KeyboardInterrupt):
                qq.quantize_model(model, None, stopped_after(3 * SHARD_BATCHES + 1), eval=ev, weights="int4", ray="auto")
        finally:
            ray.cancel = cancel
        assert cancelled
    finally:
        ray.shutdown()
    assert _bytes(on_ray) == _bytes(one) and on_ray.report.calibration.batches == 50


def test_calibration_executor_from_workers_and_ray():
    sess = object()  # stands for this process's session, which the executor only holds
    assert executor(sess, workers=1, ray_address=None, first=2, runtime="ort-cpu") == Here(sess, 2)
    assert executor(sess, workers=3, ray_address=None, first=0, runtime="ort-cpu") == InProcesses(3, "ort-cpu")
    assert executor(sess, workers=3, ray_address="auto", first=0, runtime="ort-cpu") == OnRay("auto", "ort-cpu")
    # Nothing observed: every batch is only counted, here.
    assert executor(None, workers=3, ray_address="auto", first=5, runtime="ort-cpu") == Here(None, 5)
