"""Settings and connection parsing, without a server."""

from __future__ import annotations

import pytest
from coldharbor.capture.table_names import split_name
from coldharbor.runtime import pg, settings
from coldharbor.runtime.errors import ConfigError
from coldharbor.runtime.pg import JdbcTarget, describe


def test_missing_dsn_is_a_clear_error(monkeypatch):
    monkeypatch.delenv(settings.PG_DSN_ENV, raising=False)
    with pytest.raises(ConfigError, match="COLDHARBOR_PG_DSN is not set"):
        settings.pg_dsn()


def test_missing_admin_dsn_is_a_clear_error(monkeypatch):
    monkeypatch.delenv(settings.ADMIN_PG_DSN_ENV, raising=False)
    with pytest.raises(ConfigError, match="COLDHARBOR_ADMIN_PG_DSN is not set"):
        settings.admin_pg_dsn()


def test_migrate_without_the_admin_dsn_refuses_clearly():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "coldharbor.capture.migrate"], capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(settings.PROJECT_DIR / "jobs"),
                               settings.PG_DSN_ENV: "postgresql://coldharbor_pipeline:x@127.0.0.1:1/db"})
    assert done.returncode == 2
    assert "COLDHARBOR_ADMIN_PG_DSN is not set" in done.stderr and "Traceback" not in done.stderr


def test_airflow_and_the_jobs_never_inherit_set_up_secrets(monkeypatch):
    from coldharbor.embedded import service

    for name in service.SETUP_ONLY:
        monkeypatch.setenv(name, "postgresql://postgres:superuser-secret@127.0.0.1:5432/postgres")
    env = service.airflow_env("postgresql://coldharbor_pipeline:pipeline-secret@127.0.0.1:54329/postgres")
    assert "superuser-secret" not in repr(env)
    assert '"login": "coldharbor_pipeline"' in env["AIRFLOW_CONN_COLDHARBOR_PG"]


def test_a_login_dsn_keeps_server_and_database_and_quotes_the_password():
    from coldharbor.capture import roles

    dsn = roles.login_dsn("postgresql://postgres:x@db.internal:6543/shop", "coldharbor_pipeline", "p@ss/word")
    target = JdbcTarget.from_dsn(dsn)
    assert (target.url, target.user, target.password) == ("jdbc:postgresql://db.internal:6543/shop",
                                                          "coldharbor_pipeline", "p@ss/word")


def test_jdbc_target_keeps_the_password_out_of_the_url():
    target = JdbcTarget.from_dsn("postgresql://app:s3cret@db.internal:6543/shop")
    assert target.url == "jdbc:postgresql://db.internal:6543/shop"
    assert "s3cret" not in target.url
    assert target.options()["password"] == "s3cret"


def test_jdbc_target_refuses_a_unix_socket_dsn():
    with pytest.raises(ConfigError, match="Spark's JDBC needs TCP"):
        JdbcTarget.from_dsn("host=/var/run/postgresql dbname=shop")


def test_describe_hides_credentials():
    assert describe("postgresql://app:s3cret@db:5432/shop") == "db:5432/shop"


@pytest.mark.parametrize("name, expected", [("orders", ("public", "orders")), ("sales.orders", ("sales", "orders"))])
def test_split_name(name, expected):
    assert split_name(name) == expected


@pytest.mark.parametrize("bad", ["a.b.c", ".orders", "sales."])
def test_split_name_refuses_malformed_names(bad):
    with pytest.raises(ConfigError, match="not of the form schema.table"):
        split_name(bad)


@pytest.mark.parametrize(("mode", "path", "needed"), [
    (None, "s3a://lake/public/orders", True),
    (None, "S3://lake/public/orders", True),
    (None, "/data/lake/public/orders", False),
    (None, "hdfs://nn/lake/public/orders", False),
    ("on", "/data/lake/public/orders", True),
    ("off", "s3a://lake/public/orders", False),
])
def test_lake_commit_lock_is_on_for_s3_by_default(monkeypatch, mode, path, needed):
    if mode is None:
        monkeypatch.delenv(settings.LAKE_COMMIT_LOCK_ENV, raising=False)
    else:
        monkeypatch.setenv(settings.LAKE_COMMIT_LOCK_ENV, mode)
    assert settings.lake_commit_lock_needed(path) is needed


