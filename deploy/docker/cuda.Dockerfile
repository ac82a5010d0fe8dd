# syntax=docker/dockerfile:1
# kvcast, CUDA image (the classifier runs batched in fp16 on the GPU). Build from the
# repository root:
#   docker build -f deploy/docker/cuda.Dockerfile -t kvcast/kvcast:0.2.0-cuda .
# PyPI's torch wheels carry their CUDA libraries (nvidia-* wheels, pinned by torch itself), so
# the base is the same slim Python; the host needs the NVIDIA driver and container toolkit.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/kvcast
ENV PATH=/opt/kvcast/bin:$PATH
COPY deploy/docker/requirements.txt /tmp/requirements.txt
RUN pip install --constraint /tmp/requirements.txt "$(grep '^torch==' /tmp/requirements.txt)" \
 && pip install -r /tmp/requirements.txt
# A C compiler for the replay engine (stats/native/_replay.c); only the built module reaches the image.
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml setup.py README.md /src/
COPY stats /src/stats
COPY daemon /src/daemon
COPY classifier /src/classifier
COPY exporters /src/exporters
COPY lab /src/lab
COPY cli /src/cli
COPY producer /src/producer
# The replay engine is optional in a plain install; the image must have it.
RUN pip install --no-deps "/src[classifier]" && pip check \
 && python -c "import kvcast.stats.native._replay"

FROM ${PYTHON_IMAGE}
RUN groupadd --system --gid 10001 kvcast \
 && useradd --system --uid 10001 --gid kvcast --home-dir /var/lib/kvcast --create-home kvcast
COPY --from=build /opt/kvcast /opt/kvcast
COPY deploy/docker/healthcheck.py /opt/kvcast/healthcheck.py
ENV PATH=/opt/kvcast/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1 \
    HF_HOME=/tmp/hf \
    XDG_CACHE_HOME=/tmp/cache \
    KVCAST_METRICS_ADDR=0.0.0.0:9400 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER 10001:10001
WORKDIR /var/lib/kvcast
EXPOSE 9400
HEALTHCHECK --interval=15s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "/opt/kvcast/healthcheck.py"]
ENTRYPOINT ["kvcast"]
CMD ["run"]
