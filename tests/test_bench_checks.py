"""The bench's self-check of its conv time inside a Relax model (`--check-relax`)."""

import pytest

pytest.importorskip("tvm")


def test_check_relax_builds_a_one_conv_model_verifies_it_and_times_both_sides(monkeypatch):
    from tsl import timing
    from tsl.bench import relax_check

    monkeypatch.setattr(timing, "SETTLE_SECONDS", 0.0)
    res = relax_check.check(rounds=1, conv=dict(c=8, hw=10, k=16))
    assert res["verified"] and res["error"] < 1e-4
    assert res["relax_s"] > 0 and res["bench_s"] > 0 and res["kernel_s"] > 0
    assert res["ratio"] == pytest.approx(res["relax_s"] / res["bench_s"])
    assert res["ok"] == (abs(res["ratio"] - 1) <= 0.15)
    line = relax_check.line(res)
    assert line.startswith("check-relax: conv2d 1x8x10x10x16x3x3 NCHW") and "ratio" in line


def test_a_peer_rate_is_the_median_of_fresh_processes(monkeypatch):
    from tsl import timing
    from tsl.bench import alone

    monkeypatch.setattr(timing, "SETTLE_SECONDS", 0.0)
    sp = {"gemm": [1, 48, 40, 32], "work": 2 * 48 * 40 * 32}
    t = alone.median_alone("numpy gemm", sp, cores=1, runs=3)
    runs = t.info["runs_gops"]
    assert len(runs) == 3 and runs == sorted(runs, reverse=True)
    assert round(t.rate / 1e9, 1) == runs[1]  # the middle one


def test_the_model_profile_counts_winograd_transforms_apart_from_glue_and_windows():
    from tsl.bench.imported import format_profile

    row = {"model": "m", "frontend": "torch", "tsl_ms": 10.0,
           "profile_ms": {"fused_matmul_tsl": 6.0, "winograd_input_56x56x64": 1.0,
                          "fused_winograd_output_56x56x64_add_relu": 1.0,
                          "fused_dw_conv": 1.5, "transpose": 0.5},
           "profile_rules": {"fused_dw_conv": "channels_window", "transpose": "injective",
                             "winograd_input_56x56x64": "injective"}}
    head, *top = format_profile(row).splitlines()
    assert "tsl GEMM/conv kernels 6.00 ms (60%)" in head
    assert "Winograd transforms 2.00 ms (20%)" in head
    assert "window rule (depthwise conv, pooling) 1.50 ms (15%)" in head
    assert head.endswith("the rest 0.50 ms (5%)")
    assert [line.split()[2] for line in top] == ["tsl", "win", "wgd", "wgd", "tvm"]