def test_lake_commit_lock_setting_is_checked(monkeypatch):
    monkeypatch.setenv(settings.LAKE_COMMIT_LOCK_ENV, "sometimes")
    with pytest.raises(ConfigError, match="COLDHARBOR_LAKE_COMMIT_LOCK must be auto, on or off"):
        settings.lake_commit_lock_needed("/lake")


def test_extra_packages_join_the_pinned_ones(monkeypatch):
    from coldharbor.runtime.spark import maven_packages

    monkeypatch.setenv(settings.EXTRA_PACKAGES_ENV, " org.apache.hadoop:hadoop-aws:3.5.0 ,")
    assert maven_packages()[-1] == "org.apache.hadoop:hadoop-aws:3.5.0"
    assert len(maven_packages()) == 3
    monkeypatch.setenv(settings.EXTRA_PACKAGES_ENV, "hadoop-aws")
    with pytest.raises(ConfigError, match="'hadoop-aws' is not a Maven coordinate"):
        maven_packages()


def test_the_dsn_file_wins_over_the_variable(monkeypatch, tmp_path):
    dsn_file = tmp_path / "pg.dsn"
    dsn_file.write_text("postgresql://app:from-file@db/shop\n")
    monkeypatch.setenv(settings.PG_DSN_ENV, "postgresql://app:from-env@db/shop")
    monkeypatch.setenv(settings.PG_DSN_FILE_ENV, str(dsn_file))
    assert settings.pg_dsn() == "postgresql://app:from-file@db/shop"
    monkeypatch.delenv(settings.PG_DSN_FILE_ENV)
    assert settings.pg_dsn() == "postgresql://app:from-env@db/shop"


@pytest.mark.parametrize("content, message", [(None, "cannot read the DSN file"), ("\n", "is empty")])
def test_an_unreadable_or_empty_dsn_file_is_a_clear_error(monkeypatch, tmp_path, content, message):
    dsn_file = tmp_path / "pg.dsn"
    if content is not None:
        dsn_file.write_text(content)
    monkeypatch.setenv(settings.PG_DSN_FILE_ENV, str(dsn_file))
    with pytest.raises(ConfigError, match=f"COLDHARBOR_PG_DSN_FILE: .*{message}"):
        settings.pg_dsn()


def test_jdbc_target_carries_the_dsns_tls_options_and_name_as_properties():
    target = JdbcTarget.from_dsn("host=db.internal port=6543 dbname=shop user=app password=s3cret sslmode=verify-full "
                                 "sslrootcert=/etc/ssl/db-root.crt options='-c search_path=shop' "
                                 "application_name=nightly connect_timeout=7")
    assert target.url == "jdbc:postgresql://db.internal:6543/shop"
    options = target.options()
    assert {k: options[k] for k in ("sslmode", "sslrootcert", "options", "ApplicationName", "connectTimeout")} == {
        "sslmode": "verify-full", "sslrootcert": "/etc/ssl/db-root.crt",
        "options": pg.pinned_options("-c search_path=shop"), "ApplicationName": "nightly", "connectTimeout": "7"}
    assert options["password"] == "s3cret" and "s3cret" not in target.url


def test_jdbc_target_quotes_the_database_and_brackets_an_ipv6_host():
    assert JdbcTarget.from_dsn("host=::1 dbname='my db?x' user=u").url == "jdbc:postgresql://[::1]:5432/my%20db%3Fx"


@pytest.mark.parametrize("dsn, message", [
    ("host=db user=u sslkey=/k.pem", "parameter 'sslkey' is not supported"),
    ("host=db user=u service=prod", "parameter 'service' is not supported"),
    ("host=a,b user=u", "names several hosts"),
])
def test_dsn_parameters_the_jdbc_side_cannot_honour_are_refused(dsn, message):
    with pytest.raises(ConfigError, match=message):
        JdbcTarget.from_dsn(dsn)


@pytest.mark.parametrize("dsn", ["host=db password=two words", "postgresql://app:two words@db/shop",
                                 "host=db password='unterminated"])
def test_an_unparsable_dsn_is_refused_without_repeating_the_password(dsn):
    """libpq's own message quotes the text it stopped at, which may be the password."""
    for call in (describe, JdbcTarget.from_dsn):
        with pytest.raises(ConfigError, match="does not parse") as refused:
            call(dsn)
        assert "words" not in str(refused.value) and "unterminated" not in str(refused.value)
