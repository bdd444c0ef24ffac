# Every target installs what it needs from a clean clone.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
JARS   := .cache/jvm
MVN    := mvn -q -B -s jvm/maven-settings.xml

.PHONY: install jvm profiler archives web system-packages browser test test-long fuzz up down status bench bench-quick soak gaps-long scale scale-bench lint docs proto clean

# pip byte-compiles what it installs, which takes 45 of its 100 s, and must: where
# PYTHONDONTWRITEBYTECODE is set, as on CI, no process writes a module's compiled form, and
# without pip's every process compiled each module it imported, every time (a suite run took
# 3 minutes longer, 2026-12-07).
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[platform,dev]'
	touch $@

# Kafka broker, Spark and S3Proxy jars from Maven Central, declared in jvm/*.xml.
$(JARS)/.fetched: jvm/kafka.xml jvm/spark.xml jvm/s3proxy.xml jvm/maven-settings.xml
	@command -v java >/dev/null || { echo "java not found: apt-get install openjdk-17-jdk-headless"; exit 1; }
	@command -v mvn >/dev/null || { echo "mvn not found: apt-get install maven"; exit 1; }
	rm -rf $(JARS)/kafka $(JARS)/spark $(JARS)/s3proxy
	$(MVN) -f jvm/kafka.xml dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory=$(CURDIR)/$(JARS)/kafka
	$(MVN) -f jvm/spark.xml dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory=$(CURDIR)/$(JARS)/spark
	$(MVN) -f jvm/s3proxy.xml dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory=$(CURDIR)/$(JARS)/s3proxy
	touch $@

# The job's JVM side (jvm/decoder: the tick decoder and the real-time live path), from Central.
# Its LocalFiles class goes apart, on the JVMs' own class path (candlewire/spark.py).
DECODER := $(JARS)/spark/candlewire-decoder.jar
LOCALFS := $(JARS)/boot/candlewire-localfs.jar
$(DECODER) $(LOCALFS) &: $(JARS)/.fetched jvm/decoder/pom.xml $(wildcard jvm/decoder/src/main/java/io/candlewire/spark/*.java) $(wildcard proto/*.proto)
	$(MVN) -f jvm/decoder/pom.xml package
	cp jvm/target/decoder/candlewire-decoder.jar $(DECODER)
	mkdir -p $(JARS)/boot
	cp jvm/target/decoder/candlewire-decoder-localfs.jar $(LOCALFS)

jvm: $(JARS)/.fetched $(DECODER) $(LOCALFS)

# async-profiler (jvm/profiler.xml), for `python -m bench.stream --cpu`: samples the job's JVM
# without the overhead a JFR recording started by jcmd adds to it (see docs/benchmarks.md).
profiler: $(JARS)/profiler/.fetched
$(JARS)/profiler/.fetched: jvm/profiler.xml jvm/maven-settings.xml
	rm -rf $(JARS)/profiler
	$(MVN) -f jvm/profiler.xml dependency:copy-dependencies -DoutputDirectory=$(CURDIR)/$(JARS)/profiler
	touch $@

# Class archives (application class-data sharing) of the Spark driver and the Kafka broker:
# each start maps the classes one run loaded instead of loading them again, and a Spark
# session starts in half the time (candlewire/runtime.py). Dumped again when the jars change.
ARCHIVES := $(JARS)/spark/driver.jsa $(JARS)/kafka/broker.jsa
$(JARS)/spark/driver.jsa: $(STAMP) $(DECODER) $(LOCALFS)
	$(PY) -m candlewire.spark
$(JARS)/kafka/broker.jsa: $(STAMP) $(JARS)/.fetched
	$(PY) -m launcher.local.kafka

archives: $(ARCHIVES)

# The live page's chart (lightweight-charts, Apache-2.0), from npm by the lockfile, so the
# gateway serves it itself and the page needs no internet.
CHART_JS := gateway/static/vendor/lightweight-charts.js
$(CHART_JS): gateway/web/package.json gateway/web/package-lock.json
	@command -v npm >/dev/null || { echo "npm not found: apt-get install npm"; exit 1; }
	npm ci --prefix gateway/web --ignore-scripts --no-audit --no-fund
	mkdir -p $(@D)
	cp gateway/web/node_modules/lightweight-charts/LICENSE $(@D)/lightweight-charts.LICENSE
	cp gateway/web/node_modules/lightweight-charts/dist/lightweight-charts.standalone.production.js $@

web: $(CHART_JS)

# From Debian's packages, the packages a recipe's shell put in `missing`: through sudo when
# not root. One apt-get at a time: `browser` runs after `install`, not beside it (dpkg's lock).
APT_INSTALL = if [ -n "$$missing" ]; then \
	  command -v apt-get >/dev/null || { echo "missing:$$missing (install them with this system's packages)"; exit 1; }; \
	  as=""; [ "$$(id -u)" = 0 ] || as=sudo; \
	  if [ -n "$$as" ] && ! command -v sudo >/dev/null; then echo "missing:$$missing; as root: apt-get install$$missing"; exit 1; fi; \
	  echo "installing from Debian's packages:$$missing$${as:+ (with sudo)}"; \
	  $$as apt-get update -qq && $$as env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

# The PostgreSQL server (Iceberg catalog, Dagster, user directory): the stack runs on it.
system-packages:
	@missing=""; \
	ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing="$$missing postgresql"; \
	$(APT_INSTALL)

# Chromium with its driver, for the live page's browser test only: `make test` needs it,
# `make up` does not.
browser:
	@missing=""; \
	command -v chromium >/dev/null 2>&1 || missing="$$missing chromium"; \
	command -v chromedriver >/dev/null 2>&1 || missing="$$missing chromium-driver"; \
	$(APT_INSTALL)

# The venv, the JVM parts, the chart and the system packages side by side (pip unpacks on one
# core while Maven fetches and builds), then the two class archives side by side. Each part's
# output stays together (-O). Then the checkout's own modules are compiled, as pip compiled
# the packages: an editable install leaves them to each process, which with
# PYTHONDONTWRITEBYTECODE compiled them at every start, 0.3 CPU s of a service's imports.
# Only what changed since is compiled again. The packages only: a walk of the whole checkout
# went through the venv's files too, 11 s of every install.
PACKAGES := $(patsubst %/,%,$(dir $(wildcard */__init__.py)))
install:
	@$(MAKE) --no-print-directory -j4 -O $(STAMP) jvm web system-packages
	@$(MAKE) --no-print-directory -j2 -O archives
	@$(PY) -m compileall -q -j 2 $(PACKAGES) >/dev/null

