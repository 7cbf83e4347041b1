"""hybridps's update rules against MXNet 1.9.1 itself.

Each case runs the same random weights and gradients (fixed seed) for STEPS updates
through `mx.optimizer.create(name, ...)` with `mx.optimizer.get_updater` (what MXNet's
kvstore runs for update_on_kvstore), and through `hybridps-optimizer-check` (the C++
rules), then compares the weights after every step.

Tolerance: none for the elementwise rules (SGD, NAG, Signum, Adam, AdamW, AdaGrad,
RMSProp, and every schedule): every weight after every step must be bit-identical.
LAMB and LARS need whole-tensor norms, which MXNet's CPU multi_sum_sq sums sequentially
in float32 (in float16 arithmetic for float16 weights) and we sum in double (so that a
tensor split over servers gives the same norms): float32 weights within
1e-5 * max(|mxnet|, 1), float16 weights within one float16 ulp at that scale
(2^-10 * max(|mxnet|, 1)).
AdamW has no optimizer class in MXNet 1.9.1: its reference loops over the operator
`mx.nd.contrib.adamw_update` (`mp_adamw_update`), which the rule copies.

Run from CTest (HYBRIDPS_BUILD_DIR set) or by hand:
  HYBRIDPS_BUILD_DIR=build .venv/bin/python -m pytest -q -s tests/optimizers/test_against_mxnet.py
"""
from __future__ import annotations

import math
import os
import pathlib
import subprocess
import tempfile
from typing import Any, Optional

import numpy as np
import pytest

mx = pytest.importorskip("mxnet")
# MXNet 1.9.1 touches scipy.sparse.csr on every mx.nd.array: not ours to fix.
pytestmark = pytest.mark.filterwarnings("ignore:Please import `csr_matrix`:DeprecationWarning")

BUILD = pathlib.Path(os.environ.get("HYBRIDPS_BUILD_DIR",
                                    pathlib.Path(__file__).resolve().parents[2] / "build"))
TOOL = BUILD / "tests" / "optimizers" / "hybridps-optimizer-check"
STEPS = 50
COUNT = 1001
BOOL_PARAMS = {"centered", "bias_correction", "momentum_correction", "lazy_update",
               "correct_bias"}


def case(cid: str, rule: str, params: dict[str, float], dtype: str = "float32",
         schedule: Optional[dict[str, Any]] = None, partitions: int = 1,
         lr_mult: float = 1.0, wd_mult: float = 1.0) -> Any:
    return pytest.param(rule, params, dtype, schedule, partitions, lr_mult, wd_mult, id=cid)


FACTOR = {"kind": "factor", "step": 10, "factor": 0.5, "base_lr": 0.1,
          "warmup_steps": 5, "warmup_begin_lr": 0.01, "warmup_mode": "linear"}
