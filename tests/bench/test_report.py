"""RESULTS.md is generated from the results JSON: tables and target lines come from the rows."""
import json

from qkernels.bench import report


def _write(root, gpu, name, rows, **meta):
    d = root / gpu
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{name}.json").write_text(json.dumps(dict(gpu="GPU X", torch="2.x", triton="3.y", date="2026-01-02T00:00",
                                                    rows=rows, **meta)))


def test_report_tables_and_targets_from_rows(tmp_path):
    root = tmp_path / "results"
    dec = lambda s, b, tps, share: dict(op="decode", provider="qkernels runtime", model="llama3-8b", scheme=s,  # noqa
                                        batch=b, ctx=128, tokens_per_s=tps, bw_share=share, capture_s=1.0)
    rows = [dec("fp16", 1, 100.0, 0.8), dec("w4a16", 1, 240.0, 0.55), dec("fp16", 32, 1000.0, 0.7),
            dec("w4a16", 32, 1200.0, 0.4)]
    _write(root, "h100", "runtime", rows, profiles={"llama3-8b fp16": [dict(kernel="k", us_per_step=5.0,
                                                                             calls_per_step=2.0)]})
    _write(root, "h100", "weight_only", [dict(op="weight_only_linear", provider="a", mode="graph", shape="4x4", M=1,
                                              median_us=3.0),
                                         dict(op="weight_only_linear", provider="a", mode="eager", shape="4x4", M=1,
                                              median_us=9.0)])
    text = report.build(root)
    assert "| w4a16 | 240 (2.40x, 55%) | 1200 (1.20x, 40%) |" in text
    assert "- W4A16 ≥ 2.3x the fp16 runtime: 2.40x — met" in text
    assert "- batch 32: W4A16 ≥ 1.3x fp16: 1.20x — **not met**" in text
    assert "GPU X" in text and "torch 2.x, Triton 3.y, 2026-01-02" in text
    assert "| weight_only_linear | 4x4 | 1 | 3 |" in text          # graph rows shown, eager kept in the JSON
    out = report.run(root)
    assert out.read_text() == text


def test_batched_runtime_targets_per_model(tmp_path):
    """The runtime's batch-16 / batch-64 W4A16 targets, per model (Qwen3-1.7B's too); a batch not in the file is named
    as not measured."""
    root = tmp_path / "results"
    dec = lambda m, s, b, tps: dict(op="decode", provider="qkernels runtime", model=m, scheme=s, batch=b,  # noqa
                                    ctx=128, tokens_per_s=tps, bw_share=0.5, capture_s=1.0)
    rows = [dec("qwen3-1.7b", "fp16", 16, 1000.0), dec("qwen3-1.7b", "w4a16", 16, 1900.0),
            dec("llama3-8b", "fp16", 64, 1000.0), dec("llama3-8b", "w4a16", 64, 1400.0)]
    _write(root, "h100", "runtime", rows)
    text = report.build(root)
    assert "- batch 16: W4A16 ≥ 1.5x the fp16 runtime: 1.90x — met" in text
    assert "- batch 64: W4A16 ≥ 1.3x the fp16 runtime: not in this run — **not measured**" in text
    assert "- batch 64: W4A16 ≥ 1.5x the fp16 runtime: 1.40x — **not met**" in text


def test_w4a8_runtime_beside_gemlite_in_the_hf_fast_path(tmp_path):
    """W4A8's runtime rows against gemlite's A8W4 FP8 layers run in the Hugging Face model's fast path, per batch."""
    root = tmp_path / "results"
    hf = "HF static cache + torch.compile"
    dec = lambda p, s, b, tps: dict(op="decode", provider=p, model="llama3-8b", scheme=s, batch=b,  # noqa
                                    ctx=128, tokens_per_s=tps, bw_share=0.5, capture_s=1.0)
    rows = [dec("qkernels runtime", "fp16", 1, 100.0), dec("qkernels runtime", "w4a8-fp8", 16, 1200.0),
            dec(hf, "gemlite-w4a8-fp8", 16, 1000.0), dec("qkernels runtime", "w4a8-fp8", 64, 1800.0),
            dec(hf, "gemlite-w4a8-fp8", 64, 2000.0), dec(hf, "fp16", 1, 90.0)]
    _write(root, "h200", "runtime", rows)
    text = report.build(root)
    assert "- batch 16: W4A8 runtime ≥ gemlite's A8W4 FP8 in the Hugging Face fast path: 1.20x — met" in text
    assert "- batch 64: W4A8 runtime ≥ gemlite's A8W4 FP8 in the Hugging Face fast path: 0.90x — **not met**" in text
    assert "- batch 1: W4A8 runtime ≥ gemlite" not in text        # no rows at batch 1: no line


def _gemv_row(provider, model, shape, M, us, speedup=1.0):
    """A decode-GEMV row of `model`'s `shape` ("NxK") at M: `us` per call, `speedup` over fp16."""
    N, K = (int(v) for v in shape.split("x"))
    return dict(op="decode_linear", provider=provider, mode="graph-chain", model=model, layer="x", shape=shape, M=M,
                N=N, K=K, median_us=us, weight_gbps=1.0, speedup_vs_fp16=speedup, share_of_fp16_bw=1.0,
                kernels_per_call=1.0)


