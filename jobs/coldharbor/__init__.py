"""Coldharbor: PostgreSQL (hot) to Delta Lake (cold) change capture, maintenance and serving.

Subpackages by stage, each importing only from the stages above it in this list (a unit test,
tests/unit/test_layout.py, refuses an import that goes the other way):

    runtime      settings, errors, PostgreSQL and Spark sessions, the job main, fault points
    capture      the registry of captured tables, the migrations runner, the roles
    lake         Delta I/O, the lake's row layout and values, the dirty-set anti-join
    export       the CDC export and the initial load: the one-snapshot read of the dirty set
    serve        reports: files, the SQL sandbox, the hot snapshot, sinks, run log, feeds
    maintenance  compaction, cleanup and eviction, purge, resync, verify
    embedded     the service on one machine (PostgreSQL, the warm engine, Airflow); never shipped
                 to Spark with the jobs
"""
