# Coldharbor: `make run` starts the service on its embedded defaults, `make test` runs every test.
# Both install what they need first (virtual environment, pinned requirements, Spark jars).

PYTHON ?= python3
VENV   := .venv
BIN    := $(CURDIR)/$(VENV)/bin
DATA   := $(CURDIR)/data

export PYTHONPATH      := $(CURDIR)/jobs
export PATH            := $(BIN):$(PATH)
export SPARK_LOCAL_IP  ?= 127.0.0.1
export COLDHARBOR_IVY_DIR ?= $(DATA)/ivy

SPARK_SUBMIT = $(BIN)/spark-submit --master local[2] \
	--packages $$($(BIN)/python -c 'from coldharbor.runtime.spark import maven_packages; print(",".join(maven_packages()))') \
	--conf spark.jars.ivy=$(COLDHARBOR_IVY_DIR) --conf spark.ui.enabled=false

.PHONY: run test setup browser compose-client minio stop export compact cleanup changes bench consistency clean

# MinIO for the s3a lake tests, built from the Go module proxy (a pinned commit).
MINIO_MODULE := github.com/minio/minio@v0.0.0-20260212201848-7aac2a2c5b7c

run: setup                         ## the service on its embedded defaults: PostgreSQL, a live demo table, Airflow
	$(BIN)/python -m coldharbor.embedded.service start

test: setup browser compose-client minio  ## the whole test suite against real PostgreSQL and Spark + Delta
	$(BIN)/python -m pytest

export: setup                      ## one CDC export run over every registered table
	set -a && . $(DATA)/coldharbor.env && set +a && $(SPARK_SUBMIT) jobs/cdc_export.py

compact: setup                     ## compact every registered table's lake files (last write wins)
	set -a && . $(DATA)/coldharbor.env && set +a && $(SPARK_SUBMIT) jobs/compact.py

cleanup: setup                     ## evict, VACUUM, prune the change log (add ARGS=--dry-run to look first)
	set -a && . $(DATA)/coldharbor.env && set +a && $(SPARK_SUBMIT) jobs/cleanup.py $(ARGS)

changes: setup                     ## a table's change feed to a report table (ARGS="--table T --from X --to Y --target changes_n")
	set -a && . $(DATA)/coldharbor.env && set +a && $(SPARK_SUBMIT) jobs/changes.py $(ARGS)

consistency: setup                 ## the consistency suite's long profile (SEEDS=20 STEPS=40 ENGINE=spark-submit|connect): one summary line
	cd $(CURDIR) && PYTHONPATH=$(CURDIR)/jobs:$(CURDIR) $(BIN)/python -m tests.consistency.long_run \
	  --seeds $(or $(SEEDS),20) --steps $(or $(STEPS),40) --engine $(or $(ENGINE),spark-submit)

bench: setup                       ## every benchmark, one table of ratios
	$(BIN)/python -m bench.run_all

stop:                              ## stop every process `make run` started (by process group)
	-$(BIN)/python -m coldharbor.embedded.service stop

setup: $(VENV)/.installed $(DATA)/ivy/.fetched

browser:                           ## Debian's Chromium, for the health-page test in a real browser
	@command -v chromium >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; \
	  else echo "the health-page test needs Chromium: install Debian's chromium package (as root)"; exit 1; fi; }

compose-client:                    ## Debian's docker-compose, to check docker-compose.yaml (no engine needed)
	@command -v docker-compose >/dev/null || docker compose version >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends docker-compose; \
	  else echo "the compose-file test needs a docker compose client: install Debian's docker-compose package (as root)"; exit 1; fi; }

minio: $(DATA)/minio/minio         ## a MinIO server for the s3a tests (without Go they skip, or fail under CI)

$(DATA)/minio/minio:
	@if command -v go >/dev/null; then \
	  echo "building MinIO from the Go module proxy (a few minutes, once)"; \
	  GOBIN=$(DATA)/minio go install $(MINIO_MODULE) || echo "MinIO did not build: the s3a tests will be skipped (failed under CI)"; \
	else echo "no Go toolchain: the s3a tests will be skipped (failed under CI)"; fi

$(VENV)/.installed: requirements.txt
	@command -v java >/dev/null || { echo "Java 17+ is required (java not found on PATH)"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.txt
	touch $@

$(DATA)/ivy/.fetched: $(VENV)/.installed
	mkdir -p $(DATA)
	$(BIN)/python -m coldharbor.embedded.stack fetch-jars
	touch $@

clean: stop
	rm -rf $(VENV) $(DATA)
