"""Translates an mx.optimizer.Optimizer object into the spec the servers run
(optimizers/update_rule.h: rule, hyper-parameters by MXNet's names, learning-rate schedule,
multi_precision; lr_mult / wd_mult per tensor).

MXNet's own dist_sync pickles the optimizer to its servers and loses param_dict (so
lr_mult and wd_mult never reach them); here they are kept, per tensor.
"""
import mxnet as mx

from .._core import core

# Attributes of MXNet's optimizer objects whose name differs from the hyper-parameter's.
_ATTRIBUTE = {("*", "learning_rate"): "lr", ("adagrad", "eps"): "float_stable_eps"}


def rule_name(optimizer):
    return type(optimizer).__name__.lower()


def check_rule(optimizer):
    """The rule's name, or NotImplementedError naming it and listing the supported ones."""
    rule = rule_name(optimizer)
    known = core.known_rules()
    if rule not in known:
        raise NotImplementedError(
            f"optimizer '{type(optimizer).__name__}' ({rule}) cannot run on the hybridps "
            f"servers (they run: {', '.join(known)}). Run it on the workers instead: "
            "gluon.Trainer(..., update_on_kvstore=False)")
    return rule


def hyper_parameters(optimizer, rule):
    params = {}
    for name in core.rule_param_names(rule):
        attr = _ATTRIBUTE.get((rule, name)) or _ATTRIBUTE.get(("*", name)) or name
        value = getattr(optimizer, attr, None)
        if value is None:
            continue
        if isinstance(value, bool):
            value = 1.0 if value else 0.0
        try:
            params[name] = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"optimizer {rule}: hyper-parameter {name} = {value!r} is not a "
                             "number") from None
    return params


def schedule(optimizer):
    s = optimizer.lr_scheduler
    if s is None:
        return {"kind": "none"}
    kind = type(s).__name__
    d = {"kind": kind, "base_lr": float(s.warmup_final_lr),
         "warmup_steps": int(s.warmup_steps), "warmup_begin_lr": float(s.warmup_begin_lr),
         "warmup_mode": str(s.warmup_mode)}
    if isinstance(s, mx.lr_scheduler.MultiFactorScheduler):
        d.update(steps=[int(x) for x in s.step], factor=float(s.factor))
    elif isinstance(s, mx.lr_scheduler.FactorScheduler):
        d.update(step=int(s.step), factor=float(s.factor),
                 stop_factor_lr=float(s.stop_factor_lr))
    elif isinstance(s, mx.lr_scheduler.PolyScheduler):
        d.update(max_update=int(s.max_update), final_lr=float(s.final_lr),
                 pwr=float(s.power))
    elif isinstance(s, mx.lr_scheduler.CosineScheduler):
        d.update(max_update=int(s.max_update), final_lr=float(s.final_lr))
    else:
        raise NotImplementedError(
            f"learning-rate scheduler {kind} cannot run on the hybridps servers (they run "
            "FactorScheduler, MultiFactorScheduler, PolyScheduler, CosineScheduler); use "
            "update_on_kvstore=False")
    return d


def multipliers(optimizer, name_of):
    """{tensor name: (lr_mult, wd_mult)} for the keys MXNet knows (the Trainer's
    param_dict: index -> Parameter; the tables' keys, also names: Module's keys are the
    parameters' names, and its optimizer sets wd_mult 0 for the biases by name), as
    Optimizer._get_lrs / _get_wds pick them."""
    out = {}
    keys = set(optimizer.param_dict) | set(optimizer.lr_mult) | set(optimizer.wd_mult)
    for index in sorted(keys, key=str):
        mults = []
        for kind in ("lr_mult", "wd_mult"):
            table = getattr(optimizer, kind)
            if index in optimizer.param_dict:
                m = getattr(optimizer.param_dict[index], kind)
            elif index in table:
                m = table[index]
            elif index in optimizer.idx2name:
                m = table.get(optimizer.idx2name[index], 1.0)
            else:
                m = 1.0
            mults.append(float(m))
        if mults != [1.0, 1.0]:
            out[name_of(index)] = tuple(mults)
    return out


def server_spec(optimizer, name_of):
    """The dict the extension's set_optimizer takes."""
    rule = check_rule(optimizer)
    return {"rule": rule, "params": hyper_parameters(optimizer, rule),
            "schedule": schedule(optimizer),
            "multi_precision": bool(optimizer.multi_precision),
            "multipliers": multipliers(optimizer, name_of)}