def test_decode_gemv_table_and_targets(tmp_path):
    root = tmp_path / "results"
    row = lambda p, shape, M, us, share, k=1.0: dict(  # noqa: E731
        op="decode_linear", provider=p, mode="graph-chain", model="llama3-8b", layer="x", shape=shape, M=M,
        N=int(shape.split("x")[0]), K=int(shape.split("x")[1]), median_us=us, weight_gbps=1000.0 * share,
        speedup_vs_fp16=2.0, share_of_fp16_bw=share, kernels_per_call=k)
    rows = [row("fp16 F.linear", "6144x4096", 1, 20.0, 1.0), row("qkernels w4a16", "6144x4096", 1, 8.0, 0.92),
            row("fp16 F.linear", "4096x4096", 1, 15.0, 1.0), row("qkernels w4a16", "4096x4096", 1, 6.0, 0.7, 2.0)]
    _write(root, "h100", "decode_gemv", rows)
    text = report.build(root)
    assert "| llama3-8b | x | 6144x4096 | 1 | 20 µs, 1000 GB/s | 2.00x (92%) / 1 |" in text
    assert "- qkernels w4a16, M = 1, 6144x4096 and larger: ≥ 90% of fp16's bytes/s: 92% at worst — met" in text
    assert "- qkernels w4a16, M = 1, 4096x4096: ≥ 75% of fp16's bytes/s: 70% at worst — **not met**" in text
    assert "- qkernels w4a16, one kernel per call at M = 1: 2 at most — **not met**" in text
    assert "from the run of" not in text          # every row from the file's own run
    # a merged file (bench decode-gemv --shapes): rows kept from an earlier run say which run
    stamped = [dict(r, date="2026-01-02T00:00", torch="2.x", triton="3.y") for r in rows[:2]]
    stamped += [dict(r, date="2025-12-30T08:15", torch="2.w", triton="3.y") for r in rows[2:]]
    _write(root, "h100", "decode_gemv", stamped)
    text = report.build(root)
    assert "Rows of 4096x4096: from the run of 2025-12-30 08:15 UTC (torch 2.w, Triton 3.y)" in text
    assert "Rows of 6144x4096" not in text
    assert "not measured" not in text


def test_batched_decode_targets_per_m_range_and_best_peer(tmp_path):
    """The batched-decode lines: the worst speed-up over fp16 of each scheme's M range on the four projections
    (other shapes ignored), and W8A8 against the fastest peer of its format at each (shape, M) from 17 to 256."""
    root = tmp_path / "results"
    row = lambda p, shape, M, us, x=1.0: _gemv_row(p, "llama3-8b", shape, M, us, x)  # noqa: E731
    rows = [row("qkernels w4a16", "6144x4096", 1, 5.0, 3.5), row("qkernels w4a16", "4096x4096", 16, 5.0, 3.4),
            row("qkernels w4a16", "1024x4096", 16, 5.0, 1.1),                    # not one of the four: ignored
            row("qkernels w4a16", "28672x4096", 64, 5.0, 2.0),
            row("qkernels w8a8", "4096x4096", 64, 10.0), row("gemlite w8a8 int8", "4096x4096", 64, 12.0),
            row("torch.compile w8a8 (_int_mm)", "4096x4096", 64, 9.0),
            row("qkernels w8a8", "4096x4096", 16, 10.0), row("gemlite w8a8 int8", "4096x4096", 16, 5.0)]
    _write(root, "h100", "decode_gemv", rows)
    text = report.build(root)
    assert ("- qkernels w4a16 vs fp16 F.linear, M = 1..16, Llama-3-8B's four decode projections: ≥ 3.3x: 3.40x at "
            "worst (M = 16, 4096x4096) — met") in text
    assert ("- qkernels w4a16 vs fp16 F.linear, M = 64, Llama-3-8B's four decode projections: ≥ 2.2x: 2.00x at "
            "worst (M = 64, 28672x4096) — **not met**") in text
    assert "M = 128, Llama-3-8B's" not in text            # no rows: no line
    assert ("- qkernels w8a8 vs the best of gemlite w8a8 int8, torch.compile w8a8 (_int_mm), M = 17..256, "
            "Llama-3-8B's four decode projections: ≥ 1.0x: 0.90x at worst (M = 64, 4096x4096) — **not met**") in text
    # no Marlin rows: its published figure, said to be published
    assert ("- Marlin at M = 1, 16, 32, 64 beside qkernels w4a16: no build of it ran in this benchmark; its "
            "published figure: about 3.87x fp16") in text
    # Marlin built and timed: ours against it at every (shape, M) both ran, the published figure no longer cited
    _write(root, "h100", "decode_gemv", rows + [row("marlin w4a16 g128 sym", "6144x4096", 1, 6.0),
                                                 row("marlin w4a16 g128 sym", "28672x4096", 64, 4.0)])
    text = report.build(root)
    assert ("- qkernels w4a16 vs marlin w4a16 g128 sym, every M, Llama-3-8B's four decode projections: ≥ 1.0x: 0.80x "
            "at worst (M = 64, 28672x4096) — **not met**") in text
    assert "no build of it ran" not in text


