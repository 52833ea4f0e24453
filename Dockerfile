# dispatch-controller image: `dispatchctl run --config /etc/dispatch/config.toml`.
#
# Two stages: the builder installs the project and its dependencies (binary wheels; no
# compiler) into a virtual environment, /opt/dispatch, and drops pip and setuptools from
# it; the runtime copies that environment (no network for Python at that point), plus
# openssh-client for the SSH transport, and runs as user 10001.
#
# BASE_IMAGE is the public python:3.11-slim-bookworm; pin it by digest too
# (python:3.11-slim-bookworm@sha256:...) in a release pipeline. Any Debian 12 image with
# python3.11 and its venv module works: where no registry is reachable, tests/test_image.py
# builds with --build-arg BASE_IMAGE=<a local debootstrap, see scripts/image-base>.
ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS builder

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
# Only what the wheel needs (see .dockerignore); migrations/ is packaged as
# controller/_migrations by pyproject's hatch force-include.
COPY pyproject.toml README.md ./
COPY controller ./controller
COPY migrations ./migrations
RUN python3 -m venv /opt/dispatch \
    && /opt/dispatch/bin/pip install --prefer-binary . \
    && /opt/dispatch/bin/pip uninstall -y pip setuptools \
    && find /opt/dispatch -name __pycache__ -prune -exec rm -rf {} +


FROM ${BASE_IMAGE} AS runtime

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/dispatch/bin:$PATH

# openssh-client floats with the base image's Debian release so security updates
# are picked up on rebuild; the release itself is pinned by the base image tag.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends openssh-client \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 dispatch \
    && useradd --system --uid 10001 --gid 10001 --home-dir /home/dispatch --create-home \
        --shell /usr/sbin/nologin dispatch

COPY --from=builder /opt/dispatch /opt/dispatch

USER 10001
WORKDIR /home/dispatch

# /metrics, /healthz and /readyz (config: daemon.metrics_port; bind daemon.metrics_host
# to 0.0.0.0 in a container).
EXPOSE 9464

HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:9464/healthz', timeout=4).status == 200 else 1)"]

ENTRYPOINT ["dispatchctl"]
CMD ["run", "--config", "/etc/dispatch/config.toml"]
