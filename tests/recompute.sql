-- An independent batch recomputation of docs/definitions.md in DuckDB SQL, straight from the input events
-- ({source}: JSON Lines or Parquet files, see tests/recompute.py). Shares no code with the pipeline.
SET threads = 1;  -- keep the scan in file order: MAE windows follow arrival order
CREATE MACRO half_even(x) AS CAST(CASE
    WHEN x - floor(x) > 0.5 THEN floor(x) + 1
    WHEN x - floor(x) < 0.5 THEN floor(x)
    WHEN floor(x) % 2 = 0 THEN floor(x) ELSE floor(x) + 1 END AS BIGINT);

CREATE TABLE ev AS SELECT row_number() OVER () AS rn, * FROM {source};

CREATE TABLE bindings AS SELECT node_id, pid, ts_ns,
    concat_ws(':', team, coalesce(env, ''), coalesce(app, ''), coalesce(tier, ''), coalesce(sla, ''),
              coalesce(git_commit, ''), coalesce(ci_pipeline_id, '')) AS tenant_key
  FROM ev WHERE kind = 'tenant_binding';

CREATE TABLE gpu_panes AS SELECT gpu_uuid, ts_ns - ts_ns % {pane_ns} AS pane_start_ns,
    min(node_id) AS node_id, min(gpu_model) AS gpu_model,
    sum(half_even(interval_s * 1000)) AS covered_ms,
    sum(CASE WHEN half_even(sm_util_pct * 100) < 500 THEN half_even(interval_s * 1000) ELSE 0 END) AS idle_ms
  FROM ev WHERE kind = 'gpu_sample' GROUP BY ALL;

CREATE TABLE want_idle AS SELECT *,
    sum(idle_ms) OVER w AS idle_ms_72h, sum(covered_ms) OVER w AS covered_ms_72h,
    sum(idle_ms) OVER w / sum(covered_ms) OVER w AS idle_index_72h
  FROM gpu_panes
  WINDOW w AS (PARTITION BY gpu_uuid ORDER BY pane_start_ns
               RANGE BETWEEN {window_ns} - {pane_ns} PRECEDING AND CURRENT ROW);

-- per (GPU, pane, tenant): process-sample and NUMA sums, tenant as of the event time
CREATE TABLE tenant_use AS
  WITH p AS (
    SELECT e.gpu_uuid, e.ts_ns - e.ts_ns % {pane_ns} AS pane_start_ns,
           coalesce(b.tenant_key, 'unattributed::::::') AS tenant_key,
           CAST(half_even(e.sm_util_pct * 100) AS HUGEINT) * half_even(e.interval_s * 1000) AS sm,
           CAST(half_even(e.mem_bw_util_pct * 100) AS HUGEINT) * half_even(e.interval_s * 1000) AS bw,
           CAST(0 AS HUGEINT) AS numa
    FROM ev e ASOF LEFT JOIN bindings b ON e.node_id = b.node_id AND e.pid = b.pid AND e.ts_ns >= b.ts_ns
    WHERE e.kind = 'process_sample'
    UNION ALL
    SELECT e.gpu_uuid, e.ts_ns - e.ts_ns % {pane_ns}, coalesce(b.tenant_key, 'unattributed::::::'),
           0, 0, e.hops * e.latency_weight
    FROM ev e ASOF LEFT JOIN bindings b ON e.node_id = b.node_id AND e.pid = b.pid AND e.ts_ns >= b.ts_ns
    WHERE e.kind = 'numa_event')
  SELECT gpu_uuid, pane_start_ns, tenant_key, sum(sm) AS sm, sum(bw) AS bw, sum(numa) AS numa FROM p GROUP BY ALL;

CREATE TABLE prices AS SELECT gpu_model, ts_ns, usd_per_gpu_hour FROM ev WHERE kind = 'price';