def test_w4a16_batched_targets_on_every_shape(tmp_path):
    """W4A16 at M = 16..128: over fp16 per M on every Llama-3-8B shape (the lm_head's included), over our W8A16 at
    M <= 32 and against Marlin at every (model, shape, M) both ran; ranges without rows get no line."""
    root = tmp_path / "results"
    row = _gemv_row
    rows = [row("qkernels w4a16", "llama3-8b", "4096x4096", 16, 10.0, 2.6),
            row("qkernels w4a16", "llama3-8b", "128256x4096", 16, 100.0, 1.9),
            row("qkernels w4a16", "qwen3-1.7b", "2048x2048", 16, 5.0, 1.0),        # not Llama-3-8B's: no fp16 line
            row("qkernels w4a16", "llama3-8b", "4096x4096", 64, 12.0, 1.9),
            row("qkernels w8a16", "llama3-8b", "4096x4096", 16, 16.0), row("qkernels w8a16", "qwen3-1.7b",
                                                                           "2048x2048", 16, 6.0),
            row("qkernels w8a16", "llama3-8b", "4096x4096", 64, 12.0),                # M = 64: not judged
            row("marlin w4a16 g128 sym", "qwen3-1.7b", "2048x2048", 16, 4.0),
            row("marlin w4a16 g128 sym", "llama3-8b", "4096x4096", 64, 15.0)]
    _write(root, "h200", "decode_gemv", rows)
    text = report.build(root)
    assert ("- qkernels w4a16 vs fp16 F.linear, M = 16, every shape of Llama-3-8B: ≥ 2.5x: 1.90x at worst (M = 16, "
            "128256x4096) — **not met**") in text
    assert ("- qkernels w4a16 vs fp16 F.linear, M = 64, every shape of Llama-3-8B: ≥ 1.8x: 1.90x at worst (M = 64, "
            "4096x4096) — met") in text
    assert "M = 32, every shape of Llama-3-8B" not in text and "M = 128, every shape" not in text
    assert ("- qkernels w4a16 vs qkernels w8a16, M = 2..32, every shape of llama3-8b, qwen3-1.7b: ≥ 1.5x: 1.20x at "
            "worst (M = 16, qwen3-1.7b 2048x2048) — **not met**") in text
    assert ("- qkernels w4a16 vs marlin w4a16 g128 sym, every M, every shape of llama3-8b, qwen3-1.7b: ≥ 1.0x: 0.80x "
            "at worst (M = 16, qwen3-1.7b 2048x2048) — **not met**") in text


def test_w4a8_target_against_the_fastest_rival_on_every_shape(tmp_path):
    """W4A8-FP8 against the fastest of our W4A16, our W8A8-FP8 and gemlite's A8W4 FP8 at each (model, shape, M) with
    M = 16..256, on every shape of both models (M = 1 and other peers ignored)."""
    root = tmp_path / "results"
    row = _gemv_row
    rows = [row("qkernels w4a8-fp8", "llama3-8b", "1024x4096", 16, 10.0), row("qkernels w4a16", "llama3-8b",
                                                                               "1024x4096", 16, 11.0),
            row("qkernels w4a8-fp8", "qwen3-1.7b", "2048x2048", 64, 10.0),
            row("qkernels w8a8-fp8", "qwen3-1.7b", "2048x2048", 64, 12.0),
            row("gemlite w4a8 fp8 g128", "qwen3-1.7b", "2048x2048", 64, 9.5),
            row("gemlite w4a16 g128", "qwen3-1.7b", "2048x2048", 64, 1.0),              # another format: ignored
            row("qkernels w4a8-fp8", "llama3-8b", "1024x4096", 1, 10.0),
            row("qkernels w4a16", "llama3-8b", "1024x4096", 1, 1.0)]                    # M = 1: not judged
    _write(root, "h200", "decode_gemv", rows)
    text = report.build(root)
    assert ("- qkernels w4a8-fp8 vs the fastest of gemlite w4a8 fp8 g128, qkernels w4a16, qkernels w8a8-fp8, "
            "M = 16..256, every shape of llama3-8b, qwen3-1.7b: ≥ 1.0x: 0.95x at worst (M = 64, qwen3-1.7b "
            "2048x2048) — **not met**") in text


