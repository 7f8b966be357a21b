#!/usr/bin/env bash
# Installs the servers that the tests start by themselves (see internal/testenv):
# redis-server (+ redis-cli) and rabbitmq-server (+ Erlang, epmd) from Debian.
# NATS and Kafka need nothing: nats-server is embedded and kfake runs in-process.
# Also Debian's chromium, the headless browser of the dashboard test (test/ui);
# Debian's prometheus for its promtool, which checks and unit-tests the alerting
# rules in deploy/prometheus (test/ops; the Prometheus server itself is not run);
# and systemd for systemd-analyze, which the deploy tests (deploy/) run on the
# unit file (`systemd-analyze verify`; no running systemd is needed); and zsh and
# fish, which parse the completion scripts `delaybridge completion` writes.
# Real clients of other languages for the end-to-end tests (test/e2e): Debian's
# python3-confluent-kafka and python3-celery (a Celery app and worker), and
# node with npm, which installs the pinned Node.js clients (kafkajs, amqplib,
# nats.js; test/e2e/testdata/node) from the npm registry when a test needs them.
# helm, which the deploy tests run on the chart (deploy/helm_test.go: helm lint
# and helm template), is no Debian package here: it is built from the Go module
# proxy with go install into $(go env GOBIN) or $(go env GOPATH)/bin, where the
# tests look for it besides PATH. With a cold Go cache that takes 3 to 5 minutes
# on 2 busy cores (measured: 3m00s, and 4m57s under a load of 8); with a warm
# one, 8 s. That needs no root.
#
# Idempotent and fast when everything is present. The tests never use the system
# services: after installing, this stops and disables them (they would hold the
# default ports 6379, 5672, 4369, 9090 and waste memory).
#
# Usage: bash scripts/test-deps.sh   (as root, or with sudo available)
#        TEST_DEPS_FORCE=1 bash scripts/test-deps.sh   runs apt-get (and builds helm) even if all is present
set -euo pipefail

RABBIT_SERVER=/usr/lib/rabbitmq/bin/rabbitmq-server
HELM_VERSION=v3.22.0

# helm: when it is neither on PATH nor in Go's bin directory (or with
# TEST_DEPS_FORCE=1), build it as helm's release builds do: stripped, with its
# version stamped, and with the Kubernetes version of its client-go (v0.37,
# hence 1.37) as the default for helm template, instead of 1.20.
gobin="$(go env GOBIN)"
[ -n "$gobin" ] || gobin="$(go env GOPATH | cut -d: -f1)/bin"
if [ "${TEST_DEPS_FORCE:-}" = 1 ] || { ! command -v helm >/dev/null 2>&1 && [ ! -x "$gobin/helm" ]; }; then
	echo "test-deps: building helm $HELM_VERSION into $gobin (go install from the module proxy; 3-5 min with a cold Go cache)"
	helm_pkg=helm.sh/helm/v3
	GOFLAGS=-mod=mod go install -ldflags "-w -s \
		-X $helm_pkg/internal/version.version=$HELM_VERSION \
		-X $helm_pkg/pkg/lint/rules.k8sVersionMajor=1 -X $helm_pkg/pkg/lint/rules.k8sVersionMinor=37 \
		-X $helm_pkg/pkg/chartutil.k8sVersionMajor=1 -X $helm_pkg/pkg/chartutil.k8sVersionMinor=37" \
		"$helm_pkg/cmd/helm@$HELM_VERSION"
	echo "test-deps: installed $("$gobin/helm" version --short)"
fi

missing=()
command -v redis-server >/dev/null 2>&1 || [ -x /usr/bin/redis-server ] || missing+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || [ -x /usr/bin/redis-cli ] || missing+=(redis-tools)
[ -x "$RABBIT_SERVER" ] || missing+=(rabbitmq-server)
[ -x /usr/bin/chromium ] || missing+=(chromium)
command -v promtool >/dev/null 2>&1 || [ -x /usr/bin/promtool ] || missing+=(prometheus)
command -v systemd-analyze >/dev/null 2>&1 || [ -x /usr/bin/systemd-analyze ] || missing+=(systemd)
command -v zsh >/dev/null 2>&1 || missing+=(zsh)   # the completion scripts are parsed by their shells
command -v fish >/dev/null 2>&1 || missing+=(fish)
command -v curl >/dev/null 2>&1 || missing+=(curl)   # the README's examples are run as written (test/docs)
/usr/bin/python3 -c 'import confluent_kafka' >/dev/null 2>&1 || missing+=(python3-confluent-kafka)
/usr/bin/python3 -c 'import celery' >/dev/null 2>&1 || missing+=(python3-celery)   # a real Celery app and worker (test/e2e)
command -v node >/dev/null 2>&1 || missing+=(nodejs)   # the Node.js clients of test/e2e (node_clients_test.go)
command -v npm >/dev/null 2>&1 || missing+=(npm)       # which installs them (npm ci, from the npm registry)

