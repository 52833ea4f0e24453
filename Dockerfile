# dispatch-controller image: `dispatchctl run --config /etc/dispatch/config.toml`.
#
# Two stages: the builder turns the project and all its dependencies into wheels;
# the runtime installs only those wheels (no compiler, no network at that point),
# plus openssh-client for operators debugging the SSH transport from the pod.
# The base image is pinned by tag (Python minor + Debian release); pin it by digest
# too (python:3.11-slim-bookworm@sha256:...) in a release pipeline.

FROM python:3.11-slim-bookworm AS builder

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
# Only what the wheel needs (see .dockerignore); migrations/ is packaged as
# controller/_migrations by pyproject's hatch force-include.
COPY pyproject.toml README.md ./
COPY controller ./controller
COPY migrations ./migrations
RUN pip wheel --wheel-dir /wheels .


FROM python:3.11-slim-bookworm AS runtime

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

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

COPY --from=builder /wheels /wheels
RUN pip install --no-index --find-links /wheels /wheels/dispatch_controller-*.whl \
    && rm -rf /wheels

USER 10001
WORKDIR /home/dispatch

# /metrics, /healthz and /readyz (config: daemon.metrics_port; bind daemon.metrics_host
# to 0.0.0.0 in a container).
EXPOSE 9464

HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:9464/healthz', timeout=4).status == 200 else 1)"]

ENTRYPOINT ["dispatchctl"]
CMD ["run", "--config", "/etc/dispatch/config.toml"]