def test_decode_gemv_fixed_cost_and_streaming_rate(tmp_path):
    """Each provider's µs per call over a model's shapes, fitted as fixed µs + bytes / rate: the fit recovers a
    line's intercept and rate, and the rate as a share of fp16's; a model with fewer than three sizes has no line;
    a provider whose times do not follow its bytes (one shape far off the line) gets its R² and no rate."""
    root = tmp_path / "results"
    row = lambda p, model, n, M, us, nbytes: dict(  # noqa: E731
        op="decode_linear", provider=p, mode="graph-chain", model=model, layer="x", shape=f"{n}x4096", M=M, N=n,
        K=4096, median_us=us, weight_bytes=nbytes, weight_gbps=1e-3 * nbytes / us, speedup_vs_fp16=1.0,
        share_of_fp16_bw=1.0, kernels_per_call=1.0)
    rows = []
    for n in (1024, 4096, 14336):
        b16 = 2 * n * 4096
        rows += [row("fp16 F.linear", "m", n, 1, 6.0 + b16 / 4e6, b16),              # 4000 GB/s, 6 µs fixed
                 row("qkernels w4a16", "m", n, 1, 2.5 + b16 / 4 / 3.2e6, b16 // 4),   # 3200 GB/s: 80%
                 row("peer", "m", n, 1, 40.0 if n == 1024 else 10.0 + b16 / 4 / 2e6, b16 // 4)]
        if n != 14336:
            rows.append(row("fp16 F.linear", "small", n, 1, 5.0, b16))
    _write(root, "h100", "decode_gemv", rows)
    text = report.build(root)
    assert "| m | 1 | fp16 F.linear | 3 | 1.00 | 6.00 | 4000 | 100% |" in text
    assert "| m | 1 | qkernels w4a16 | 3 | 1.00 | 2.50 | 3200 | 80% |" in text
    peer = next(line for line in text.splitlines() if line.startswith("| m | 1 | peer |"))
    r2 = float(peer.split("|")[5])
    assert r2 < report.FIT_R2_MIN and peer.endswith("| – | – |  |"), peer
    assert "| small | 1 |" not in text


def test_rows_measured_with_another_config_table_are_pointed_out(tmp_path):
    """A results file records the config table its run used (harness.environment, stamped on merged rows) and that
    table's digest per kind; the report says how many rows of ours ran configs that differ from the shipped table's
    for the kinds they run (the whole table where a file has no kind digests), and nothing where all match, for
    peers and baselines, or where rows predate the digest."""
    from qkernels import configs
    from qkernels.bench import harness
    now, kinds = configs.table_digest("h100"), configs.kind_digests("h100")
    assert now and len(now) == 12 and configs.table_digest("no-such-gpu") is None
    assert {"w4a16", "int8", "w8a8"} <= set(kinds) and configs.kind_digests("no-such-gpu") == {}
    root = tmp_path / "results"
    row = dict(op="linear_host", provider="QuantizedLinear w4a16", scheme="w4a16", M=1, N=8, K=8, median_us=10.0,
               **{"x_F.linear": 1.0})
    _write(root, "h100", "host", [row], config_table=now)
    assert "rows of ours" not in report.build(root)
    _write(root, "h100", "host", [row])                        # before digests were recorded: not judged
    assert "rows of ours" not in report.build(root)
    peer = dict(row, provider="F.linear fp16", scheme="fp16")
    ours_fp16 = dict(row, provider="qkernels runtime", scheme="fp16")     # no config-table kind: never judged
    w8a8 = dict(row, provider="w8a8_linear int8", scheme="w8a8")
    old = dict(gpu="GPU X", date="2026-01-01T00:00", torch="2.x", triton="3.y", config_table="0123456789ab",
               rows=[row, peer, ours_fp16, dict(row, provider="QuantizedLinear w8a16", scheme="w8a16")])
    new = dict(gpu="GPU X", date="2026-01-02T00:00", torch="2.x", triton="3.y", config_table=now,
               config_tables={now: kinds}, rows=[dict(row, provider="QuantizedLinear w8a16", scheme="w8a16")])
    merged = harness.merge_results(old, new, lambda r: r["scheme"] == "w8a16")
    assert [r["config_table"] for r in merged["rows"]] == ["0123456789ab", "0123456789ab", "0123456789ab", now]
    assert merged["config_tables"] == {now: kinds}
    (root / "h100" / "host.json").write_text(json.dumps(merged))
    line = (f"- 1 of the 2 rows of ours ran configs that differ from the shipped `configs/h100.json` ({now}) for "
            "their kinds: rerun to refresh them.")
    assert line in report.build(root)       # no kind digests of the old table: the w4a16 row judged by the whole table
    # with them: the w4a16 row ran today's w4a16 configs (not stale), the w8a8 row other int8 configs (stale)
    merged["config_tables"]["0123456789ab"] = dict(kinds, **{k: "fedcba987654" for k in kinds if k.startswith("int8")})
    merged["rows"].append(dict(w8a8, config_table="0123456789ab"))
    (root / "h100" / "host.json").write_text(json.dumps(merged))
    assert line.replace("of the 2", "of the 3") in report.build(root)
    again = harness.merge_results(merged, new, lambda r: r["provider"] == "w8a8_linear int8")
    assert set(again["config_tables"]) == {now, "0123456789ab"}      # kept: rows of that table remain
    gone = harness.merge_results(merged, new, lambda r: r["config_table"] == "0123456789ab")
    assert set(gone["config_tables"]) == {now}



def test_a_row_is_judged_by_its_m_bucket_where_bucket_digests_were_recorded(tmp_path):
    """With bucket digests ("<kind>@<bucket>", configs.kind_digests) a row of one M is stale only where the bucket
    its M takes changed, or where its M takes another bucket now than then (a bucket added since); a row without
    one M (the runtime's) is judged by the whole kind."""
    from qkernels import configs
    now_kinds, table = configs.kind_digests("h100"), configs.load("h100")["w4a16"]
    buckets = {k: v for k, v in now_kinds.items() if ":" not in k}     # a run that recorded no entry digests
    big, bigger = sorted({int(k.split(":")[0]) for k in table})[-2:]
    assert now_kinds[f"w4a16@{bigger}"] != now_kinds[f"w4a16@{big}"]
    root = tmp_path / "results"
    row = dict(op="linear_host", provider="QuantizedLinear w4a16", scheme="w4a16", M=1, N=8, K=8, median_us=10.0,
               **{"x_F.linear": 1.0})
    rows = [row, dict(row, M=bigger), dict(row, M=big), dict(row, M=None)]
    line = "- {} of the 4 rows of ours ran configs that differ from the shipped"
    then = dict(buckets, w4a16="0" * 12, **{f"w4a16@{bigger}": "f" * 12})     # the largest bucket changed since
    _write(root, "h100", "host", rows, config_table="0123456789ab", config_tables={"0123456789ab": then})
    assert line.format(2) in report.build(root)      # M = bigger and the row without one M
    # no `big` bucket then: the M = big row ran `bigger`'s configs
    then = {k: v for k, v in buckets.items() if k != f"w4a16@{big}"}
    _write(root, "h100", "host", rows, config_table="0123456789ab", config_tables={"0123456789ab": then})
    assert line.format(1) in report.build(root)
    _write(root, "h100", "host", rows, config_table="0123456789ab", config_tables={"0123456789ab": now_kinds})
    assert "rows of ours" not in report.build(root)

def test_a_row_of_one_shape_is_judged_by_its_entry_where_entry_digests_were_recorded(tmp_path):
    """With entry digests (configs.kind_digests: a bucket's own config "<kind>@<bucket>:*" and each shape override)
    a row of one M and one shape is stale only where the config its entry holds changed: not for another entry of
    its bucket, and not for an override added since that holds the config the row ran."""
    from qkernels import configs
    now_kinds, table = configs.kind_digests("h100"), configs.load("h100")["w4a16"]
    over = next(k for k in table if ":" in k and k.split(":")[0] == "1")    # a shape override of the M = 1 bucket
    N, K = (int(f[1:]) for f in over.split(":")[1:])
    assert configs.lookup_key(table, 1, N, K) == over and configs.lookup_key(table, 1, 8, 8) == "1"
    assert now_kinds[f"w4a16@{over}"] != now_kinds["w4a16@1:*"]
    root = tmp_path / "results"
    shaped = dict(op="linear_host", provider="QuantizedLinear w4a16", scheme="w4a16", M=1, N=N, K=K, median_us=10.0,
                  **{"x_F.linear": 1.0})
    plain = dict(shaped, N=8, K=8)                         # no override: the bucket's own config

    def stale(row, then):
        _write(root, "h100", "host", [row], config_table="0123456789ab", config_tables={"0123456789ab": then})
        return "- 1 of the 1 rows of ours ran configs that differ" in report.build(root)

    override_changed = dict(now_kinds, **{"w4a16@1": "f" * 12, f"w4a16@{over}": "f" * 12})
    assert stale(shaped, override_changed) and not stale(plain, override_changed)
    bucket_changed = dict(now_kinds, **{"w4a16@1": "f" * 12, "w4a16@1:*": "f" * 12})
    assert stale(plain, bucket_changed) and not stale(shaped, bucket_changed)
    # no override for the shape then: the row ran the bucket's config, stale unless the override holds the same
    no_override = {k: v for k, v in now_kinds.items() if k != f"w4a16@{over}"}
    assert stale(shaped, no_override)
    assert not stale(shaped, dict(no_override, **{"w4a16@1:*": now_kinds[f"w4a16@{over}"]}))
    assert not stale(shaped, now_kinds) and not stale(plain, now_kinds)
    # a run with bucket digests only: judged by the bucket, as before
    buckets_only = {k: v for k, v in override_changed.items() if k.count(":") == 0}
    assert stale(plain, buckets_only)


def test_a_runtime_row_is_judged_by_the_entries_of_its_models_shapes(tmp_path):
    """A runtime row (no M / N / K of its own) is judged by the entries its model's linears take at the M it runs
    them: an override added for one model's shape leaves the other model's rows and other batches fresh; the
    Hugging Face path's quantized rows count as ours, its fp16 and tinygemm rows do not."""
    from qkernels import configs
    from qkernels.bench.decode_gemv import SHAPES
    now_kinds, table = configs.kind_digests("h100"), configs.load("h100")["w4a16"]
    n, k = next((n, k) for n, k, layer in SHAPES["qwen3-1.7b"] if layer == "gate|up")
    over = f"32:N{n}:K{k}"
    assert configs.lookup_key(table, 32, n, k) == over                   # Qwen3's gate|up at M = 32 has its entry
    assert all(configs.lookup_key(table, 32, n2, k2) != over for n2, k2, _ in SHAPES["llama3-8b"])
    then = {key: v for key, v in now_kinds.items() if key != f"w4a16@{over}"}     # a run before that entry
    then["w4a16"] = "f" * 12                                            # (the whole kind's digest differs too)
    assert then["w4a16@32:*"] != now_kinds[f"w4a16@{over}"]
    root = tmp_path / "results"
    base = dict(op="decode", provider="qkernels runtime", mode="graph", layers=2, scheme="w4a16", ctx=128,
                median_us=10.0, tokens_per_s=1.0)

    def stale(**row):
        _write(root, "h100", "runtime", [dict(base, **row)], config_table="0123456789ab",
               config_tables={"0123456789ab": then})
        return "- 1 of the 1 rows of ours ran configs that differ" in report.build(root)

    assert stale(model="qwen3-1.7b", batch=32)
    assert stale(model="qwen3-1.7b", batch=32, provider="HF static cache + torch.compile")
    assert not stale(model="qwen3-1.7b", batch=32, provider="HF static cache + torch.compile", scheme="tinygemm-int4")
    assert not stale(model="llama3-8b", batch=32)
    assert not stale(model="qwen3-1.7b", batch=8)
    assert not stale(model="qwen3-1.7b", batch=1, op="prefill", prompt=2048)
    assert stale(model="qwen3-1.7b", batch=None, op="memory")          # spans prefill and decode: the whole kind


def test_missing_peers_count_as_targets_not_measured(tmp_path):
    """A run without a peer installed says so as a target line, and the summary lists it among those not met."""
    root = tmp_path / "results"
    _write(root, "h100", "decode_gemv", [], peers_missing=["gemlite: not installed"])
    text = report.build(root)
    assert "- the targets against gemlite: not installed: not in this run — **not measured**" in text
    assert "| decode_gemv — GPU X | 0 | 1 |" in text
    assert "- decode_gemv — GPU X: the targets against gemlite: not installed: not in this run — not measured" in text


def test_a_peer_timed_by_an_earlier_merged_run_is_not_missing(tmp_path):
    """A file merged from runs where the last lacked a peer keeps the rows an earlier run timed of it: that peer is
    not named as missing (its targets are judged on those rows); one no row measured still is."""
    root = tmp_path / "results"
    row = dict(op="gemm_linear", provider="gemlite w8a8 fp8", mode="graph", M=16, N=4096, K=4096, median_us=9.0)
    _write(root, "h100", "gemm", [row], peers_missing=["gemlite: not installed", "marlin: not built"])
    text = report.build(root)
    assert "- the targets against marlin: not built: not in this run — **not measured**" in text
    assert "gemlite: not installed" not in text


def test_gemm_targets_from_graph_rows():
    row = lambda p, M, N, K, us, mode="graph": dict(op="gemm_linear", provider=p, mode=mode, M=M, N=N, K=K,  # noqa
                                                     median_us=us)
    rows = [row("qkernels w8a8 fp8", 1, 4096, 4096, 10.0), row("torch._scaled_mm fp8 +act quant", 1, 4096, 4096, 12.0),
            row("qkernels w8a8 fp8", 128, 4096, 4096, 10.0),
            row("torch._scaled_mm fp8 +act quant", 128, 4096, 4096, 9.0),
            row("torch._scaled_mm fp8 +act quant", 128, 4096, 4096, 1.0, "eager"),     # eager rows do not count
            row("qkernels w8a8 int8", 4096, 14336, 4096, 100.0), row("fp16 cuBLAS", 4096, 14336, 4096, 180.0),
            row("gemlite w8a8 fp8", 1, 4096, 4096, 11.0), row("gemlite w8a8 fp8", 128, 4096, 4096, 9.5),
            row("qkernels w8a8 int8", 16, 4096, 4096, 8.0), row("gemlite w8a8 int8", 16, 4096, 4096, 8.8),
            row("gemlite w8a8 int8", 4096, 14336, 4096, 90.0)]      # M > 16: not judged against gemlite
    text = "\n".join(report._gemm_targets(rows))
    assert "- FP8 linear vs gemlite w8a8 fp8, every M: ≥ 1.0x: 0.95x at worst (M = 128, 4096x4096) — **not met**" \
        in text
    assert "- INT8 linear vs gemlite w8a8 int8, M <= 16: ≥ 1.0x: 1.10x at worst (M = 16, 4096x4096) — met" in text
    assert "every M: ≥ 1.0x: 0.90x at worst (M = 128, 4096x4096) — **not met**" in text
    assert "M <= 16: ≥ 1.1x: 1.20x at worst (M = 1, 4096x4096) — met" in text
    assert "M = 4096 on the large shapes: ≥ 1.7x: 1.80x at worst (14336x4096) — met" in text


def test_weight_only_prefill_targets_from_graph_rows():
    row = lambda p, M, us, mode="graph": dict(op="weight_only_linear", provider=p, mode=mode, M=M,  # noqa
                                              shape="4096x4096", median_us=us)
    rows = [row("fp16 cuBLAS", 16, 20.0), row("qkernels w4a16 g128 asym", 16, 30.0),     # M < 128: not judged here
            row("fp16 cuBLAS", 128, 20.0), row("qkernels w4a16 g128 asym", 128, 25.0),
            row("qkernels w4a16 g128 asym", 128, 1.0, "eager"),                      # eager rows do not count
            row("fp16 cuBLAS", 1024, 50.0), row("qkernels w4a16 g128 asym", 1024, 40.0),
            row("qkernels w8a16 per-channel", 128, 19.0), row("qkernels w8a16 per-channel", 1024, 50.0)]
    text = "\n".join(report._weight_only_targets(rows))
    assert "- W4A16 g128 vs fp16 at every M ≥ 128: ≥ 1.0x: 0.80x at worst (M = 128, 4096x4096) — **not met**" \
        in text
    assert "- W8A16 vs fp16 at every M ≥ 128: ≥ 1.0x: 1.00x at worst (M = 1024, 4096x4096) — met" in text


def test_tp_table_and_targets(tmp_path):
    root = tmp_path / "results"
    row = lambda m, s, tp, us, x=None, ar=None, b=1: dict(  # noqa: E731
        op="decode", provider="qkernels runtime", mode="graph", model=m, layers=2, scheme=s, batch=b, ctx=128, tp=tp,
        median_us=us, tokens_per_s=b * 1e6 / us, bw_share=0.5, allreduce=ar, allreduce_us=20.0, speedup_vs_tp1=x)
    pre = lambda tp, ms, x=None: dict(  # noqa: E731
        op="prefill", provider="qkernels runtime", mode="eager", model="llama3-70b", layers=2, scheme="w4a16",
        batch=1, prompt=2048, tp=tp, median_us=ms * 1e3, ttft_ms=ms, allreduce=None, ttft_vs_tp1=x)
    _write(root, "h200", "tp", [row("llama3-8b", "w4a16", 1, 2000.0),
                                row("llama3-8b", "w4a16", 2, 1250.0, 1.6, "one-shot"),
                                row("llama3-8b", "w4a16", 2, 1600.0, 1.25, "nccl"),
                                row("llama3-8b", "w4a16", 1, 4000.0, b=16),
                                row("llama3-8b", "w4a16", 2, 2000.0, 2.0, "one-shot", b=16),
                                row("llama3-70b", "w4a16", 1, 9000.0),
                                row("llama3-70b", "w4a16", 2, 6000.0, 1.5, "nccl"),
                                pre(1, 100.0), pre(2, 55.0, 0.55)])
    text = report.build(root)
    assert "| llama3-8b | w4a16 | 1 | 2 | one-shot | 1250 | 800 | 50% | 20 | 1.6 |" in text
    assert "| llama3-8b | w4a16 | 1 | 2 | nccl | 1600 | 625 | 50% | 20 | 1.25 |" in text
    assert "| llama3-8b | w4a16 | 16 | 2 | one-shot | 2000 | 8000 | 50% | 20 | 2 |" in text
    assert "| llama3-70b | w4a16 | 2 | 2048 | 55 | 0.55 |" in text
    # the target on the runtime's own path (a TP degree's first row), not the NCCL comparison
    assert "- llama3-8b W4A16 batch 1: TP=2 ≥ 1.5x TP=1 (one-shot all-reduce): 1.60x — met" in text
    assert "- llama3-8b W4A16 batch 16: TP=2 ≥ 1.6x TP=1 (one-shot all-reduce): 2.00x — met" in text
    assert "- llama3-70b W4A16 batch 1: TP=2 ≥ 1.8x TP=1 (nccl all-reduce): 1.50x — **not met**" in text
    assert "- llama3-70b W4A16 batch 16: TP=2 ≥ 1.8x TP=1: not in this run — **not measured**" in text
    assert "- llama3-8b FP16 batch 1: TP=2 ≥ 1.75x TP=1: not in this run — **not measured**" in text
    assert "- llama3-70b W4A16 TTFT at 2048 tokens: TP=2 ≤ 0.6x TP=1: 0.55x — met" in text


def test_tp_all_reduce_column_is_what_the_kernels_add_to_the_step(tmp_path):
    """Where a row's profile records each kernel's addition to the step's end (critical_us_per_step), the all-reduce
    column sums that over the all-reduce kernels (their spans overlap the kernels before them under PDL); a row
    whose profile predates it keeps its own figure."""
    root = tmp_path / "results"
    row = lambda b, ar: dict(op="decode", provider="qkernels runtime", mode="graph", model="llama3-8b", layers=2,  # noqa
                             scheme="w4a16", batch=b, ctx=128, tp=2, median_us=1000.0, tokens_per_s=b * 1e3,
                             bw_share=0.5, allreduce="one-shot", allreduce_us=ar, speedup_vs_tp1=1.3)
    prof = [dict(kernel="_wo_gv_kernel", us_per_step=700.0, calls_per_step=128, critical_us_per_step=600.0),
            dict(kernel="_all_reduce_rms_norm_kernel", us_per_step=550.0, calls_per_step=64, critical_us_per_step=320.0),
            dict(kernel="ncclDevKernel_AllGather_RING_LL", us_per_step=9.0, calls_per_step=1, critical_us_per_step=9.0)]
    old = [dict(kernel="_all_reduce_rms_norm_kernel", us_per_step=350.0, calls_per_step=64)]
    _write(root, "h200", "tp", [row(1, 559.0), row(16, 400.0)],
           profiles={"llama3-8b w4a16 tp=2 b=1, one-shot all-reduce": prof,
                     "llama3-8b w4a16 tp=2 b=16, one-shot all-reduce": old})
    text = report.build(root)
    assert "| llama3-8b | w4a16 | 1 | 2 | one-shot | 1000 | 1000 | 50% | 329 | 1.3 |" in text
    assert "| llama3-8b | w4a16 | 16 | 2 | one-shot | 1000 | 16000 | 50% | 400 | 1.3 |" in text


def test_ppl_targets_group_calibrated_methods_by_group_size():
    rows = [dict(scheme="w4a16-g64-awq", delta_pct=16.9), dict(scheme="w4a16-g64-gptq-act", delta_pct=12.5),
            dict(scheme="w4a16-g64-awq+gptq-act", delta_pct=7.9), dict(scheme="w4a16-g32-gptq", delta_pct=16.5),
            dict(scheme="w4a16-g32-awq+gptq-act", delta_pct=7.5), dict(scheme="w4a16-g128", delta_pct=8.2)]
    from qkernels.eval.ppl import TARGETS       # what eval writes into its results file
    lines = report._ppl_targets(rows, TARGETS)
    targets = [ln for ln in lines if ln.startswith("- ")]
    assert "- w4a16-g64 (best calibrated method) ≤ +8%: +7.90% (w4a16-g64-awq+gptq-act) — met" in targets
    assert "- w4a16-g32 (best calibrated method) ≤ +6%: +7.50% (w4a16-g32-awq+gptq-act) — not met" in targets
    assert "- w4a16-g128 ≤ +8%: +8.20% (w4a16-g128) — not met" in targets
    assert not any(ln.startswith("- w4a16 ") for ln in targets)      # no group keyed on the bare scheme


def test_targets_at_a_glance_count_and_list_the_missed():
    body = ["## gemm — H100 (`results/h100/gemm.json`)", "", "- a: 1.2x — met", "- b: 0.9x — **not met**",
            "## ppl — cpu (`results/cpu/ppl.json`)", "- c ≤ +2%: +3% (c) — not met", "- d ≤ +8%: +1% (d) — met",
            "- a plain list item, no target"]
    text = "\n".join(report._summary(body))
    assert "| gemm — H100 | 1 | 2 |" in text and "| ppl — cpu | 1 | 2 |" in text
    assert "- gemm — H100: b: 0.9x — not met" in text
    assert "- ppl — cpu: c ≤ +2%: +3% (c) — not met" in text
    assert "a: 1.2x" not in text and report._summary(["## x — cpu", "- no targets here"]) == []


def test_environment_records_the_table_and_its_kind_digests(monkeypatch):
    """On a GPU with a shipped table a results file records its digest and, under it, the digest of each kind; on
    one without, neither (no null keys)."""
    from qkernels import configs
    from qkernels.bench import harness
    monkeypatch.setattr(harness, "on_gpu", lambda: True)
    monkeypatch.setattr(harness, "device_name", lambda dev: "NVIDIA H100 80GB HBM3")
    env = harness.environment()
    assert env["config_table"] == configs.table_digest("h100")
    assert env["config_tables"] == {env["config_table"]: configs.kind_digests("h100")}
    monkeypatch.setattr(harness, "device_name", lambda dev: "Some Other GPU")
    env = harness.environment()
    assert env["config_table"] is None and env["config_tables"] == {}
    json.dumps(env)


def test_target_figures_never_contradict_their_verdict():
    """A figure just short of (or just past) its target gets the decimals that show it: 0.996x against 1.0x is
    not printed as 1.00x beside "not met", nor 1.301x against a 1.3x ceiling as 1.30x."""
    from qkernels.bench.report import _num
    assert _num(0.996, 1.0) == "0.996" and _num(0.9999, 1.0) == "0.9999"
    assert _num(1.301, 1.3) == "1.301" and _num(1.004, 1.0) == "1.004"
    assert _num(1.27, 1.3) == "1.27" and _num(2.41, 2.3) == "2.41" and _num(1.3, 1.3) == "1.30"
    assert _num(49.6, 50, 0) == "49.6" and _num(49.2, 50, 0) == "49" and _num(80.4, 75, 0) == "80"