if [ "${TEST_DEPS_FORCE:-}" = 1 ] && [ ${#missing[@]} -eq 0 ]; then
	missing=(redis-server redis-tools rabbitmq-server chromium prometheus systemd zsh fish python3-confluent-kafka python3-celery nodejs npm curl) # re-run apt-get anyway (for checking this script)
fi
if [ ${#missing[@]} -eq 0 ]; then
	echo "test-deps: redis-server, redis-cli, rabbitmq-server, chromium, promtool, systemd-analyze, zsh, fish, python3-confluent-kafka, python3-celery, node, npm and curl already installed; nothing to do"
	exit 0
fi

if [ "$(id -u)" -eq 0 ]; then
	SUDO=()
elif command -v sudo >/dev/null 2>&1; then
	SUDO=(sudo)
else
	echo "test-deps: missing ${missing[*]}; run this script as root (no sudo found)" >&2
	exit 1
fi

# Keep the package scripts from starting the services (policy-rc.d is honoured by
# invoke-rc.d, which Debian maintainer scripts use). Removed again on exit unless it
# existed before.
policy=/usr/sbin/policy-rc.d
created_policy=0
if [ ! -e "$policy" ]; then
	printf '#!/bin/sh\nexit 101\n' | "${SUDO[@]}" tee "$policy" >/dev/null
	"${SUDO[@]}" chmod 755 "$policy"
	created_policy=1
fi
cleanup() { if [ "$created_policy" -eq 1 ]; then "${SUDO[@]}" rm -f "$policy"; fi; }
trap cleanup EXIT

echo "test-deps: installing ${missing[*]} (apt-get update + install)"
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	"${missing[@]}" >/dev/null

# Stop and disable the system services if something started them anyway. Only touch
# what runs as the services' own users (the tests' servers run as the test's user),
# and never call the init script's stop on a stopped RabbitMQ: it runs rabbitmqctl,
# which itself leaves an epmd daemon behind on the default port 4369.
if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
	for unit in redis-server.service rabbitmq-server.service epmd.service epmd.socket prometheus.service prometheus-node-exporter.service; do
		"${SUDO[@]}" systemctl disable --now "$unit" >/dev/null 2>&1 || true
	done
else
	if pgrep -u redis -x redis-server >/dev/null 2>&1; then
		echo "test-deps: stopping the system redis-server service"
		"${SUDO[@]}" /etc/init.d/redis-server stop >/dev/null 2>&1 || true
	fi
	if pgrep -u rabbitmq -x beam.smp >/dev/null 2>&1; then
		echo "test-deps: stopping the system rabbitmq-server service"
		"${SUDO[@]}" /etc/init.d/rabbitmq-server stop >/dev/null 2>&1 || true
	fi
	# prometheus pulls in prometheus-node-exporter (a Recommends); both run as user prometheus.
	if pgrep -u prometheus >/dev/null 2>&1; then
		echo "test-deps: stopping the system prometheus and prometheus-node-exporter services"
		"${SUDO[@]}" /etc/init.d/prometheus stop >/dev/null 2>&1 || true
		"${SUDO[@]}" /etc/init.d/prometheus-node-exporter stop >/dev/null 2>&1 || true
	fi
	for pid in $(pgrep -u rabbitmq -x epmd 2>/dev/null || true); do
		echo "test-deps: stopping the rabbitmq user's epmd (pid $pid)"
		"${SUDO[@]}" kill -9 "$pid" 2>/dev/null || true
	done
fi

echo "test-deps: installed: $(redis-server --version | cut -d' ' -f1-3), rabbitmq-server $(dpkg-query -W -f='${Version}' rabbitmq-server), chromium $(dpkg-query -W -f='${Version}' chromium), $(promtool --version 2>&1 | head -1), systemd $(dpkg-query -W -f='${Version}' systemd)"
echo "test-deps: system services left stopped; tests start their own servers"
