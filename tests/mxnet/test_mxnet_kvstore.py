"""The MXNet plugin against real MXNet 1.9.1: 2 workers (and 2 servers) started by
scripts/hybridrun, the measurements done by mx_worker.py, the checks here.

Needs the build tree (HYBRIDPS_BUILD_DIR: hybridps-scheduler, hybridps-server and the
extension _hybridps_core) and a Python with mxnet, numpy and scikit-learn.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
BUILD = Path(os.environ.get("HYBRIDPS_BUILD_DIR", ROOT / "build"))
HYBRIDRUN = ROOT / "scripts" / "hybridrun"
WORKER = HERE / "mx_worker.py"
# fp32: the distributed sum of two half-batch gradients vs one sum over the whole batch,
# rounded differently, over 10 steps of SGD with momentum.
TOLERANCE = 2e-5

pytest.importorskip("mxnet")
pytest.importorskip("sklearn")


def env():
    e = dict(os.environ)
    paths = [str(ROOT / "mxnet_kvstore"), str(BUILD / "mxnet_kvstore")]
    e["PYTHONPATH"] = os.pathsep.join(paths + [e.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    e.setdefault("OMP_NUM_THREADS", "1")
    e.setdefault("MXNET_CPU_WORKER_NTHREADS", "1")
    return e


def run_job(store, scenarios, state_dir, timeout=240, placement=("-np", "2")):
    backend = ["--backend", "dist_allreduce"] if store == "dist_allreduce" else [
        "--servers", "2"]
    cmd = [sys.executable, str(HYBRIDRUN), *placement, *backend,
           "--bin-dir", str(BUILD), "--", sys.executable, str(WORKER), store, *scenarios]
    proc = subprocess.run(cmd, env=dict(env(), MXW_STATE_DIR=str(state_dir)),
                          capture_output=True, text=True, timeout=timeout)
    results = {}
    decoder = json.JSONDecoder()
    for chunk in proc.stdout.split("RESULT ")[1:]:  # lines of two workers may interleave
        try:
            r, _ = decoder.raw_decode(chunk)
        except ValueError:
            continue
        results.setdefault(r["scenario"], {})[r["rank"]] = r
    return proc, results


def check_job(proc, results, count):
    if proc.returncode != 0 or len(results) < count:
        pytest.fail(f"job failed (exit {proc.returncode}):\n{proc.stdout[-6000:]}\n"
                    f"{proc.stderr[-3000:]}")


@pytest.fixture(scope="module", params=["dist_hybrid", "dist_allreduce"])
def job(request, tmp_path_factory):
    """Job 1 runs every scenario (save first, on the job's first store); job 2 loads
    what job 1 saved."""
    state_dir = tmp_path_factory.mktemp(f"states-{request.param}")
    # Plain sums first: once a Trainer runs the optimizer on dist_hybrid's servers, every
    # push_pull of the job is an update.
    # byteps first: its bps.init() (no backend given) makes the store from hybridrun's
    # HYBRIDPS_BACKEND, which the later hps.init(store) calls then must agree with.
    scenarios = ["byteps", "byteps_training", "byteps_trainer_broadcasts", "byteps_module",
                 "horovod", "horovod_more", "horovod_fp16", "horovod_timeline", "deferred", "mismatch", "broadcast_mismatch", "devices", "devices_staged", "devices_staged_host",
                 "order", "classic", "module_fit_workers", "sync_sgd_workers",
                 "save", "sync_sgd", "compressed_sgd", "imagenet_benchmark",
                 "devices_trainer", "devices_trainer_staged", "digits", "overlap",
                 "classic_optimizer", "module_fit", "plain_sum",
                 "horovod_objects", "horovod_process_sets_two",
                 "horovod_shutdown"]  # shutdown ends the store: last
    proc, results = run_job(request.param, scenarios, state_dir)
    check_job(proc, results, len(scenarios))
    proc, loaded = run_job(request.param, ["load"], state_dir)
    check_job(proc, loaded, 1)
    results.update(loaded)
    return request.param, results


def both(results, scenario):
    got = results[scenario]
    assert sorted(got) == [0, 1], f"{scenario}: results from ranks {sorted(got)}"
    return got[0], got[1]


def test_sync_sgd_matches_one_process_with_twice_the_batch(job):
    store, results = job
    for r in both(results, "sync_sgd"):
        # dist_hybrid: the servers run SGD; dist_allreduce: the workers do.
        assert r["update_on_kvstore"] == (store == "dist_hybrid"), r
        assert r["min_moved"] > 1e-3, "the weights did not move: nothing was tested"
        assert r["max_abs_diff"] <= TOLERANCE, (store, r)


def test_sync_sgd_with_the_optimizer_on_the_workers(job):
    """gluon.Trainer(..., update_on_kvstore=False) on either store: the gradients summed
    by pushpull, the workers update; 2 workers follow one process with the whole batch."""
    store, results = job
    for r in both(results, "sync_sgd_workers"):
        assert r["update_on_kvstore"] is False, r
        assert r["min_moved"] > 1e-3, "the weights did not move: nothing was tested"
        assert r["max_abs_diff"] <= TOLERANCE, (store, r)


def test_an_imagenet_benchmark_style_module_job(job):
    """train_imagenet.py --benchmark 1's pattern (Module.fit, kvstore=the store, synthetic
    images, convolutions and batch norms): trains on both stores, the weights move, stay
    finite and are the same on both workers."""
    store, results = job
    r0, r1 = both(results, "imagenet_benchmark")
    for r in (r0, r1):
        assert r["update_on_kvstore"] == (store == "dist_hybrid"), r
        assert r["finite"] and r["min_moved"] > 0, r
        assert r["samples_per_s"] > 0, r
        assert "stem_conv_weight" in r["params"] and "fc1_weight" in r["params"], r
    assert r0["weights_sha256"] == r1["weights_sha256"], (r0, r1)


def test_two_bit_compression_follows_mxnets_own(job):
    """gluon.Trainer(compression_params={'type': '2bit', ...}): on dist_hybrid, 2 workers
    end with the weights MXNet's own 'device' store reaches compressing the same
    gradients the same way; dist_allreduce refuses 2bit by name."""
    store, results = job
    for r in both(results, "compressed_sgd"):
        if store == "dist_allreduce":
            assert r["two_bit"].startswith("NotImplementedError") and "dist_hybrid" in \
                r["two_bit"], r
            assert r["one_bit"].startswith("ValueError") and "'1bit'" in r["one_bit"], r
            assert r["none"] is None, r
            continue
        assert r["update_on_kvstore"] is True, r
        assert r["min_moved"] > 1e-3, "the weights did not move: nothing was tested"
        assert r["max_abs_diff"] <= TOLERANCE, r


def test_classic_init_push_pull(job):
    """MXNet's init / push / pull with no optimizer on the store (as dist_sync without
    one): pull gives rank 0's init value, then the workers' sum of the last push. Worker
    w offers its own values (the expected ones below for 2 workers)."""
    store, results = job
    for r in both(results, "classic"):
        n = r["n"]
        assert n == 2, r
        workers = n * (n + 1) / 2  # sum of w + 1 over the workers
        assert r["int_init"] == [[10.0] * 3] * 2, r  # rank 0's 10 * (0 + 1)
        assert r["init_value_untouched"] == [[10.0 * (r["rank"] + 1)] * 3] * 2, r
        assert r["int_push"] == [[workers] * 3] * 2, r
        assert r["str_init"] == [[7.0] * 4] * 2, r
        # Two devices, (w + 1) * (d + 1) each: summed over devices, then workers.
        assert r["str_devices"] == [[3 * workers] * 4] * 2, r
        assert r["str_last_push"] == [100.0 * workers] * 4, r  # the last push's sum only
        assert r["list_init"] == [[1.0] * 2, [2.0] * 3], r
        assert r["list_push"] == [[[2 * workers] * 2] * 2, [10.0 * workers] * 3], r
        assert r["push_no_init"] == [workers * i for i in range(5)], r
        assert r["broadcast_list"] == [[5.0] * 3, [6.0] * 3], r  # one-element lists
        assert r["lists_pushpull_broadcast"] == [[workers] * 2, [2 * workers] * 3,
                                                 [1.0] * 2, [3.0] * 3], r
        # One array twice per worker: 2 per worker, summed; then in place, 2 * 2n each.
        assert r["repeated_arrays"] == [[2.0 * n], [4.0 * n * n]], r


def test_classic_api_errors_name_the_key(job):
    store, results = job
    for r in both(results, "classic"):
        e = r["errors"]
        assert e["pull_unknown"].startswith("ValueError") and "'never'" in e["pull_unknown"] \
            and "init" in e["pull_unknown"], e
        assert e["row_sparse_pull"].startswith("NotImplementedError"), e
        assert "row_sparse_pull of key 'w'" in e["row_sparse_pull"], e
        assert "dense arrays only" in e["row_sparse_pull"], e
        for what in ("push_sparse", "init_sparse", "pull_sparse_strict"):
            assert e[what] and e[what].startswith("NotImplementedError"), (what, e)
            assert "row_sparse" in e[what] and "dense arrays only" in e[what], (what, e)
        assert "key 'w'" in e["push_sparse"] and "key 's'" in e["init_sparse"], e
        assert "key 'w'" in e["push_shape"] and "(5,)" in e["push_shape"] \
            and "(4,)" in e["push_shape"], e
        assert e["broadcast_two"].startswith("TypeError") and "'b2'" in e["broadcast_two"], e
        assert e["capability"] == "ValueError: Unknown capability: compression", e
        assert r["pull_sparse_ignored"] is None, r  # ignore_sparse=True skips them


def test_is_capable_on_the_class_and_the_instance(job):
    """type(kv).is_capable(...) as MXNet's test_kvstore_custom calls it: the same answer as
    the instance and as the C++ store."""
    store, results = job
    for r in both(results, "classic"):
        want = store == "dist_hybrid"
        assert r["capable"] == {"class": want, "class_upper": want, "instance": want,
                                "core": want}, r


def test_classic_push_pull_with_the_optimizer_on_the_store(job):
    """dist_hybrid after set_optimizer(SGD, lr 0.5): each push of gradients is one update
    on the servers and pull returns the weights, for a key init'ed before set_optimizer
    and one after. dist_allreduce refuses set_optimizer."""
    store, results = job
    for r in both(results, "classic_optimizer"):
        if store == "dist_allreduce":
            assert r["error"].startswith("NotImplementedError") and "optimizer" in r["error"]
            continue
        assert r["error"] is None, r
        n = r["n"]
        workers = n * (n + 1) / 2
        for key, w0 in (("before", 2.0), ("after", 4.0)):  # rank 0's init values
            w1 = w0 - 0.5 * workers
            w2 = w1 - 0.5 * 2 * n  # one per device, two devices, then a zero gradient
            assert r[key] == [[w0] * 3, [w1] * 3, [w2] * 3], (key, r)


@pytest.mark.parametrize("scenario", ["module_fit", "module_fit_workers"])
def test_module_fit(job, scenario):
    """mx.mod.Module.fit(kvstore=the store), 2 workers with batch b against one process
    with batch 2b: trains, both workers end with the same weights, those of the one
    process. module_fit: Module's default (the optimizer on dist_hybrid's servers;
    dist_allreduce cannot, so the workers); module_fit_workers: MXNET_UPDATE_ON_KVSTORE=0
    (kv.init, then pushpull of the gradients, the workers update)."""
    store, results = job
    r0, r1 = both(results, scenario)
    for r in (r0, r1):
        assert r["update_on_kvstore"] == (scenario == "module_fit" and store == "dist_hybrid")
        assert r["test_accuracy"] >= 0.9, r
        # fp32 rounding of two half-batch sums against one sum, over 135 steps.
        assert r["max_abs_diff"] <= 1e-4, r
    assert r0["weights_sha256"] == r1["weights_sha256"], (r0, r1)
    assert r0["test_accuracy"] == r1["test_accuracy"], (r0, r1)


@pytest.mark.parametrize("scenario", ["devices", "devices_staged", "devices_staged_host"])
def test_one_array_per_device(job, scenario):
    """Sums over the devices and the workers, exact: device d of worker w holds
    base * (w + 1) * (k + 1) + d in round k."""
    store, results = job
    base = np.arange(15, dtype=np.float32).reshape(3, 5)
    for r in both(results, scenario):
        n = r["n"]
        workers = n * (n + 1) / 2  # sum of w + 1
        for k, outs in enumerate(r["rounds"]):
            want = (base * 2 * workers * (k + 1) + n).tolist()
            assert outs == [want, want], (scenario, r["rank"], k, outs)
        want = (base * 2 * workers + n).tolist()
        assert r["inplace"] == [want, want], r
        assert r["one"] == [(base * workers).tolist()] * 2, r
        assert r["bcast"] == [np.full((3, 5), 10.0 * (n - 1) + 1).tolist()] * 2, r
        # Staged: through the store's pinned host arrays; else none made.
        staged = scenario != "devices"
        assert r["staging"] == (["cpu_pinned(0)"] if staged else []), r
        if scenario == "devices_staged":
            # Summed on one of the devices, the keys spread over both (the second key
            # goes to the device with fewer bytes); only the sum is staged.
            assert r["merged_on"] == {"dev": "cpu(0)", "dev_inplace": "cpu(1)"}, r
            assert r["dev_host_slots"] == ["sum"], r
        else:
            # Host arrays only are on the host: nothing to merge; or every array staged.
            assert r["merged_on"] == {}, r
            assert r["dev_host_slots"] == (["0", "1", "sum"] if staged else []), r


def test_operations_on_a_name_keep_their_issue_order(job):
    """Worker 1's first push_pull waits for its input in MXNet's engine while its second
    one is ready: both still pair with worker 0's in the order issued (1 + 2, 10 + 20)."""
    store, results = job
    for r in both(results, "order"):
        assert (r["first"], r["second"]) == (3.0, 30.0), (store, r)