CASES = [
    case("sgd", "sgd", {"learning_rate": 0.1}),
    case("sgd_momentum_wd_clip", "sgd", {"learning_rate": 0.05, "momentum": 0.9, "wd": 1e-3,
                                         "clip_gradient": 0.5, "rescale_grad": 0.5}),
    case("sgd_momentum_fp16", "sgd", {"learning_rate": 0.05, "momentum": 0.9}, "float16"),
    case("sgd_lr_wd_mult", "sgd", {"learning_rate": 0.05, "momentum": 0.9, "wd": 0.01},
         lr_mult=2.0, wd_mult=0.5),
    case("nag_momentum_wd", "nag", {"learning_rate": 0.05, "momentum": 0.9, "wd": 0.01}),
    case("nag_plain_clip", "nag", {"learning_rate": 0.05, "wd": 0.01, "clip_gradient": 0.3}),
    case("nag_fp16", "nag", {"learning_rate": 0.05, "momentum": 0.9, "wd": 0.01}, "float16"),
    case("signum", "signum", {"wd_lh": 0.01, "wd": 1e-3, "clip_gradient": 0.4}),
    case("signsgd", "signum", {"momentum": 0.0, "wd": 0.01}),
    case("adam", "adam", {"learning_rate": 0.01}),
    case("adam_wd_clip", "adam", {"learning_rate": 0.01, "wd": 1e-3, "clip_gradient": 0.8,
                                  "beta1": 0.8, "epsilon": 1e-6}),
    case("adam_fp16", "adam", {"learning_rate": 0.01, "wd": 1e-3}, "float16"),
    case("adamw", "adamw", {"learning_rate": 0.01, "eta": 0.5, "wd": 0.01,
                            "clip_gradient": 1.0}),
    case("adamw_correct_bias", "adamw", {"learning_rate": 0.01, "correct_bias": 1, "wd": 0.01}),
    case("adamw_fp16", "adamw", {"learning_rate": 0.01, "wd": 0.01}, "float16"),
    case("adagrad", "adagrad", {"learning_rate": 0.05, "wd": 1e-3, "clip_gradient": 0.7,
                                "rescale_grad": 0.5}),
    case("adagrad_fp16", "adagrad", {"learning_rate": 0.05}, "float16"),
    case("rmsprop", "rmsprop", {"learning_rate": 0.01, "wd": 1e-3}),
    case("rmsprop_centered", "rmsprop", {"learning_rate": 0.01, "centered": 1, "gamma1": 0.95,
                                         "clip_weights": 2.0, "clip_gradient": 1.5}),
    case("rmsprop_fp16", "rmsprop", {"learning_rate": 0.01}, "float16"),
    case("lamb", "lamb", {"learning_rate": 0.01, "wd": 0.01}),
    case("lamb_bounds_nobias", "lamb", {"learning_rate": 0.01, "bias_correction": 0,
                                        "lower_bound": 40, "upper_bound": 50,
                                        "clip_gradient": 1.0}),
    case("lamb_3_partitions", "lamb", {"learning_rate": 0.01, "wd": 0.01}, partitions=3),
    case("lamb_fp16_3_partitions", "lamb", {"learning_rate": 0.01}, "float16", partitions=3),
    case("lars_momentum_factor_3_partitions", "lars",
         {"momentum": 0.9, "eta": 0.01, "eps": 1e-8, "wd": 1e-4},
         schedule=dict(FACTOR, base_lr=0.5), partitions=3),
    case("lars_plain", "lars", {"learning_rate": 0.5, "eta": 0.02, "clip_gradient": 0.5}),
    case("lars_fp16", "lars", {"learning_rate": 0.5, "momentum": 0.9, "eta": 0.02}, "float16"),
    case("sched_factor_warmup", "sgd", {"momentum": 0.9}, schedule=FACTOR),
    case("sched_factor_lr_override", "sgd", {"learning_rate": 0.2}, schedule=FACTOR),
    case("sched_adam_default_lr_overrides", "adam", {}, schedule=FACTOR),
    case("sched_multifactor", "sgd", {}, schedule={"kind": "multifactor", "steps": [7, 20, 33],
                                                   "factor": 0.3, "base_lr": 0.1}),
    case("sched_poly_warmup", "sgd", {}, schedule={"kind": "poly", "max_update": 40,
                                                   "base_lr": 0.1, "pwr": 2, "final_lr": 0.01,
                                                   "warmup_steps": 8,
                                                   "warmup_begin_lr": 0.02}),
    case("sched_cosine_constant_warmup", "sgd", {"momentum": 0.5},
         schedule={"kind": "cosine", "max_update": 30, "base_lr": 0.1, "final_lr": 0.001,
                   "warmup_steps": 4, "warmup_begin_lr": 0.05, "warmup_mode": "constant"}),
]


def make_scheduler(s: dict[str, Any]) -> Any:
    kw = {k: v for k, v in s.items() if k != "kind"}
    if s["kind"] == "factor":
        return mx.lr_scheduler.FactorScheduler(**kw)
    if s["kind"] == "multifactor":
        kw["step"] = kw.pop("steps")
        return mx.lr_scheduler.MultiFactorScheduler(**kw)
    if s["kind"] == "poly":
        return mx.lr_scheduler.PolyScheduler(**kw)
    return mx.lr_scheduler.CosineScheduler(**kw)


def run_mxnet_adamw(params: dict[str, float], dtype: str, w0: np.ndarray,
                    grads: np.ndarray) -> np.ndarray:
    """AdamW: MXNet 1.9.1's contrib operator, looped as an optimizer would."""
    lr0 = params.get("learning_rate", 0.001)
    b1, b2 = params.get("beta1", 0.9), params.get("beta2", 0.999)
    kw = {"beta1": b1, "beta2": b2, "epsilon": params.get("epsilon", 1e-8),
          "wd": params.get("wd", 0.0), "eta": params.get("eta", 1.0)}
    if params.get("clip_gradient"):
        kw["clip_gradient"] = params["clip_gradient"]
    rescale = mx.nd.array([params.get("rescale_grad", 1.0)])
    w = mx.nd.array(w0, dtype=dtype)
    mean = mx.nd.zeros(w.shape)
    var = mx.nd.zeros(w.shape)
    w32 = w.astype("float32")
    out = np.empty((STEPS, w0.size), np.float32)
    for t in range(1, STEPS + 1):
        lr = lr0
        if params.get("correct_bias"):
            lr *= math.sqrt(1. - b2 ** t) / (1. - b1 ** t)
        g = mx.nd.array(grads[t - 1], dtype=dtype)
        if dtype == "float16":
            mx.nd.contrib.mp_adamw_update(w, g, mean, var, w32, rescale, out=w, lr=lr, **kw)
        else:
            mx.nd.contrib.adamw_update(w, g, mean, var, rescale, out=w, lr=lr, **kw)
        out[t - 1] = w.asnumpy().astype(np.float32)
    return out


