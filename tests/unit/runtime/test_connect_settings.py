"""The Spark Connect settings, the server's command line and the lost-server error, without a
server."""

from __future__ import annotations

import pytest
from coldharbor.runtime import jvm_locale, settings, spark, spark_errors
from coldharbor.runtime.errors import ConfigError, SparkUnavailableError


@pytest.mark.parametrize("raw, message", [
    ("http://127.0.0.1:15002", "must be a Spark Connect URL"),
    ("local[2]", "must be a Spark Connect URL"),
    ("sc://", "must be a Spark Connect URL"), ("sc://127.0.0.1:abc", "must be a Spark Connect URL"),
    ("sc://[::1", "must be a Spark Connect URL"), ("sc://127.0.0.1:99999", "must be a Spark Connect URL"),
    ("sc://127.0.0.1:15002/path", "must be a Spark Connect URL"), ("sc://127.0.0.1:15002;x", "must be a Spark Connect"),
    ("sc://user:pw@127.0.0.1:15002", "must be a Spark Connect URL"),
    ("sc://127.0.0.1:15002/;session_id=6f1c2b9e-1d7a-4f43-9a59-7d1f0c1e2b3a", "session_id='6f1c"),
    ("sc://127.0.0.1:15002/;use_ssl=maybe", "use_ssl='maybe' is not allowed"),
])
def test_a_remote_that_is_not_a_connect_url_is_refused(monkeypatch, raw, message):
    monkeypatch.setenv(settings.SPARK_REMOTE_ENV, raw)
    with pytest.raises(ConfigError, match=message):
        settings.spark_remote()


@pytest.mark.parametrize("raw", ["sc://127.0.0.1:15002", "sc://127.0.0.1", "sc://spark-connect:15002/",
                                 "sc://[::1]:15002", "sc://h:15002/;user_id=coldharbor;token=abc%3D", "sc://h/;use_ssl=true", "sc://h:1/;use_ssl=True"])
def test_connect_urls_as_users_and_the_spark_provider_write_them_are_accepted(monkeypatch, raw):
    monkeypatch.setenv(settings.SPARK_REMOTE_ENV, raw)
    assert settings.spark_remote() == raw


def test_no_remote_means_a_classic_session(monkeypatch):
    monkeypatch.setenv(settings.SPARK_REMOTE_ENV, "  ")
    assert settings.spark_remote() is None


@pytest.mark.parametrize("name, raw", [
    (settings.SPARK_REMOTE_WAIT_ENV, "-1"), (settings.SPARK_REMOTE_WAIT_ENV, "nan"),
    (settings.SPARK_REMOTE_WAIT_ENV, "1e9"), (settings.SPARK_REMOTE_WAIT_ENV, "soon"),
    (settings.JDBC_READERS_ENV, "0"), (settings.JDBC_READERS_ENV, "2.5"), (settings.JDBC_READERS_ENV, "inf"),
    (settings.JDBC_READERS_ENV, "1_0"), (settings.JDBC_READERS_ENV, "٣"), (settings.JDBC_READERS_ENV, " 3 "),
    (settings.SPARK_REMOTE_WAIT_ENV, "1_0"), (settings.SPARK_REMOTE_WAIT_ENV, "٣"),
])
def test_numbers_out_of_range_are_refused_naming_the_setting(monkeypatch, name, raw):
    monkeypatch.setenv(name, raw)
    with pytest.raises(ConfigError, match=name):
        settings.spark_remote_wait_seconds() if name == settings.SPARK_REMOTE_WAIT_ENV else settings.jdbc_readers()


@pytest.mark.parametrize("wait_s", [0.0, 1.0, 15.0, 120.0])
def test_the_retry_budget_adds_up_to_the_wait(wait_s):
    budget = spark._retry_budget(wait_s)
    backoffs = [min(0.2 * 2 ** i, 2.0) for i in range(budget["max_retries"])]
    assert sum(backoffs) <= wait_s < sum(backoffs) + min(0.2 * 2 ** budget["max_retries"], 2.0)


def test_the_server_command_carries_delta_the_driver_and_every_setting_on_loopback():
    command = spark.connect_server_command(15999, "local[3]", extra_conf={"spark.hadoop.fs.s3a.endpoint": "http://m"})
    assert command[command.index("--class") + 1] == spark.CONNECT_SERVER_CLASS
    assert command[command.index("--master") + 1] == "local[3]"
    assert command[command.index("--packages") + 1] == ",".join(spark.maven_packages())
    confs = dict(c.split("=", 1) for c in command[1::] if "=" in c and c.startswith("spark."))
    assert confs["spark.connect.grpc.binding.address"] == "127.0.0.1"
    assert confs["spark.connect.grpc.binding.port"] == "15999"
    assert confs["spark.hadoop.fs.s3a.endpoint"] == "http://m"
    assert {k: confs[k] for k in spark.DEFAULT_CONF} == spark.DEFAULT_CONF
    assert command[-1] == "spark-internal"