CREATE TABLE pane_cost AS
  WITH priced AS (
    SELECT g.*, coalesce(m.usd_per_gpu_hour, d.usd_per_gpu_hour) AS usd
    FROM gpu_panes g
    ASOF LEFT JOIN prices m ON g.gpu_model = m.gpu_model AND g.pane_start_ns >= m.ts_ns
    ASOF LEFT JOIN (SELECT * FROM prices WHERE gpu_model = 'default') d ON g.pane_start_ns >= d.ts_ns),
  n AS (SELECT *, CAST(usd * 1000000 AS HUGEINT) * covered_ms AS num FROM priced),
  tot AS (SELECT gpu_uuid, pane_start_ns, sum(sm) AS sm_all, sum(bw) AS bw_all, sum(numa) AS numa_all
          FROM tenant_use GROUP BY ALL)
  SELECT n.gpu_uuid, n.pane_start_ns, n.covered_ms, usd IS NULL AS unpriced,
         coalesce(num // 3600000 + CASE WHEN 2 * (num % 3600000) > 3600000
                                          OR (2 * (num % 3600000) = 3600000 AND (num // 3600000) % 2 = 1)
                                        THEN 1 ELSE 0 END, 0) AS c,
         coalesce(sm_all, 0) AS sm_all, coalesce(bw_all, 0) AS bw_all, coalesce(numa_all, 0) AS numa_all
  FROM n LEFT JOIN tot USING (gpu_uuid, pane_start_ns);

-- exact integers for C; the shares in double precision (the split is checked to within 1 µ$)
CREATE TABLE want_cost AS
  WITH s AS (
    SELECT t.gpu_uuid, t.pane_start_ns, t.tenant_key, pc.c, pc.unpriced, pc.covered_ms, pc.sm_all,
           CASE WHEN pc.sm_all > 0 THEN t.sm / pc.sm_all ELSE 0 END AS t_share,
           CASE WHEN pc.bw_all > 0 THEN t.bw / pc.bw_all ELSE 0 END AS b_share,
           CASE WHEN pc.numa_all > 0 THEN t.numa / pc.numa_all ELSE 0 END AS l_share
    FROM tenant_use t JOIN pane_cost pc USING (gpu_uuid, pane_start_ns)),
  w AS (SELECT *, {alpha} * t_share + {beta} * b_share + {gamma} * l_share AS weight FROM s),
  u AS (SELECT *, sum(weight) OVER (PARTITION BY gpu_uuid, pane_start_ns) AS w_all FROM w),
  b AS (SELECT *, CASE WHEN w_all > 0 THEN least(1.0, sm_all / (10000.0 * covered_ms)) ELSE 0 END AS busy FROM u)
  SELECT gpu_uuid, pane_start_ns, tenant_key, c, unpriced, t_share, b_share, l_share, weight, busy,
         c * CASE WHEN w_all > 0 THEN busy * weight / w_all ELSE 0 END AS exact_cost FROM b
  UNION ALL
  SELECT DISTINCT gpu_uuid, pane_start_ns, 'idle', c, unpriced, 0, 0, 0, 0, busy, c * (1 - busy) FROM b
  UNION ALL  -- panes with covered time but no tenant at all: everything is idle
  SELECT gpu_uuid, pane_start_ns, 'idle', c, unpriced, 0, 0, 0, 0, 0, c FROM pane_cost
  WHERE (gpu_uuid, pane_start_ns) NOT IN (SELECT (gpu_uuid, pane_start_ns) FROM tenant_use);

CREATE TABLE want_mae AS
  WITH a AS (SELECT node_id, pid, ts_ns, address,
                    row_number() OVER (PARTITION BY node_id, pid ORDER BY rn) - 1 AS i
             FROM ev WHERE kind = 'mem_access'),
  w AS (SELECT node_id, pid, i // {mae_window} AS win, min(ts_ns) FILTER (WHERE i % {mae_window} = 0) AS first_ts_ns,
               arg_max(ts_ns, i) AS last_ts_ns, count(*) FILTER (WHERE address < 4294967296) AS n,
               count(*) FILTER (WHERE address >= 4294967296) AS out_of_range
        FROM a GROUP BY ALL),
  bins AS (SELECT node_id, pid, i // {mae_window} AS win, address // 16777216 AS bin, count(*) AS c
           FROM a WHERE address < 4294967296 GROUP BY ALL),
  h AS (SELECT bins.node_id, bins.pid, bins.win, -sum(c / w.n * log2(c / w.n)) AS mae_bits
        FROM bins JOIN w USING (node_id, pid, win) GROUP BY ALL)
  SELECT w.*, coalesce(h.mae_bits, 0) AS mae_bits FROM w LEFT JOIN h USING (node_id, pid, win);

-- efficiency: the blas traces' packed struct decoded here from its hex ({u32 pid; u8 gpu_uuid[16]; u64 timestamp_ns;
-- u32 sm_util_pct; u64 flops_64b}, little-endian), the means of the GPU samples that carry each field
CREATE MACRO byte_at(h, k) AS substr(h, 2 * k + 1, 2);
CREATE MACRO le4(h, k) AS ('0x' || byte_at(h, k + 3) || byte_at(h, k + 2) || byte_at(h, k + 1) || byte_at(h, k))::UBIGINT;
CREATE MACRO le8(h, k) AS ('0x' || byte_at(h, k + 7) || byte_at(h, k + 6) || byte_at(h, k + 5) || byte_at(h, k + 4)
                            || byte_at(h, k + 3) || byte_at(h, k + 2) || byte_at(h, k + 1) || byte_at(h, k))::UBIGINT;
