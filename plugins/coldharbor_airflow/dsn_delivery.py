"""How the hot tier's DSN, which holds the password, reaches a job's Spark driver.

Never as a value on the spark-submit command line, in a Spark setting, a log line or a pod spec.
The apache-spark provider turns a job's environment variables into `--conf
spark.yarn.appMasterEnv.*` (YARN) or `--conf spark.kubernetes.driverEnv.*` (Kubernetes) arguments,
which `ps` and the Spark UI's environment page show, so the DSN is never one of them:

| master, deploy mode | the driver reads the DSN from |
|---|---|
| local, spark:// client, yarn client, k8s:// client | a file of this run (mode 0600 in a private folder, removed after the run) named by COLDHARBOR_PG_DSN_FILE |
| yarn cluster | the same file, shipped with `--files` into the driver's YARN container (the application's staging folder is private to its user and removed with it) |
| k8s:// cluster | COLDHARBOR_PG_DSN set from a Kubernetes secret by `spark.kubernetes.driver.secretKeyRef` (the setting holds the secret's name) |
| spark:// cluster | refused: a standalone master has no secret store, and the driver's worker cannot see this machine's file |
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from airflow.sdk.exceptions import AirflowException

PG_DSN_ENV = "COLDHARBOR_PG_DSN"
PG_DSN_FILE_ENV = "COLDHARBOR_PG_DSN_FILE"
DSN_FILE_NAME = "coldharbor-pg.dsn"
# The Spark connection's extra naming the Kubernetes secret ("name:key") that holds the DSN.
SECRET_EXTRA = "pg-dsn-secret"

_LOCAL_MASTER = re.compile(r"local(\[[0-9*]+(,[0-9]+)?\])?")
# Kubernetes names: a DNS subdomain for the secret, and a data key.
_SECRET_REF = re.compile(r"([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?):([-._a-zA-Z0-9]{1,253})")


@dataclass(frozen=True)
class DsnDelivery:
    """What the submit adds so that the driver finds the DSN; none of it holds the DSN itself."""

    env: dict[str, str] = field(default_factory=dict)
    conf: dict[str, str] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)


def deliver_dsn(dsn: str, master: str, deploy_mode: str | None, folder: Path,
                k8s_secret: str | None = None) -> DsnDelivery:
    """The delivery for this master and deploy mode (table above); writes the DSN file into
    `folder` (a private folder the caller removes after the run) where one is used."""
    cluster = deploy_mode == "cluster"
    if master.startswith("k8s://") and cluster:
        return DsnDelivery(conf={f"spark.kubernetes.driver.secretKeyRef.{PG_DSN_ENV}": _secret_ref(k8s_secret)})
    if master.startswith("spark://") and cluster:
        raise AirflowException(
            f"deploy mode 'cluster' on the standalone master {master} cannot receive the PostgreSQL password "
            "without putting it on a command line (the driver runs on a worker that cannot read this machine's "
            "files, and a standalone master has no secret store): use deploy mode 'client'; nothing was submitted")
    if not (_LOCAL_MASTER.fullmatch(master) or master.startswith(("spark://", "k8s://")) or master == "yarn"):
        raise AirflowException(f"the Spark master {master!r} is not one Coldharbor submits to: local[N], "
                               "spark://host:port, yarn or k8s://https://host:port; nothing was submitted")
    path = write_dsn_file(folder, dsn)
    if master == "yarn" and cluster:  # the driver's container gets the file in its working folder
        return DsnDelivery(env={PG_DSN_FILE_ENV: DSN_FILE_NAME}, files=[f"{path}#{DSN_FILE_NAME}"])
    return DsnDelivery(env={PG_DSN_FILE_ENV: str(path)})


def write_dsn_file(folder: Path, dsn: str) -> Path:
    """The DSN in `folder`/coldharbor-pg.dsn, created with mode 0600 (never readable by others,
    not even for an instant) and refused if the name already exists."""
    path = folder / DSN_FILE_NAME
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as out:
        out.write(dsn + "\n")
    return path


def _secret_ref(k8s_secret: str | None) -> str:
    if not k8s_secret:
        raise AirflowException(
            f"a Kubernetes driver (deploy mode 'cluster') reads the PostgreSQL DSN from a Kubernetes secret: create "
            f"one (kubectl create secret generic coldharbor-pg --from-literal=dsn='postgresql://...') in the job's "
            f"namespace and name it in the Spark connection's extra as \"{SECRET_EXTRA}\": \"coldharbor-pg:dsn\"; "
            "nothing was submitted")
    if not _SECRET_REF.fullmatch(k8s_secret):
        raise AirflowException(f"the extra {SECRET_EXTRA!r} of the Spark connection must be <secret name>:<key> "
                               f"(Kubernetes names), not {k8s_secret!r}; nothing was submitted")
    return k8s_secret


def secret_leaks(password: str | None, *values: object) -> bool:
    """Whether the password appears in any of the values (strings, or lists and dicts of them)."""
    if not password:
        return False
    stack: list[object] = list(values)
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, (list, tuple)):
            stack.extend(value)
        elif value is not None and password in str(value):
            return True
    return False