def test_a_lost_server_is_one_error_naming_it_only_on_connect(monkeypatch):
    class Unavailable(Exception):
        pass

    lost = Unavailable("<_MultiThreadedRendezvous of RPC that terminated with:\n\tstatus = StatusCode.UNAVAILABLE")
    monkeypatch.delenv(settings.SPARK_REMOTE_ENV, raising=False)
    assert spark_errors.lost_spark(lost) is None
    monkeypatch.setenv(settings.SPARK_REMOTE_ENV, "sc://127.0.0.1:1")
    wrapped = RuntimeError("the write failed")
    wrapped.__cause__ = lost
    error = spark_errors.lost_spark(wrapped)
    assert isinstance(error, SparkUnavailableError)
    assert "sc://127.0.0.1:1 is unreachable" in str(error) and "\n" not in str(error)
    assert spark_errors.lost_spark(ValueError("[DIVIDE_BY_ZERO] Division by zero")) is None


@pytest.mark.parametrize("env, locale", [
    ({"LC_ALL": "C"}, "C.UTF-8"),
    ({"LANG": "POSIX"}, "C.UTF-8"),
    ({}, "C.UTF-8"),
    ({"LC_ALL": "xx_YY.UTF-8"}, "C.UTF-8"),  # names UTF-8, but no such locale here
    ({"LC_ALL": "C", "LC_CTYPE": "C.UTF-8"}, "C.UTF-8"),  # LC_ALL wins in the JVM too
])
def test_every_jvm_coldharbor_starts_gets_a_utf8_locale(env, locale):
    assert jvm_locale.jvm_environment(env)["LC_ALL"] == locale


def test_a_usable_utf8_locale_is_left_alone():
    assert "LC_ALL" not in jvm_locale.jvm_environment({"LC_CTYPE": "C.UTF-8", "LANG": "C"})
    assert jvm_locale.jvm_environment({"LANG": "C.utf8", "X": "1"}) == {"LANG": "C.utf8", "X": "1"}


@pytest.mark.parametrize("name, raw, message", [
    ("COLDHARBOR_SHUFFLE_PARTITIONS", "4 ", "is not a number of tasks"),
    ("COLDHARBOR_DELTA_SNAPSHOT_PARTITIONS", "1.5", "must be a whole number from 1 to 100000"),
    ("COLDHARBOR_DRIVER_MEMORY", "lots", "is not a JVM memory size"),
    ("COLDHARBOR_DRIVER_MEMORY", "-2g", "is not a JVM memory size"),
])
def test_a_bad_spark_setting_is_refused_before_any_session_starts(monkeypatch, name, raw, message):
    monkeypatch.setenv(name, raw)
    with pytest.raises(ConfigError, match=f"{name}.*{message}"):
        spark.connect_session("sc://127.0.0.1:1", "test")  # no server there: refused before it is asked
    with pytest.raises(ConfigError, match=f"{name}.*{message}"):
        spark.session_conf("local[1]")


def test_a_recorded_reason_is_one_line_never_a_grpc_or_jvm_repr(monkeypatch):
    """What maintenance_runs.error and the export's worker warnings keep of an exception."""
    from coldharbor.runtime.errors import LakeUnavailableError
    from coldharbor.runtime.job_main import reason

    monkeypatch.setenv(settings.SPARK_REMOTE_ENV, "sc://127.0.0.1:1")
    lost = RuntimeError('<_InactiveRpcError of RPC that terminated with:\n\tstatus = StatusCode.UNAVAILABLE\n\t'
                        'details = "failed to connect to all addresses"\n\tdebug_error_string = "UNKNOWN:..."\n>')
    assert reason(lost).startswith("the Spark Connect server at sc://127.0.0.1:1 is unreachable")
    jvm = RuntimeError("An error occurred while calling o123.save.\n: org.apache.spark.SparkException: "
                       "Job aborted.\n\tat org.apache.spark.sql.X(X.scala:1)")
    assert reason(jvm) == ": org.apache.spark.SparkException: Job aborted."
    assert reason(LakeUnavailableError("table \"a\nb\" gone")) == 'table "a\\nb" gone'
    assert reason(KeyError()) == "KeyError"


def test_a_token_in_the_remote_never_reaches_a_message(monkeypatch):
    """Found by a cold attack: the token was printed in the job's error line and kept in
    report_runs.error."""
    monkeypatch.setenv(settings.SPARK_REMOTE_ENV, "sc://127.0.0.1:99999/;token=SuperSecret123")
    with pytest.raises(ConfigError) as refused:
        settings.spark_remote()
    assert "SuperSecret123" not in str(refused.value) and "token=***" in str(refused.value)
    monkeypatch.setenv(settings.SPARK_REMOTE_ENV, "sc://127.0.0.1:1/;token=SuperSecret123;use_ssl=false")
    with pytest.raises(ConfigError, match="a token is only ever sent over TLS"):
        settings.spark_remote()
    monkeypatch.setenv(settings.SPARK_REMOTE_ENV, "sc://127.0.0.1:1/;token=SuperSecret123")
    lost = RuntimeError("<_InactiveRpcError of RPC that terminated with:\n\tstatus = StatusCode.UNAVAILABLE\n\t"
                        "details = \"failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: "
                        "Ssl handshake failed (TSI_PROTOCOL_FAILURE)\"\n>")
    said = str(spark_errors.lost_spark(lost))
    assert "SuperSecret123" not in said and "sc://127.0.0.1:1/;token=***" in said
    assert "does not speak TLS" in said