def run_mxnet(rule: str, params: dict[str, float], dtype: str, schedule: Optional[dict],
              lr_mult: float, wd_mult: float, w0: np.ndarray, grads: np.ndarray) -> np.ndarray:
    if rule == "adamw":
        return run_mxnet_adamw(params, dtype, w0, grads)
    kw: dict[str, Any] = {k: (bool(v) if k in BOOL_PARAMS else v) for k, v in params.items()}
    if schedule is not None:
        kw["lr_scheduler"] = make_scheduler(schedule)
    if dtype == "float16":
        kw["multi_precision"] = True
    opt = mx.optimizer.create(rule, **kw)
    opt.set_lr_mult({0: lr_mult})
    opt.set_wd_mult({0: wd_mult})
    updater = mx.optimizer.get_updater(opt)
    w = mx.nd.array(w0, dtype=dtype)
    out = np.empty((STEPS, w0.size), np.float32)
    for t in range(STEPS):
        updater(0, mx.nd.array(grads[t], dtype=dtype), w)
        out[t] = w.asnumpy().astype(np.float32)
    return out


def run_ours(rule: str, params: dict[str, float], dtype: str, schedule: Optional[dict],
             partitions: int, lr_mult: float, wd_mult: float, w0: np.ndarray,
             grads: np.ndarray) -> np.ndarray:
    assert TOOL.exists(), f"build {TOOL.name} first (HYBRIDPS_BUILD_DIR={BUILD})"
    lines = [f"rule {rule}", f"dtype {dtype}", f"count {w0.size}", f"steps {STEPS}",
             f"partitions {partitions}", f"multi_precision {int(dtype == 'float16')}",
             f"lr_mult {lr_mult!r}", f"wd_mult {wd_mult!r}"]
    lines += [f"param {k} {v!r}" for k, v in params.items()]
    if schedule is not None:
        lines.append(f"schedule {schedule['kind']}")
        for k, v in schedule.items():
            if k != "kind":
                v = ",".join(map(str, v)) if isinstance(v, list) else v
                lines.append(f"schedule.{k} {v}")
    with tempfile.TemporaryDirectory() as d:
        p = pathlib.Path(d)
        (p / "spec").write_text("\n".join(lines) + "\n")
        w0.astype(np.float32).tofile(p / "w")
        grads.astype(np.float32).tofile(p / "g")
        subprocess.run([str(TOOL), str(p / "spec"), str(p / "w"), str(p / "g"), str(p / "out")],
                       check=True, timeout=120)
        return np.fromfile(p / "out", np.float32).reshape(STEPS, w0.size)


@pytest.mark.parametrize("rule,params,dtype,schedule,partitions,lr_mult,wd_mult", CASES)
def test_matches_mxnet(rule: str, params: dict[str, float], dtype: str,
                       schedule: Optional[dict], partitions: int, lr_mult: float,
                       wd_mult: float) -> None:
    rng = np.random.default_rng(20240917)
    w0 = rng.standard_normal(COUNT).astype(np.float32)
    grads = rng.standard_normal((STEPS, COUNT)).astype(np.float32)
    want = run_mxnet(rule, params, dtype, schedule, lr_mult, wd_mult, w0, grads)
    got = run_ours(rule, params, dtype, schedule, partitions, lr_mult, wd_mult, w0, grads)
    assert np.isfinite(want).all()
    scale = np.maximum(np.abs(want), 1.0)
    err = np.abs(got - want)
    rel = float((err / scale).max())
    bits_equal = float((got == want).mean())
    print(f"\n  {rule:8s} {dtype:8s} max |ours-mxnet| {err.max():.3e}  scaled {rel:.3e}  "
          f"bit-identical {100 * bits_equal:.1f}%")
    first_bad = int(np.argmax((err / scale).max(axis=1))) + 1
    if rule not in ("lamb", "lars"):
        assert bits_equal == 1.0, f"not bit-identical from step {first_bad}"
    else:
        tol = 1e-5 if dtype == "float32" else 2.0 ** -10
        assert rel <= tol, f"step {first_bad}"
