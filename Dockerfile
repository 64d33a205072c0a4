# relay: a MySQL/MariaDB replication relay. Build: docker build -t relay .
# Run:  docker run -v relay-data:/var/lib/relay -v ./relay.toml:/etc/relay/config.toml:ro \
#         -p 3307:3307 -p 9104:9104 relay
# Secrets come from the mounted config or the environment (password_env), never the image.
# The relay's listeners default to loopback, which -p cannot reach: the mounted config sets
# listen = "0.0.0.0:..." for each port published, with TLS ([downstream.tls]; [tap.tls] and
# [[tap.users]]; [metrics.tls] and a token), or allow_insecure = true in that section
# (else the relay refuses to start, naming the setting). The shipped config.toml keeps
# every listener on loopback.

# The base: Python 3.11 with `python` and `pip` on the PATH installing under /usr/local.
# Another may be given (--build-arg BASE=...): the tests build on one made from Debian's
# packages (tests/integration/test_container.py), where the public image cannot be pulled.
ARG BASE=python:3.11-slim-bookworm

FROM ${BASE} AS build
# gcc builds the compiled kernels (relay/kernels/compiled.pyx); the final image has none.
# hadolint ignore=DL3008
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY relay ./relay
# The commit `relay --version` and relay_build_info name (.git is not copied):
# docker build --build-arg RELAY_COMMIT=$(git rev-parse --short=12 HEAD) .
ARG RELAY_COMMIT=""
RUN pip install --no-cache-dir --prefix=/install .

FROM ${BASE}
RUN groupadd --system --gid 10001 relay \
    && useradd --system --uid 10001 --gid relay --home-dir /var/lib/relay \
        --shell /usr/sbin/nologin relay \
    && mkdir -p /var/lib/relay /etc/relay \
    && chown relay:relay /var/lib/relay
COPY --from=build /install /usr/local
COPY config.toml /etc/relay/config.toml
USER 10001:10001
WORKDIR /var/lib/relay
VOLUME ["/var/lib/relay"]
# 3307: replicas ([downstream] listen); 4000: the Spark tap ([tap] listen, when set);
# 9104: /metrics, /status, /healthz, /readyz.
EXPOSE 3307 4000 9104
# The probe asks /healthz from inside the container (0.0.0.0 includes loopback); with
# [metrics.tls] run with -e RELAY_HEALTHZ=https://127.0.0.1:9104/healthz (the certificate
# is not checked: the probe only asks whether the process answers).
ENV RELAY_HEALTHZ=http://127.0.0.1:9104/healthz
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, ssl, sys, urllib.request; c = ssl.create_default_context(); c.check_hostname = False; c.verify_mode = ssl.CERT_NONE; sys.exit(urllib.request.urlopen(os.environ['RELAY_HEALTHZ'], timeout=2, context=c).status != 200)"]
ENTRYPOINT ["relay"]
CMD ["run", "--config", "/etc/relay/config.toml", "--data-dir", "/var/lib/relay"]