@pytest.mark.parametrize("scenario", ["devices_trainer", "devices_trainer_staged"])
def test_trainer_over_two_devices_matches_one_process(job, scenario):
    store, results = job
    for r in both(results, scenario):
        assert r["update_on_kvstore"] == (store == "dist_hybrid"), r
        assert r["min_moved"] > 1e-3, "the weights did not move: nothing was tested"
        assert r["max_abs_diff"] <= TOLERANCE, (store, r)
        assert r["staging"] == (["cpu_pinned(0)"] if scenario.endswith("_staged") else []), r
        # Staged: the devices' gradients summed on the devices (both carry keys).
        assert r["merged_on"] == (["cpu(0)", "cpu(1)"] if scenario.endswith("_staged")
                                  else []), r


def test_digits_reaches_95_percent(job):
    store, results = job
    r0, r1 = both(results, "digits")
    assert r0["test_accuracy"] >= 0.95, r0
    # Both workers hold the same weights (same test accuracy, same checksum).
    assert r0["test_accuracy"] == r1["test_accuracy"]
    assert abs(r0["weights_checksum"] - r1["weights_checksum"]) < 1e-3
    assert r0["samples_per_s"] > 0


def test_save_load_states_continue_identically(job):
    store, results = job
    for r in both(results, "load"):
        assert r["max_abs_diff"] <= 1e-6, r
        assert r["update_on_kvstore"] == results["save"][r["rank"]]["update_on_kvstore"]


