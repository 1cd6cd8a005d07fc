"""What every job stands on: settings from the environment (`settings`), domain errors that are one
line each (`errors`, invariant 11), PostgreSQL connections and advisory locks (`pg`, invariant 9),
the Spark session, in-process or over Spark Connect (`spark`, `spark_python`; the locale of the JVMs
it starts, `jvm_locale`; how many tasks it runs at once, `spark_parallelism`), what a Spark failure
means in one line (`spark_errors`), the warm engine's server (`engine`), one `run_job` with its exit
codes (`job_main`) and the named crash points the tests inject (`faults`). Imports nothing else of
Coldharbor's."""
