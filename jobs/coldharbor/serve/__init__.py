"""Reports: report files (`report_spec`; a parameter's typed value, `param_values`), the SQL sandbox
by allow-list (`sql_guard`, `sql_check`, `sql_names`, `sql_allowlist`, `sql_params`, `sql_feeds`;
invariant 13), the consistent read (`hot_snapshot`, `serve_job`; invariant 6), as-of points
(`as_of`), the change feed (`changes`, `net_changes`; in a report's SQL, `feed_views`),
incremental refresh (`incremental`, `incremental_shape`, `incremental_state`,
`incremental_changes`, `incremental_merge`), where results go without a partial table (`sinks`,
`report_tables`; invariant 11), the run log (`report_runs`) and the job's command line and `run`
(`serve_cli`)."""