def test_communication_overlaps_backward(job):
    store, results = job
    for r in both(results, "overlap"):
        steps = [s for s in r["steps"] if s]
        assert len(steps) >= 2, r
        # Measured: at least half of the push_pulls (the later layers') started before
        # the first layer's gradient existed, in most steps. (hybridps.mxnet turns off
        # MXNet's bulking of backward operators, which would make all gradients ready at
        # once.)
        overlapped = [s for s in steps if s["started_before_backward_end"] * 2 >= s["pushes"]]
        assert len(overlapped) * 2 > len(steps), r


def test_horovod_style_helpers(job):
    store, results = job
    for r in both(results, "horovod"):
        n = r["size"]
        assert r["sum"] == [n * (n + 1) / 2] * 5 and r["mean"] == [(n + 1) / 2] * 5, r
        assert r["broadcast"] == [10.0 * (n - 1)] * 3, r  # root_rank n-1's value
        assert r["trainer_diff"] <= TOLERANCE and r["optimizer_diff"] <= TOLERANCE, r


def test_horovod_topology_and_build(job):
    store, results = job
    for r in both(results, "horovod_more"):
        assert r["initialized"] is True, r
        # Nodes of local_size workers with consecutive ranks (hybridrun: one host).
        ls = r["local_size"]
        assert 2 % ls == 0 and r["local_rank"] == r["rank"] % ls, r
        assert (r["cross_rank"], r["cross_size"]) == (r["rank"] // ls, 2 // ls), r
        b = r["built"]
        assert b["mpi_built"] is False and b["mpi_enabled"] is False, b
        assert b["mpi_threads_supported"] is False and b["rocm_built"] is False, b
        assert b["gloo_enabled"] is (store == "dist_allreduce"), b
        # The extension's build flags (core.built_with_*) must match what it holds: Gloo
        # linked (ldd), the CUDA runtime and NCCL loaded at run time (their loader's
        # settings in its bytes), never linked.
        so = next((BUILD / "mxnet_kvstore").glob("_hybridps_core*.so"))
        ldd = subprocess.run(["ldd", str(so)], capture_output=True, text=True).stdout
        assert b["gloo_built"] is ("libgloo" in ldd), b
        assert "libnccl" not in ldd and "libcudart" not in ldd, ldd
        binary = so.read_bytes()
        # As Horovod: the NCCL version built with (2.14 or later here), 0 without NCCL.
        if b"HYBRIDPS_NCCL_LIBRARY" in binary:
            assert isinstance(b["nccl_built"], int) and b["nccl_built"] >= 21400, b
        else:
            assert b["nccl_built"] == 0, b
        assert b["cuda_built"] is (b"HYBRIDPS_CUDART_LIBRARY" in binary), b


def test_horovod_allreduce_ops_and_scaling(job):
    store, results = job
    for r in both(results, "horovod_more"):
        assert r["size"] == 2, r
        # rank + 1 on each worker: 1 + 2.
        assert r["op_sum"] == [3.0] * 4 and r["average_false"] == [3.0] * 4, r
        assert r["op_average"] == [1.5] * 4 and r["default"] == [1.5] * 4, r
        assert r["average_true"] == [1.5] * 4, r
        assert r["scaled_sum"] == [60.0] * 4, r  # (2 * 1 + 2 * 2) * 10
        assert r["scaled_average"] == [2.25] * 4, r  # (3 + 6) / 2 * 0.5
        assert r["out_of_place"] == [6.0] * 4, r
        assert r["out_of_place_input"] == [r["rank"] + 1.0] * 4, r  # left as it was
        assert r["in_place"] == [1.5] * 4 and r["in_place_same"] is True, r
        assert r["ops"] == {"Min": [[1.0, -5.0], [-1.0, 0.5]],
                            "Max": [[2.0, 4.0], [3.0, 8.0]],
                            "Product": [[2.0, -20.0], [-3.0, 4.0]]}, r
        assert r["min_scaled"] == [[20.0, -100.0], [-20.0, 10.0]], r
        assert r["max_int_in_place"] == [True, "int32", [3, 7]], r
        for err in (r["adasum"], r["refused_"]):
            assert err.startswith("NotImplementedError") and "op=Adasum" in err, err
        assert r["both"] and r["both"].startswith("ValueError"), r
        for call, err in r["missing"].items():
            assert err.startswith(f"NotImplementedError: hybridps.mxnet.{call} is not"), err


def test_horovod_alltoall_and_reducescatter(job):
    store, results = job
    r0, r1 = both(results, "horovod_more")
    assert r0["alltoall"] == [[[0.0] * 2, [10.0] * 2, [11.0] * 2], [1, 2], "int32"], r0
    assert r1["alltoall"] == [[[1.0] * 2, [2.0] * 2, [12.0] * 2], [2, 1], "int32"], r1
    assert r0["alltoall_even"] == [0.0, 1.0, 10.0, 11.0], r0
    assert r1["alltoall_even"] == [2.0, 3.0, 12.0, 13.0], r1
    for r in (r0, r1):
        bad_splits, uneven = r["alltoall_bad"]
        assert bad_splits.startswith("InvalidArgument") and "splits [1, 1]" in bad_splits, r
        assert uneven.startswith("InvalidArgument") and "does not divide" in uneven, r
    # Row i summed: 3 (i + 1); averaged: 1.5 (i + 1); max: 2 (i + 1).
    assert r0["reducescatter_sum"] == [[3.0] * 2, [6.0] * 2, [9.0] * 2], r0
    assert r1["reducescatter_sum"] == [[12.0] * 2, [15.0] * 2], r1
    assert r0["reducescatter"] == [[1.5] * 2, [3.0] * 2, [4.5] * 2], r0
    assert r1["reducescatter"] == [[6.0] * 2, [7.5] * 2], r1
    assert r0["reducescatter_max"] == [[2.0] * 2, [4.0] * 2, [6.0] * 2], r0
    assert r1["reducescatter_max"] == [[8.0] * 2, [10.0] * 2], r1


def test_horovod_grouped_allreduce(job):
    store, results = job
    for r in both(results, "horovod_more"):
        # Sum of rank + 1 and of 10 * (rank + 1), times 2; then averaged in place again.
        assert r["grouped_"] == [[6.0] * 4, [[60.0] * 3] * 2], r
        assert r["grouped_same"] == [True, True], r
        assert r["grouped"] == [[1.5] * 4, [2.5] * 3], r  # means
        # (rank + 1) multiplied: 1 * 2; and the Product of the m tensors above.
        assert r["grouped_product"] == [[2.0] * 4, [[2.0, -20.0], [-3.0, 4.0]]], r


def test_horovod_allgather(job):
    store, results = job
    for r in both(results, "horovod_more"):
        # 2 rows from rank 0, then 3 from rank 1, in rank order.
        assert r["allgather"] == [[0.0] * 3, [1.0] * 3, [100.0] * 3, [101.0] * 3,
                                  [102.0] * 3], r
        assert r["allgather_int"] == [7, 14], r
        assert r["allgather_1d"] == [0.0, 10.0, 11.0], r
        assert r["allgather_again"] == [[0.0] * 3, [1.0] * 3], r


def test_horovod_process_sets_on_one_node(job):
    """Sets [0] and [1] on a node of 2 workers: each reduces alone (plain sums also after
    dist_hybrid's servers took an optimizer), [0, 1] is the job's set, a worker outside a
    set gets a named error, and the job goes on."""
    store, results = job
    for r, g in enumerate(both(results, "horovod_process_sets_two")):
        assert g["sum"] == [r + 1.0] * 3 and g["average"] == [4.0 * (r + 1)] * 2, g
        assert g["gathered"] == [float(r)] * 2 and g["set_rank"] == 0, g
        assert g["other_rank"].startswith("ValueError") and \
            f"worker {r} is not part of" in g["other_rank"], g
        assert "duplicate process set" in g["duplicate"], g
        assert g["other"].startswith("InvalidArgument") and \
            f"worker {r} is not part of" in g["other"], g
        assert g["job"] == [2.0, 2.0] and g["removed"] is True, g


def test_horovod_objects(job):
    store, results = job
    r0, r1 = both(results, "horovod_objects")
    for r in (r0, r1):
        assert r["from1"] == r1["mine"] and r["from0"] == r0["mine"], r
        assert r["again"] == repr([1] * 6), r
        assert r["gathered"] == repr([eval(r0["mine"]), eval(r1["mine"])]), r
        assert r["gathered_none"] == repr(["x" * 1000, None]), r


def test_horovod_fp16_compression(job):
    """fp16 gradients (relative rounding 2**-11) over 6 steps of SGD with momentum stay
    within 5e-4 of the fp32 single-process weights, and further off than fp32 gradients
    (TOLERANCE) get: the gradients did go as float16 (measured: 5.7e-5 on both stores)."""
    store, results = job
    for r in both(results, "horovod_fp16"):
        assert r["wire_dtype"] == "float16" and r["back"] == "float32", r
        assert r["int_dtype"] == "int32" and r["none_same"] is True, r
        for kind in ("trainer", "optimizer"):
            assert r["moved"][kind] > 1e-3, "the weights did not move: nothing was tested"
            assert TOLERANCE < r["diffs"][kind] <= 5e-4, (store, r)


def test_horovod_timeline_file(job):
    """start_timeline/stop_timeline write worker 0's timeline (the spans of
    HYBRIDPS_TIMELINE) as Chrome trace JSON, from the start only; worker 1 writes
    nothing (as Horovod, whose coordinator alone writes the file)."""
    store, results = job
    r0, r1 = both(results, "horovod_timeline")
    assert r1["trace"] is None, "worker 1 wrote the file"
    for r in (r0, r1):
        assert r["again"].startswith("ValueError") and "already" in r["again"], r
    trace = r0["trace"]
    assert trace and trace["otherData"]["process"] == "worker 0", trace
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert all(e["dur"] >= 0 and {"name", "cat", "ts", "pid", "tid"} <= set(e)
               for e in spans), spans
    ops = [e for e in spans if e["cat"] == "operation"]
    names = [e["name"] for e in ops]
    assert len(ops) == 2 and "tl_sum" in names[0] and "tl_bcast" in names[1], names
    assert not any("tl_before" in e["name"] for e in spans), names  # before the start
    assert ops[0]["ts"] + ops[0]["dur"] <= ops[1]["ts"] + 1, ops  # waited for, in turn
    stages = {e["cat"] for e in spans}
    # Each store's own stages, not only the operations.
    expected = {"push, server, reply"} if store == "dist_hybrid" else {"negotiation"}
    assert expected <= stages, stages


def test_horovod_shutdown(job):
    store, results = job
    for r in both(results, "horovod_shutdown"):
        assert r["before"] == [2.0, 2.0] and r["initialized"] is False, r
        assert r["again"].startswith("RuntimeError") and "shutdown" in r["again"], r
        assert r["rank_after"].startswith("ValueError") and "shut down" in r["rank_after"]
        assert r["second_shutdown"] is None, r  # a no-op


def test_byteps_init_ranks_and_sizes(job):
    """bps.init() with no argument joins the store hybridrun chose (HYBRIDPS_BACKEND); the
    ranks and sizes are the Horovod API's."""
    store, results = job
    for r in both(results, "byteps"):
        assert r["store"] == store, r
        assert r["rank_"] == r["rank"] and r["size"] == 2, r
        ls = r["local_size"]
        assert 2 % ls == 0 and r["local_rank"] == r["rank"] % ls, r
        assert r["same_as_horovod"] is True, r


def test_byteps_push_pull_mean_sum_in_place(job):
    """byteps_push_pull writes the tensor itself and returns None: the mean over the
    workers by default, the sum with is_average=False, in every dtype."""
    store, results = job
    for r in both(results, "byteps"):
        assert r["returned"] == "None", r
        # [[1..3], [4..6]] times rank + 1: (1 + 2) / 2 = 1.5 times.
        assert r["avg"] == [[1.5, 3.0, 4.5], [6.0, 7.5, 9.0]], r
        assert r["sum"] == [3.0] * 4, r
        assert r["dtypes"] == {"f64": ["float64", [0.75] * 3],  # (0.25 + 1.25) / 2
                               "f16": ["float16", [4.5] * 5],  # 1.5 + 3
                               "i32": ["int32", [21, 21]]}, r  # 7 + 14
        assert r["same_unchanged"] is True, r  # the mean of equal tensors is the tensor
        assert r["twice"] == [15.0, 15.0], r  # (10 + 20) / 2, then (15 + 15) / 2


def test_byteps_broadcast_parameters_from_rank_1(job):
    store, results = job
    for r in both(results, "byteps"):
        assert r["bcast_dict"] == {"b": [100.0, 101.0, 102.0],
                                   "w": [[11.0, 11.0], [11.0, 11.0]]}, r  # rank 1's
        assert r["bcast_params"] == r["root_params"], r  # rank 1's initial weights


def test_byteps_refusals_name_the_call(job):
    store, results = job
    for r in both(results, "byteps"):
        e = r["errors"]
        assert e["undeclared"].startswith("ValueError") and "'nope'" in e["undeclared"], e
        assert "byteps_declare_tensor('nope')" in e["undeclared"], e
        assert e["unnamed"].startswith("ValueError: byteps_push_pull needs name="), e
        for call, key, what in (
                ("byteps_push_pull", "version", "version=1 is not supported"),
                ("byteps_declare_tensor", "declare_kwargs",
                 "compression arguments ['byteps_compressor_type'] of 'g' is not supported"),
                ("suspend", "suspend", "is not available: hybridps jobs are not elastic"),
                ("resume", "resume", "is not available: hybridps jobs are not elastic"),
                ("DistributedTrainer", "compressor",
                 "compression_params ['compressor', 'ef'] is not supported"),
                ("DistributedOptimizer", "async",
                 "asynchronous training (BYTEPS_ENABLE_ASYNC is set) is not supported"),
                ("Compression.nag", "nag", "is not available")):
            assert e[key] and e[key].startswith(
                f"NotImplementedError: hybridps.mxnet.byteps.{call}"), (key, e[key])
            assert what in e[key], (key, e[key])
        assert e["bcast_list"].startswith("ValueError: broadcast_parameters"), e
        # A DistributedOptimizer given to DistributedTrainer: unwrapped, with a warning.
        assert r["unwrapped"][0] == "SGD", r
        assert any("unwrapped" in m for m in r["unwrapped"][1]), r


@pytest.mark.parametrize("kind", ["trainer", "trainer_devices", "optimizer"])
def test_byteps_training_matches_one_process(job, kind):
    """Workers seeded differently, root_rank 1, step(per-worker batch): both end with the
    same weights, those of one process with the whole batch from rank 1's weights.
    DistributedTrainer scales the gradients itself (BytePS's convention: the optimizer's
    rescale_grad is 1), also over two devices per worker (each half of the batch);
    DistributedOptimizer keeps gluon's 1 / batch."""
    store, results = job
    r0, r1 = both(results, "byteps_training")
    for r in (r0, r1):
        g = r[kind]
        assert g["moved"] > 1e-3, "the weights did not move: nothing was tested"
        assert g["diff"] <= TOLERANCE, (store, kind, g)
        assert g["rescale_grad"] == (1.0 / 8 if kind == "optimizer" else 1.0), g
        if kind == "trainer_devices":
            assert r["devices_equal"] is True, r
    assert r0[kind]["sha256"] == r1[kind]["sha256"], (r0[kind], r1[kind])


def test_byteps_module_with_distributed_optimizer(job):
    """BytePS's Module flow: broadcast_parameters of get_params() from rank 1, then fit
    with bps.DistributedOptimizer: both workers end with the weights of one process with
    the whole batch (10 steps)."""
    store, results = job
    r0, r1 = both(results, "byteps_module")
    for r in (r0, r1):
        assert r["moved"] > 1e-3, "the weights did not move: nothing was tested"
        assert r["max_abs_diff"] <= TOLERANCE, (store, r)
    assert r0["weights_sha256"] == r1["weights_sha256"], (r0, r1)


def test_byteps_trainer_fp16(job):
    """compression_params={'fp16': True}: float16 on the wire, so further from the fp32
    one-process weights than TOLERANCE, but close (as test_horovod_fp16_compression)."""
    store, results = job
    for r in both(results, "byteps"):
        assert r["compression"] == ["float16", "float32", True], r  # bps.Compression
    r0, r1 = both(results, "byteps_training")
    for r in (r0, r1):
        g = r["trainer_fp16"]
        assert g["moved"] > 1e-3, g
        assert TOLERANCE < g["diff"] <= 5e-4, (store, g)
    assert r0["trainer_fp16"]["sha256"] == r1["trainer_fp16"]["sha256"]


def test_byteps_trainer_broadcasts_at_creation_and_first_step(job):
    """Rank r's weights start at r + 1, root_rank 1: rank 1's 2.0 everywhere once the
    trainer exists; rank 0's weights set to 100 afterwards are rank 1's again after the
    first step (a zero gradient); a deferred parameter is rank 1's at its first use."""
    store, results = job
    for r in both(results, "byteps_trainer_broadcasts"):
        assert r["root"] == 1, r
        assert r["created"] == [2.0] * 12, r
        assert r["first_step"] == [2.0] * 12, r
        assert r["deferred_out"] == [8.0] * 3, r  # four ones times rank 1's 2.0


def test_plain_sum_after_server_optimizer(job):
    store, results = job
    for r in both(results, "plain_sum"):
        if store == "dist_hybrid":  # its servers run the Trainers' optimizer by now
            assert results["sync_sgd"][r["rank"]]["update_on_kvstore"] is True
            assert r["error"] and "update_on_kvstore=False" in r["error"], r
        else:
            assert r["error"] is None and r["value"] == [2.0] * 4, r


def test_mismatched_shapes_name_the_tensor(job):
    store, results = job
    for r in both(results, "mismatch"):
        assert r["error"], f"rank {r['rank']}: a size mismatch went unnoticed"
        assert "mismatch" in r["error"], r["error"]


def test_broadcast_parameters_waits_for_deferred_initialisation(job):
    """Workers seeded differently, weights of unknown shape when broadcast_parameters runs:
    after the first forward pass both hold rank 0's weights and compute the same output."""
    store, results = job
    r0, r1 = both(results, "deferred")
    assert len(r0["deferred"]) >= 2, r0["deferred"]  # both Dense weights were deferred
    assert r0["weights"].keys() == r1["weights"].keys()
    for name in r0["weights"]:
        assert r0["weights"][name] == r1["weights"][name], f"{store}: {name} differs"
    assert r0["out"] == r1["out"]


def test_mismatched_broadcasts_fail_every_rank_every_time(job):
    """Two workers of one node (dist_hybrid reduces them in shared memory) broadcast with
    different dtypes, sizes, roots or shapes of one size, and allreduce with shapes of one
    size, 20 times each: each rank gets a named error each time, never the root's bytes."""
    store, results = job
    words = {"dtype": ["int32", "float32"], "size": ["4", "6"], "root": ["root"],
             "shape": ["(2, 3)", "(3, 2)"], "allreduce-shape": ["(2, 3)", "(3, 2)"]}
    for r in both(results, "broadcast_mismatch"):
        assert len(r["got"]) == 100, r
        for g in r["got"]:
            assert "error" in g, f"{store} rank {r['rank']}: {g} (no error)"
            assert f"bcast-{g['case']}-{g['rep']}" in g["error"], g
            for w in words[g["case"]]:
                assert w in g["error"], g


def run_python(code, extra_env=None, timeout=120):
    e = env()
    for k in [k for k in e if k.startswith("HYBRIDPS_")]:
        del e[k]
    e.update(extra_env or {})
    return subprocess.run([sys.executable, "-c", code], env=e, capture_output=True,
                          text=True, timeout=timeout)


def test_missing_import_is_a_clear_error():
    # The hook is what scripts/build.sh's .pth file installs; called here explicitly so
    # the test does not depend on the virtual environment's site-packages.
    p = run_python("import hybridps._mxnet_hook as h; h.install()\n"
                   "import mxnet as mx\n"
                   "mx.kv.create('dist_hybrid')\n")
    assert p.returncode != 0
    assert "import hybridps.mxnet" in p.stderr, p.stderr[-2000:]


def test_no_job_is_a_clear_error():
    p = run_python("import mxnet as mx, hybridps.mxnet\nmx.kv.create('dist_allreduce')\n")
    assert p.returncode != 0
    assert "hybridrun" in p.stderr and "HYBRIDPS_SCHEDULER_PORT" in p.stderr, p.stderr[-2000:]


def test_gradient_compression_and_optimizer_rules_are_clear_errors():
    code = ("import mxnet as mx, hybridps.mxnet as h\n"
            "kv = h.DistAllreduce.__new__(h.DistAllreduce)\n"
            "kv._TYPE = 'dist_allreduce'\n"
            "try:\n kv.set_gradient_compression({'type': '2bit'})\n"
            "except NotImplementedError as e: print('OK', e)\n")
    p = run_python(code)
    assert p.returncode == 0 and "OK" in p.stdout and "compression" in p.stdout, p.stderr


def test_optimizer_multipliers_of_a_module():
    """Module's optimizer (made with the symbol) keeps lr_mult / wd_mult by parameter name
    (wd_mult 0 for the biases) and Module's keys are those names: the servers get them."""
    code = r'''
import json, mxnet as mx
from hybridps.mxnet import optimizer as o
net = mx.sym.FullyConnected(mx.sym.Variable("data"), num_hidden=4, name="fc1")
net = mx.sym.SoftmaxOutput(net, name="softmax")
names = ["fc1_weight", "fc1_bias"]
opt = mx.optimizer.create("sgd", sym=net, param_idx2name=dict(enumerate(names)),
                          learning_rate=0.1, wd=1e-4)
print(json.dumps(o.server_spec(opt, lambda k: f"0/{k}")["multipliers"]))
'''
    p = run_python(code)
    assert p.returncode == 0, p.stderr[-3000:]
    line = next(x for x in p.stdout.splitlines() if x.startswith("{"))
    assert json.loads(line) == {"0/fc1_bias": [1.0, 0.0]}, line


def test_optimizer_translation_and_unsupported_rule():
    """What set_optimizer sends to the servers: rule, hyper-parameters under MXNet's
    names, schedule, per-tensor multipliers; an unknown rule is a clear error naming it."""
    code = r'''
import json, mxnet as mx
from hybridps.mxnet import optimizer as o
s = mx.lr_scheduler.MultiFactorScheduler(step=[5, 9], factor=0.5, base_lr=0.3,
                                         warmup_steps=2)
opt = mx.optimizer.create("adam", learning_rate=0.01, beta1=0.8, wd=0.001,
                          clip_gradient=2.0, rescale_grad=0.25, lr_scheduler=s,
                          multi_precision=True)
opt.set_lr_mult({3: 0.5}); opt.set_wd_mult({3: 0.0})
print(json.dumps(o.server_spec(opt, lambda i: f"0/{i}")))
try:
    o.server_spec(mx.optimizer.create("ftrl"), str)
except NotImplementedError as e:
    print("ERROR", e)
'''
    p = run_python(code)
    assert p.returncode == 0, p.stderr[-3000:]
    lines = p.stdout.splitlines()  # MXNet prints a note about the schedule's base_lr
    spec = json.loads(next(line for line in lines if line.startswith("{")))
    assert spec["rule"] == "adam" and spec["multi_precision"] is True
    assert spec["params"] == {"learning_rate": 0.01, "beta1": 0.8, "beta2": 0.999,
                              "epsilon": 1e-8, "wd": 0.001, "clip_gradient": 2.0,
                              "rescale_grad": 0.25, "lazy_update": 1.0}
    assert spec["schedule"] == {"kind": "MultiFactorScheduler", "base_lr": 0.3,
                                "warmup_steps": 2, "warmup_begin_lr": 0.0,
                                "warmup_mode": "linear", "steps": [5, 9], "factor": 0.5}
    assert spec["multipliers"] == {"0/3": [0.5, 0.0]}
    err = next(line for line in lines if line.startswith("ERROR"))
    assert "Ftrl" in err and "sgd" in err and "update_on_kvstore=False" in err, err


@pytest.mark.parametrize("store", ["dist_hybrid", "dist_allreduce"])
def test_the_timeline_names_the_parameters(store, tmp_path):
    """hybridrun --timeline-filename around Gluon training: the spans of the Trainer's
    tensors carry the parameters' names (the plugin's names file, merged by hybridrun)
    beside the store's index names."""
    out_file = tmp_path / "digits.json"
    backend = ["--backend", "dist_allreduce"] if store == "dist_allreduce" else [
        "--servers", "1"]
    proc = subprocess.run(
        [sys.executable, str(HYBRIDRUN), "-np", "2", *backend, "--bin-dir", str(BUILD),
         "--timeline-filename", str(out_file), "--", sys.executable,
         str(ROOT / "mxnet_kvstore" / "examples" / "train_digits.py"), "--kvstore", store,
         "--epochs", "1"],
        env=env(), capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    trace = json.loads(out_file.read_text())
    spans = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    named = [e for e in spans if "parameter" in e.get("args", {})]
    params = {e["args"]["parameter"] for e in named}
    assert any(p.endswith("_weight") for p in params) and any(
        p.endswith("_bias") for p in params), params
    for e in named:
        assert f"'{e['args']['parameter']}' (" in e["name"], e
    ops = [e for e in named if e["name"].startswith("push_pull of ")]
    assert ops, [e["name"] for e in spans[:20]]
    assert not list(tmp_path.glob("*.parts")), "the parts folder stays"
    if store == "dist_hybrid":  # the Trainer's SGD runs on the servers: a stage of its own
        assert any(e["cat"] == "optimizer update" for e in spans), {e["cat"] for e in spans}
