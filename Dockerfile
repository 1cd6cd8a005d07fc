# One image for the whole docker-compose stack: Airflow (API server, scheduler, DAG processor,
# triggerer), the Spark master and worker, and the jobs. Driver and executors therefore run the
# same Python, the same PySpark and the same `coldharbor` package.
#   docker compose build          (docker-compose.yaml builds it as coldharbor:local)
FROM apache/airflow:3.3.2-python3.11

USER root
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
 && rm -rf /var/lib/apt/lists/*
ENV JAVA_HOME=/usr/lib/jvm/java-17-openjdk-amd64

# Named volumes mounted on /opt/coldharbor-data start with this folder's owner (the airflow user).
RUN mkdir -p /opt/coldharbor-data/ivy && chown -R airflow:root /opt/coldharbor-data
USER airflow
COPY --chown=airflow:root requirements.txt /opt/coldharbor/requirements.txt
RUN pip install --no-cache-dir -r /opt/coldharbor/requirements.txt

COPY --chown=airflow:root dags /opt/coldharbor/dags
COPY --chown=airflow:root jobs /opt/coldharbor/jobs
COPY --chown=airflow:root plugins /opt/coldharbor/plugins
COPY --chown=airflow:root sql /opt/coldharbor/sql
ENV COLDHARBOR_PROJECT_DIR=/opt/coldharbor \
    PYTHONPATH=/opt/coldharbor/jobs:/opt/coldharbor/plugins:/opt/coldharbor/dags \
    AIRFLOW__CORE__DAGS_FOLDER=/opt/coldharbor/dags \
    AIRFLOW__CORE__PLUGINS_FOLDER=/opt/coldharbor/plugins
WORKDIR /opt/coldharbor
