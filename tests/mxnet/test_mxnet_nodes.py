"""The Horovod-style API with 3 workers on two nodes (2 + 1) of this host, both stores:
what each call must give for n = 3, computed here; horovod_generic and
horovod_process_sets in mx_horovod_n.py make the calls. Shares the job runner of
test_mxnet_kvstore.py."""
import pytest

from test_mxnet_kvstore import check_job, run_job

pytest.importorskip("mxnet")


# 3 workers on two nodes of this host (2 + 1): hybridrun's hosts n0 and n1 are reached by
# a "remote shell" that runs the command here (the host name only fills sh's $0), each
# worker's node is its host's name, and every process listens on loopback.
THREE_ON_TWO_NODES = ("-np", "3", "-H", "n0:2,n1:1", "--network-interface", "lo",
                      "--remote-shell", "sh -c {command} {host}")


@pytest.fixture(scope="module", params=["dist_hybrid", "dist_allreduce"])
def job3(request, tmp_path_factory):
    """A job of 3 workers on two nodes (2 + 1) running horovod_process_sets (first: its
    init adds sets) and horovod_generic."""
    proc, results = run_job(request.param, ["horovod_process_sets", "horovod_generic"],
                            tmp_path_factory.mktemp(f"job3-{request.param}"),
                            placement=THREE_ON_TWO_NODES)
    check_job(proc, results, 2)
    return request.param, results


def test_horovod_api_with_three_workers_on_two_nodes(job3):
    """Every call's result computed for n = 3 (rank r gives values that tell it apart),
    on a node of two local ranks and a node of one; a shape mismatch is named each time."""
    store, results = job3
    got = results["horovod_generic"]
    assert sorted(got) == [0, 1, 2], sorted(got)
    n = 3
    t = [[[r + 1.0, -(r + 1.0)], [2.0 * r, 1.0]] for r in range(n)]
    def reduce(f):
        return [[f([t[r][i][j] for r in range(n)]) for j in range(2)] for i in range(2)]
    product = lambda v: v[0] * v[1] * v[2]  # noqa: E731
    for r, g in got.items():
        # Nodes n0 (ranks 0, 1) and n1 (rank 2): local ranks 0, 1, 0; Horovod's cross
        # communicators are the ranks of one local rank: {0, 2} and {1}.
        assert g["size"] == 3 and g["local_size"] == (2 if r < 2 else 1), g
        assert g["local_rank"] == [0, 1, 0][r], g
        assert (g["cross_rank"], g["cross_size"]) == [(0, 2), (0, 1), (1, 2)][r], g
        assert g["Sum"] == reduce(sum), g
        assert g["Average"] == [[v / n for v in row] for row in reduce(sum)], g
        assert g["Min"] == reduce(min) and g["Max"] == reduce(max), g
        assert g["Product"] == reduce(product), g
        assert g["broadcast"] == [20.0] * 3, g
        assert g["allgather"] == [[float(q)] * 2 for q in range(n) for _ in range(q + 1)], g
        splits = [[(q + j) % 2 + 1 for j in range(n)] for q in range(n)]
        expect = []
        for q in range(n):
            begin = sum(splits[q][:r])
            expect += [100.0 * q + i for i in range(begin, begin + splits[q][r])]
        assert g["alltoall"] == [expect, [splits[q][r] for q in range(n)]], g
        # 2n + 1 = 7 rows of i * (r + 1), summed 6 i: 3 rows to worker 0, 2 to each other.
        first, mine = [(0, 3), (3, 2), (5, 2)][r]
        assert g["reducescatter"] == [6.0 * i for i in range(first, first + mine)], g
        assert g["objects"] == [{"rank": q} for q in range(n)], g
        for err in g["mismatch"]:
            assert err and "(2, 3)" in err and "(3, 2)" in err, (store, r, err)


def test_process_sets_with_three_workers_on_two_nodes(job3):
    """Sets [0, 2] (across the nodes) and [1] from init, [0, 1] (two local ranks of n0)
    added later: each call reduces over the set's members only, roots are job ranks,
    allgather's order is the set's; a worker outside a set, a root outside it, a
    duplicate, disagreeing or out-of-range ranks each get a named error; the set's
    unnamed operations leave the job's numbering alone; removal ends a set."""
    store, results = job3
    got = results["horovod_process_sets"]
    assert sorted(got) == [0, 1, 2], sorted(got)
    members = {"a": [0, 2], "b": [1], "c": [0, 1]}
    t = {r: [r + 1.0, -2.0 * r] for r in range(3)}
    for r, g in got.items():
        assert g["ids"] == {"a": 1, "b": 2, "c": 3}, g
        assert g["included"] == {k: r in m for k, m in members.items()}, g
        assert g["sizes"] == {k: len(m) for k, m in members.items()}, g
        assert g["set_rank"] == {k: m.index(r) for k, m in members.items() if r in m}, g
        for k, m in members.items():
            if r not in m:
                assert g[f"{k}.foreign"] and "InvalidArgument" in g[f"{k}.foreign"] and \
                    f"worker {r} is not part of" in g[f"{k}.foreign"], g
                continue
            res = g[k]
            cols = [[t[q][j] for q in m] for j in range(2)]
            assert res["Sum"] == [sum(c) for c in cols], (k, res)
            assert res["Average"] == [sum(c) / len(m) for c in cols], (k, res)
            assert res["Max"] == [max(c) for c in cols], (k, res)
            prod = [1.0, 1.0]
            for q in m:
                prod = [prod[j] * t[q][j] for j in range(2)]
            assert res["Product"] == prod, (k, res)
            assert res["broadcast"] == [10.0 * m[-1]] * 2, (k, res)
            assert res["allgather"] == [float(q) for q in m for _ in range(q + 1)], (k, res)
            me = m.index(r)
            assert res["alltoall"] == [[100.0 * q + me for q in m], [1] * len(m)], (k, res)
            whole = [i * sum(q + 1 for q in m) for i in range(4)]
            each, extra = divmod(4, len(m))
            begin = each * me + min(me, extra)
            assert res["reducescatter"] == whole[begin:begin + each + (me < extra)], (k, res)
            assert res["objects"] == [{"rank": q} for q in m], (k, res)
            assert res["object"] == f"from {m[0]}", (k, res)
            if len(m) < 3:
                assert "is not part of" in res["root_outside"], (k, res)
            assert res["unnamed"] == [sum(c) for c in cols], (k, res)
        assert g["unnamed_job"] == [6.0, -6.0], g
        # SGD, lr 1, from 10: members of [0, 2] step by the mean of 1 and 9; rank 1 by
        # its own 4.
        assert g["optimizer"] == [6.0 if r == 1 else 5.0] * 3, g
        assert "duplicate process set" in g["duplicate"], g
        assert "disagree on its ranks" in g["disagree"] and "worker 2 gave [2]" in \
            g["disagree"], g
        assert "rank 5 is not a worker of this job of 3" in g["outside"], g
        assert g["d"] == ([sum(t[q][j] for q in (1, 2)) for j in range(2)]
                          if r in (1, 2) else None), g
        assert g["removed"] == [True] * 4 and g["removed_again"] is False, g
        assert g["removed_global"] is False, g
        assert "not an added process set" in g["use_removed"], g
        assert g["after"] == [6.0, -6.0], g