# Two pytest-xdist workers: the Spark, cluster and stack modules one after another on one,
# every other module beside them (tests/conftest.py); one process left a core idle about
# half of the run.
test: install
	@$(MAKE) --no-print-directory browser
	$(PY) -m pytest -n 2

# The restart edge cases that take minutes each (marked `long`), left out of `make test` to
# keep CI under 25 minutes.
test-long: install
	$(PY) -m pytest -m long -p no:cacheprovider

# The decoders' differential fuzz at length (CI runs 3,000 records of one seed), and
# 1,000,000 hostile frames on each bound socket while good traffic flows (CI sends 20,000).
FUZZ_SOCKETS := tests/relay/test_fuzz.py tests/gateway/test_fuzz.py tests/journal/test_fuzz.py \
	tests/streaming/test_publisher.py::test_what_a_relay_sends_up_that_is_no_subscription_is_counted \
	tests/streaming/test_live_jvm.py::test_what_a_relay_sends_up_the_live_xpub_that_is_no_subscription_is_counted
fuzz: install
	CANDLEWIRE_FUZZ_FRAMES=1000000 $(PY) -m pytest -q -p no:cacheprovider --timeout 3600 $(FUZZ_SOCKETS)
	CANDLEWIRE_FUZZ_RECORDS=200000 CANDLEWIRE_FUZZ_SEED=1 $(PY) -m pytest -q tests/streaming/test_decode_jvm.py
	CANDLEWIRE_FUZZ_RECORDS=200000 CANDLEWIRE_FUZZ_SEED=2 $(PY) -m pytest -q tests/streaming/test_decode_jvm.py

up: install
	$(VENV)/bin/candlewire up

down:
	@if [ -x $(VENV)/bin/candlewire ]; then $(VENV)/bin/candlewire down; fi

status: $(STAMP)
	$(VENV)/bin/candlewire status

# The distributed engines on hosts of their own (network namespaces; root): minutes.
scale: install
	$(PY) -m pytest -m scale -p no:cacheprovider --timeout 1200

# Many relays and publishers on network namespaces (root): relays_2_over_1, failover_s, lost.
scale-bench: install
	$(PY) -m bench.scale

bench: install
	$(PY) -m bench.relay
	$(PY) -m bench.kafka
	$(PY) -m bench.ingest
	$(PY) -m bench.stream
	$(PY) -m bench.commit
	$(PY) -m bench.spark_floor
	$(PY) -m bench.history
	$(PY) -m bench.subscribe
	$(PY) -m bench.backfill
	$(PY) -m bench.events
	$(PY) -m bench.replay_files
	$(PY) -m bench.cep
	$(PY) -m bench.replay
	$(PY) -m bench.archive

# The short benchmarks (about five minutes) against bench/baseline.json: fails when a figure is
# more than 20 % worse. After a change to a hot path (docs/benchmarks.md); ARGS=--update
# records this run as the baseline.
bench-quick: install
	$(PY) -m bench.quick $(ARGS)

# The gap tests with 3-minute windows lost upstream instead of 20 s (#37): minutes.
gaps-long: install
	CANDLEWIRE_TEST_GAP_S=180 $(PY) -m pytest -q -p no:cacheprovider --timeout 1200 \
		tests/streaming/test_job.py::test_lost_windows_are_found_fetched_again_and_corrected_into_every_candle

# Steady ticks for half an hour: commit times, RSS and lag must not grow (#34).
soak: install
	$(PY) -m bench.soak

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# The documentation site (mkdocs.yml, docs/) into build/site; --strict fails on a broken link
# or anchor and on an undocumented public member of the API reference. `make test` builds it
# too (tests/test_docs.py).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir build/site

proto: $(STAMP)
	$(PY) -m proto.generate

# A cluster relocated out of a private state dir (launcher/local/postgres.py) goes with it.
clean: down
	@if [ -x $(PY) ]; then $(PY) -m launcher.local.postgres .candlewire/postgres; fi
	rm -rf $(VENV) .candlewire .cache jvm/target gateway/web/node_modules gateway/static/vendor