CREATE TABLE blas AS SELECT
    'GPU-' || lower(substr(trace_hex, 9, 8) || '-' || substr(trace_hex, 17, 4) || '-' || substr(trace_hex, 21, 4) || '-'
                    || substr(trace_hex, 25, 4) || '-' || substr(trace_hex, 29, 12)) AS gpu_uuid,
    le4(trace_hex, 0) AS pid, le8(trace_hex, 20) AS ts_ns, CAST(le8(trace_hex, 32) AS HUGEINT) AS flops
  FROM ev WHERE kind = 'ebpf_trace' AND trace_source = 'blas';
CREATE TABLE peaks AS SELECT * FROM (VALUES {peaks}) p(key, tops);

CREATE TABLE want_efficiency AS
  WITH s AS (SELECT *, half_even(interval_s * 1000) AS ms FROM ev WHERE kind = 'gpu_sample'),
  g AS (SELECT gpu_uuid, ts_ns - ts_ns % {pane_ns} AS pane_start_ns, min(gpu_model) AS gpu_model, sum(ms) AS covered_ms,
               sum(half_even(sm_util_pct * 100) * ms) AS busy, sum(half_even(mem_bw_util_pct * 100) * ms) AS bw,
               sum(half_even(tensor_active_pct * 100) * ms) AS tensor, sum(ms) FILTER (WHERE tensor_active_pct IS NOT NULL) AS tensor_ms,
               sum(half_even(dram_active_pct * 100) * ms) AS dram, sum(ms) FILTER (WHERE dram_active_pct IS NOT NULL) AS dram_ms
        FROM s GROUP BY ALL),
  gp AS (SELECT g.*, coalesce((SELECT tops FROM peaks WHERE key <> 'default' AND contains(lower(g.gpu_model), lower(key))
                              ORDER BY length(key) DESC, key LIMIT 1), (SELECT tops FROM peaks WHERE key = 'default')) AS peak,
                CASE WHEN dram_ms > 0 THEN dram / (10000.0 * dram_ms) ELSE bw / (10000.0 * covered_ms) END AS bw_util,
                CASE WHEN dram_ms > 0 THEN 'dram_active' ELSE 'mem_bw_util' END AS bw_source
         FROM g),
  f AS (SELECT gpu_uuid, ts_ns - ts_ns % {pane_ns} AS pane_start_ns, pid, sum(flops) AS flops FROM blas GROUP BY ALL),
  rows AS (
    SELECT gp.*, 0 AS pid, t.flops,
           CASE WHEN t.flops IS NOT NULL THEN t.flops / (peak * 1e9 * covered_ms)
                WHEN tensor_ms > 0 THEN tensor / (10000.0 * tensor_ms) END AS efu,
           CASE WHEN t.flops IS NOT NULL THEN 'flops' WHEN tensor_ms > 0 THEN 'tensor_active' END AS efu_source
    FROM gp LEFT JOIN (SELECT gpu_uuid, pane_start_ns, sum(flops) AS flops FROM f GROUP BY ALL) t USING (gpu_uuid, pane_start_ns)
    UNION ALL
    SELECT gp.*, f.pid, f.flops, f.flops / (peak * 1e9 * covered_ms), 'flops'
    FROM gp JOIN f USING (gpu_uuid, pane_start_ns) WHERE f.pid > 0)
  SELECT gpu_uuid, pane_start_ns, pid, coalesce(flops, 0) AS flops, efu, efu_source, bw_util, 1 - bw_util AS delta_bw,
         bw_source, CASE WHEN busy = 0 THEN 'idle' WHEN efu >= {compute_bound_efu} THEN 'compute_bound'
                         WHEN bw_util >= {memory_bound_bw} THEN 'memory_bound' ELSE 'latency_bound' END AS diagnosis
  FROM rows;
